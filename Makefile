# One driver for humans and CI. `make demo` runs the main job, `make check` runs every check.
# Both create .venv on first use: `make demo` installs pipeflow and what it needs (torch,
# numpy, toolz, tqdm, pillow); `make check` adds the dev, docs, compat, plot, stream and ray
# extras.
# Choose another torch build with, e.g.:
#   make check TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
SERVE_ADDR ?= 127.0.0.1:8000
BIN := $(VENV)/bin
# What is installed, one stamp per level: the package, then everything for the checks.
BASE := $(VENV)/.installed-base
FULL := $(VENV)/.installed-full
# mkdocs-material prints an end-of-life notice (May 2027) on every run; this turns it off.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs

.PHONY: demo check lint types test docs docs-offline serve bench clean

demo: $(BASE)
	$(BIN)/python -m pipeflow demo

check: lint types test docs

# Editable, so the checkout's code is what runs. pyproject's `package-dir = {"" = "."}` makes
# setuptools put the checkout on sys.path with a .pth file (its flat-layout default is an
# import hook, which prints a warning box on every install).
# pip says what it downloads and installs as it goes (Collecting, Downloading, Installing), so
# the first run is never silent for minutes.
PIP := $(BIN)/python -m pip install --disable-pip-version-check --progress-bar on
STEP := @printf '\n==> %s\n'

$(BASE): pyproject.toml
	$(STEP) "make: creating $(VENV) (first run only; then installing pip, torch and pipeflow)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) --quiet --upgrade pip
	$(STEP) "make: installing $(TORCH_SPEC): a 190 MB download for the CPU build, about 750 MB installed"
	$(PIP) $(TORCH_SPEC)
	$(STEP) "make: installing pipeflow (editable) with numpy, tqdm and pillow"
	$(PIP) -e .
	touch $@
	$(STEP) "make: $(VENV) is ready"

$(FULL): $(BASE)
	$(STEP) "make: installing the checks' tools: pytest, hypothesis, ruff, mypy, mkdocs, lightning, accelerate, torchdata, matplotlib, fsspec, pyarrow, ray"
	$(PIP) -e ".[dev,docs,compat,plot,stream,ray]"
	touch $@

lint: $(FULL)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

types: $(FULL)
	$(BIN)/mypy

test: $(FULL)
	$(BIN)/python -m pytest

docs: $(FULL)
	$(MKDOCS) build --strict --site-dir site

# A copy of the site to open as files (site-offline/index.html): links work from file://.
docs-offline: $(FULL)
	OFFLINE=true $(MKDOCS) build --strict --site-dir site-offline

# The site with working links and search, at http://$(SERVE_ADDR); rebuilt on every save.
serve: $(FULL)
	$(MKDOCS) serve --dev-addr $(SERVE_ADDR)

bench: $(BASE)
	$(BIN)/python -m pipeflow bench

clean:
	rm -rf $(VENV) site site-offline .pytest_cache .mypy_cache .ruff_cache .hypothesis
