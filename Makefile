# `make test` and `make demo` do all set-up on a fresh machine: a .venv, the CPU torch wheel, the project.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: setup tools test lint protos check-protos demo clean lab lab-quick

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU wheel first, pinned: anything unpinned would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# promtool (Debian's `prometheus`) checks the metrics scrape and unit-tests the alert rules. Installed when
# missing and apt-get can (root); otherwise, or when apt fails, those tests skip and say why.
tools:
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing promtool (apt-get install prometheus)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus) \
	      >/dev/null 2>&1 || echo "promtool could not be installed: its tests will be skipped"; \
	  else echo "promtool not found (Debian package prometheus): its tests will be skipped"; fi; }

lint: setup
	$(VENV)/bin/ruff check .

protos: setup
	$(PY) -m control.protogen

check-protos: setup
	$(PY) -m control.protogen --check

test: setup lint tools
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: setup
	$(PY) -m control.host.demo

# The capacity lab on every scenario and the shared production traces (those present next to the checkout).
TRACES ?= $(wildcard ../shared/traces/azure-llm-2023-conv.csv ../shared/traces/mooncake-fast25-conversation.jsonl)
LAB_JOBS ?= 2

lab: setup
	$(VENV)/bin/prefill-gate lab capacity --jobs $(LAB_JOBS) $(if $(TRACES),--trace $(TRACES))

lab-quick: setup
	$(VENV)/bin/prefill-gate lab capacity --quick --jobs $(LAB_JOBS) $(if $(TRACES),--trace $(TRACES))

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
