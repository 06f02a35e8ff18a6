# The commands, each doing its own set-up on a fresh machine:
#   make check      what CI runs (.ci/run): make test, then make pagecheck
#   make test       pytest over tests/ and nbval over every notebook
#   make book       the HTML book in _build/html, every notebook executed (cached), warnings are errors
#   make pagecheck  the built book in headless Chromium at 1280 px and 390 px (tools/page_check.py):
#                   fails on anything wider than the text column, MathJax errors, widgets shown twice
#   make pageshots  the same check, keeping a full-page screenshot of every page (for a reviewer's eye)
VENV    ?= .venv
PY      := $(VENV)/bin/python
# A CPU torch pin first, so that requirements.txt's loose `torch>=` never pulls CUDA wheels.
TORCH_PIN ?= torch==2.13.0 triton==3.6.0
STAMP   := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))
# Debian's Chromium drives the page check (Playwright is told where it is; it downloads no browser).
CHROMIUM ?= /usr/bin/chromium
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup browser check test test-py test-nb book pagecheck pageshots clean

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

browser: $(CHROMIUM)

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

check: test pagecheck

test: $(STAMP) $(CHROMIUM)
	$(PY) -m pytest -q tests $(NOTEBOOKS) --nbval-lax --nbval-current-env -p no:cacheprovider

test-py: $(STAMP) $(CHROMIUM)
	$(PY) -m pytest -q tests

test-nb: $(STAMP)
	$(PY) -m pytest -q $(NOTEBOOKS) --nbval-lax --nbval-current-env -p no:cacheprovider

book: $(STAMP)
	$(VENV)/bin/jupyter-book build . --warningiserror --keep-going

# The check reads the rendered page, not pictures of it: screenshots are for a reviewer (pageshots),
# and a full-page capture of a long page can outlast the browser's timeout on a slow machine.
pagecheck: book $(CHROMIUM)
	$(PY) tools/page_check.py --chromium $(CHROMIUM) --no-screenshots

pageshots: book $(CHROMIUM)
	$(PY) tools/page_check.py --chromium $(CHROMIUM)

clean:
	rm -rf _build
