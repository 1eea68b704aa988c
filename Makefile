# One driver for humans and CI. `make demo` runs the main job, `make check` runs every check.
# Both create .venv on first use: `make demo` installs pipeflow and what it needs (torch,
# numpy, toolz, tqdm, pillow); `make check` adds the dev, docs, compat, plot, stream and ray
# extras. The docs targets on their own (`make serve`, `make docs`, `make docs-offline`)
# install only the docs extra: no torch, no pipeflow.
# Choose another torch build with, e.g.:
#   make check TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
SERVE_ADDR ?= 127.0.0.1:8000
BIN := $(VENV)/bin
# What is installed, one stamp per level: the package, then everything for the checks; and,
# beside them, the docs tools alone (which the everything level includes).
BASE := $(VENV)/.installed-base
FULL := $(VENV)/.installed-full
DOCS := $(VENV)/.installed-docs
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

# The docs extra includes the docs tools, so this stamps DOCS too: `make check` builds the docs
# with what it installed here and installs nothing more for them.
$(FULL): $(BASE)
	$(STEP) "make: installing the checks' tools: pytest, hypothesis, ruff, mypy, mkdocs, lightning, accelerate, torchdata, matplotlib, fsspec, pyarrow, ray"
	$(PIP) -e ".[dev,docs,compat,plot,stream,ray]"
	touch $(DOCS) $@

# The docs extra's requirements, one a line, read from pyproject.toml (tomllib is Python 3.11
# and newer; pip carries tomli for 3.10).
DOCS_EXTRA := import sys; toml = __import__("tomllib" if sys.version_info >= (3, 11) else "pip._vendor.tomli", fromlist=["load"]); print(*toml.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"], sep="\n")

# `make -j` builds prerequisites side by side, and two pip runs must not write one venv at
# once. So when this run also installs the checks' tools (which include the docs tools), the
# docs targets wait for those; and when it installs pipeflow, the docs tools wait for that.
DOCS_PREREQ := $(if $(filter check lint types test,$(MAKECMDGOALS)),$(FULL),$(DOCS))
AFTER_BASE := $(if $(filter demo bench,$(MAKECMDGOALS)),$(BASE))

# What the docs targets need, and only that: the docs extra without pipeflow (mkdocstrings
# reads pipeflow's source files; it imports neither pipeflow nor torch).
$(DOCS): pyproject.toml | $(AFTER_BASE)
	$(STEP) "make: installing the docs tools (mkdocs, mkdocs-material, mkdocstrings, ruff) in $(VENV), creating it if needed"
	$(PYTHON) -m venv $(VENV)
	$(PIP) --quiet --upgrade pip
	$(BIN)/python -c '$(DOCS_EXTRA)' > $(VENV)/docs-requirements.txt
	$(PIP) -r $(VENV)/docs-requirements.txt
	touch $@
	$(STEP) "make: $(VENV) has the docs tools"

lint: $(FULL)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

types: $(FULL)
	$(BIN)/mypy

test: $(FULL)
	$(BIN)/python -m pytest

docs: $(DOCS_PREREQ)
	$(MKDOCS) build --strict --site-dir site

# A copy of the site to open as files (site-offline/index.html): links work from file://.
docs-offline: $(DOCS_PREREQ)
	OFFLINE=true $(MKDOCS) build --strict --site-dir site-offline

# The site with working links and search, at http://$(SERVE_ADDR); rebuilt on every save.
serve: $(DOCS_PREREQ)
	$(MKDOCS) serve --dev-addr $(SERVE_ADDR)

bench: $(BASE)
	$(BIN)/python -m pipeflow bench

clean:
	rm -rf $(VENV) site site-offline .pytest_cache .mypy_cache .ruff_cache .hypothesis
