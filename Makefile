# strictq — two set-up commands: `make run` and `make test`. Everything else is installed here.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# Python 3.12: on PATH if it really runs (pyenv shims may exist without the version), else pyenv's.
PYTHON312 := $(shell \
  if python3.12 -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then command -v python3.12; \
  else ls -d $$(pyenv root 2>/dev/null || echo $$HOME/.pyenv)/versions/3.12*/bin/python3.12 2>/dev/null | sort -V | tail -n 1; fi)
VENV := .venv
PY := $(VENV)/bin/python
# The stamp names the pyproject.toml hash: a second run with the same file installs nothing.
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-16)

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

HOST ?= 127.0.0.1
PORT ?= 8443
# The egress proxy's port (strictq serve's default: 8480); its admin port is PROXY_PORT + 10.
PROXY_PORT ?=
DATA_DIR ?= var/strictq

.PHONY: help run cluster test demo bench lint venv clean nats-server chromium

help:
	@echo "make run    set up .venv (Python 3.12) and start strictq serve (HTTPS gateway + queue core) on $(HOST):$(PORT)"
	@echo "make cluster  the distributed queue on this machine: 3 JetStream servers, 3 queue servers, a gateway"
	@echo "make test   set up .venv and run the whole test suite"
	@echo "make demo   set up .venv and run strictq demo: the whole system on this machine, narrated"
	@echo "make bench  run the benchmarks and write docs/benchmarks.md"
	@echo "make lint   ruff on everything, mypy --strict on every package, the layer contracts (lint-imports)"

$(STAMP): pyproject.toml
	@test -n "$(PYTHON312)" || { echo "Python 3.12 not found (neither python3.12 on PATH nor pyenv versions/3.12*)" >&2; exit 1; }
	@test -x $(PY) || $(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@rm -f $(VENV)/.installed-*
	@touch $@

venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/strictq serve --host $(HOST) --port $(PORT) $(if $(PROXY_PORT),--proxy-port $(PROXY_PORT) )--data-dir $(DATA_DIR)

# The cluster's replication engine (issue 15, docs/cluster.md): Debian's nats-server (JetStream), installed
# when missing (Debian puts it in /usr/sbin, which a user's PATH may lack). `make run` never needs it.
nats-server:
	@command -v nats-server >/dev/null || test -x /usr/sbin/nats-server || { \
	  echo "installing Debian's nats-server (the cluster's JetStream)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq nats-server >/dev/null; }

# The dashboard's end-to-end test (tests/test_dashboard_browser.py) drives Debian's chromium headless through
# Playwright (in the [test] extra), never a browser Playwright would download; installed when missing.
chromium:
	@command -v chromium >/dev/null || test -x /usr/lib/chromium/chromium || { \
	  echo "installing Debian's chromium (the dashboard's browser test)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium >/dev/null; }

cluster: $(STAMP) nats-server
	$(VENV)/bin/strictq cluster up --nodes 3 --host $(HOST) --port $(PORT) $(if $(PROXY_PORT),--proxy-port $(PROXY_PORT) )--data-dir $(DATA_DIR)-cluster

# Three workers on this 2-core machine (and CI's): many tests wait on child processes and sockets, and
# a third worker measured 183-206 s against 206-217 s for two. The 25 slowest tests are listed at the end.
# Bytecode is cached (under .venv, not in the tree) even where PYTHONDONTWRITEBYTECODE is set: the suite
# starts a few hundred `python -m strictq` children, and each would otherwise compile the project anew.
TEST_WORKERS ?= 3
# The tests' temporary files go to a tmpfs when one with 4 GiB free exists (13 s of the suite's ~3 min
# was fsync to disk; a SIGKILLed process loses nothing on tmpfs either, which is what the crash tests
# kill); one directory per checkout, 0700, removed after a passing run (kept to look into after a failing
# one; pytest empties it at the next). TEST_TMP= keeps pytest's default.
TEST_TMP ?= $(shell [ "$$(df --output=avail -k /dev/shm 2>/dev/null | tail -n 1)" -gt 4194304 ] 2>/dev/null \
  && echo /dev/shm/strictq-test-$$(id -u)-$$(echo $(CURDIR) | sha256sum | cut -c1-8))

test: $(STAMP) nats-server chromium
	env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(CURDIR)/$(VENV)/pycache \
	  $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25 \
	  $(if $(TEST_TMP),--basetemp $(TEST_TMP)) $(PYTEST_ARGS) $(if $(TEST_TMP),&& rm -rf $(TEST_TMP))

demo: $(STAMP) nats-server
	$(VENV)/bin/strictq demo $(DEMO_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

bench: $(STAMP) nats-server
	@command -v redis-server >/dev/null || { echo "installing Debian's redis-server (the benchmark's peer)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server >/dev/null; }
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'
	$(PY) -m bench.run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
