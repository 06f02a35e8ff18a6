# Two commands, each doing its own set-up on a fresh machine:
#   make test   pytest over tests/ and nbval over every notebook
#   make book   the HTML book in _build/html, every notebook executed (cached), warnings are errors
VENV    ?= .venv
PY      := $(VENV)/bin/python
# A CPU torch pin first, so that requirements.txt's loose `torch>=` never pulls CUDA wheels.
TORCH_PIN ?= torch==2.13.0 triton==3.6.0
STAMP   := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))

.PHONY: setup test test-py test-nb book clean

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests $(NOTEBOOKS) --nbval-lax --nbval-current-env -p no:cacheprovider

test-py: $(STAMP)
	$(PY) -m pytest -q tests

test-nb: $(STAMP)
	$(PY) -m pytest -q $(NOTEBOOKS) --nbval-lax --nbval-current-env -p no:cacheprovider

book: $(STAMP)
	$(VENV)/bin/jupyter-book build . --warningiserror --keep-going

clean:
	rm -rf _build
