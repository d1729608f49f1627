# Set-up and everyday commands.  Every target installs what it needs first, so on a fresh
# machine `make demo` and `make test` are all there is to type.
#
#   make demo    judge a sample crawl (deploy/sample/) and print a summary (KEEP=1: leave it running)
#   make test    lint, type check, then the whole test suite (what CI runs)
#   make unit    the tests that need no broker and no Prometheus (under a minute)
#   make lint    ruff (lint + format check) and mypy on the package
#   make bench   the speed goals (bench/goals.py; by hand, ~5 min; QUICK=1 for ~2 min; see bench/README.md)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMPS := .stamps

.PHONY: test unit lint demo install bench clean

install: $(STAMPS)/python $(STAMPS)/debian $(STAMPS)/kafka

# (after the Debian packages: gcc builds the C text walk and word hashes at `pip install`)
$(STAMPS)/python: pyproject.toml setup.py $(wildcard streamdedup/fingerprinting/*.c streamdedup/engine/*.c) $(STAMPS)/debian
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "streamdedup needs Python >= 3.11; set PYTHON=python3.11")'
	@mkdir -p $(STAMPS)
	@echo "== installing streamdedup and its test dependencies into $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m streamdedup.fingerprinting.warmup  # compile the numba kernels into their on-disk cache once
	$(PY) -m streamdedup.index.warmup  # and the shard index's
	$(PY) -m streamdedup.pipeline.wire_kernels  # and the changelog replay's regrouping kernel
	@touch $@

# kcat (a Kafka client we did not write), prometheus and gcc, from Debian
$(STAMPS)/debian: deploy/local/install-debian-packages.sh
	@mkdir -p $(STAMPS)
	bash deploy/local/install-debian-packages.sh
	@touch $@

# Apache Kafka's jars from Maven Central, for the local broker (deploy/local/kafka.sh)
$(STAMPS)/kafka: deploy/local/pom.xml
	@mkdir -p $(STAMPS)
	deploy/local/kafka.sh install
	@touch $@

lint: $(STAMPS)/python
	$(PY) -m ruff check streamdedup tests bench deploy
	$(PY) -m ruff format --check streamdedup tests bench deploy
	$(PY) -m mypy

unit: $(STAMPS)/python
	$(PY) -m pytest -m 'not kafka' --ignore=tests/integration

test: install lint
	$(PY) -m pytest

# KEEP=1 leaves the broker and the worker running afterwards (demo.py --keep)
demo: install
	$(PY) deploy/sample/demo.py $(if $(KEEP),--keep)

# The speed goals of issue 10 in one go (bench/goals.py: ~5 min on 2 cores, plus ~3.5 min to build the
# corpus the first time; QUICK=1: ~2 min; BENCH_ARGS="--skip-stream" for the one-core figures only).
# Not part of `make test`.
bench: install $(STAMPS)/bench bench/data/corpus.jsonl
	$(PY) bench/goals.py $(if $(QUICK),--quick) $(BENCH_ARGS)

$(STAMPS)/bench: pyproject.toml
	@mkdir -p $(STAMPS)
	$(PY) -m pip install --quiet -e '.[bench]'
	@touch $@

# the benchmark corpus (real documentation pages; ~3.5 min the first time, see bench/README.md)
bench/data/corpus.jsonl: bench/corpus.py | $(STAMPS)/bench
	$(PY) bench/corpus.py

clean:
	rm -rf $(VENV) $(STAMPS) bench/out demo-verdicts.jsonl
