# The commands, each doing its own set-up on a fresh machine:
#   make check      what CI runs (.ci/run): make test, then make pagecheck
#   make test       pytest over tests/ and nbval over every notebook
#   make book       the HTML book in _build/html, every notebook executed (cached), warnings are errors
#   make pagecheck  the built book in headless Chromium at 1280 px and 390 px (tools/page_check.py):
#                   fails on anything wider than the text column, MathJax errors, widgets shown twice,
#                   uncaptioned or misnumbered figures, raw TeX, progress bars, outputs over 30 lines
#                   and empty sentences
#   make pageshots  the same check, keeping a full-page screenshot of every page (for a reviewer's eye)
#   make colab      rewrite the Colab edition (colab/*.ipynb) from notebooks/ (tools/colab_edition.py)
VENV    ?= .venv
PY      := $(VENV)/bin/python
# A CPU torch pin first, so that requirements.txt's loose `torch>=` never pulls CUDA wheels.
TORCH_PIN ?= torch==2.13.0 triton==3.6.0
STAMP   := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))
# Debian's Chromium drives the page check (Playwright is told where it is; it downloads no browser).
CHROMIUM ?= /usr/bin/chromium
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# tests/book/test_colab_edition.py: KaTeX and MathJax from npm (Node.js, Debian's when missing), and
# Colab's ipywidgets for the chapter it runs from the wheel; both git-ignored, both set up here.
MATHCHECK := tools/mathcheck
MATH_STAMP := $(MATHCHECK)/node_modules/.installed
WIDGETS := .colab-widgets
WIDGETS_STAMP := $(WIDGETS)/.installed

.PHONY: setup browser check test test-py test-nb book pagecheck pageshots colab clean

setup: $(STAMP) $(MATH_STAMP) $(WIDGETS_STAMP)

$(STAMP): requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

$(MATH_STAMP): $(MATHCHECK)/package.json $(MATHCHECK)/package-lock.json
	command -v npm >/dev/null || { $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm; }
	cd $(MATHCHECK) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(WIDGETS_STAMP): $(STAMP)
	rm -rf $(WIDGETS)
	$(PY) -m pip install -q --no-deps --no-compile --target $(WIDGETS) ipywidgets==7.7.1 ipython_genutils==0.2.0
	touch $@

browser: $(CHROMIUM)

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

check: test pagecheck

# Tests and notebooks on every core (pytest-xdist): a test file, or a notebook's cells, stay in one worker.
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
XDIST   := -n $(JOBS) --dist loadfile

test: setup $(CHROMIUM)
	$(PY) -m pytest -q $(XDIST) tests $(NOTEBOOKS) --nbval-lax --nbval-current-env -p no:cacheprovider

test-py: setup $(CHROMIUM)
	$(PY) -m pytest -q $(XDIST) tests

test-nb: $(STAMP)
	$(PY) -m pytest -q $(XDIST) $(NOTEBOOKS) --nbval-lax --nbval-current-env -p no:cacheprovider

# The notebooks are executed into the build's cache first, one process per core
# (tools/execute_book.py); the build then finds every one of them executed.
book: $(STAMP)
	$(PY) tools/execute_book.py
	$(VENV)/bin/jupyter-book build . --warningiserror --keep-going

# The check reads the rendered page, not pictures of it: screenshots are for a reviewer (pageshots),
# and a full-page capture of a long page can outlast the browser's timeout on a slow machine.
pagecheck: book $(CHROMIUM)
	$(PY) tools/page_check.py --chromium $(CHROMIUM) --no-screenshots
	$(PY) tools/colab_edition.py --check-built _build/html

pageshots: book $(CHROMIUM)
	$(PY) tools/page_check.py --chromium $(CHROMIUM)

colab: $(STAMP)
	$(PY) tools/colab_edition.py

clean:
	rm -rf _build
