# `make test` and `make demo` do all set-up on a fresh machine: a .venv, the CPU torch wheel, the project.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: setup test lint protos check-protos demo clean lab

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU wheel first, pinned: anything unpinned would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .

protos: setup
	$(PY) -m control.protogen

check-protos: setup
	$(PY) -m control.protogen --check

test: setup lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: setup
	$(PY) -m control.host.demo

lab: setup
	$(VENV)/bin/prefill-gate lab

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
