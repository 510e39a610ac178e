# `make train` and `make test` each set up .venv on first use: `make train` with what training
# needs (shoal's core dependencies), `make test` and the checkers with the development set on top.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORE := $(VENV)/.installed-core
STAMP := $(VENV)/.installed
EXTRAS ?= dev
# test processes (pytest-xdist): the tests are mostly single-threaded, and CI has two cores. A
# process that runs out of tests takes some of the other's (worksteal): the modules with slow tests
# run first (tests/conftest.py), and handed out in fixed shares they left one process minutes of
# them at the end while the other waited.
JOBS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(JOBS) --dist worksteal

.PHONY: train test test-fast lint format typecheck docs wheel-check bench setup clean

$(CORE): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e .
	touch $(CORE)

$(STAMP): $(CORE)
	$(BIN)/pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(STAMP)

setup: $(STAMP)

train: $(CORE)
	$(BIN)/shoal train CartPole-v1 $(ARGS)

# Compiled modules and pytest's rewritten test files are cached in __pycache__ even where the
# environment says not to (PYTHONDONTWRITEBYTECODE): without the cache each test process compiles
# shoal and the tests anew on every run, about 8 s of test-fast's minute.
test test-fast: export PYTHONDONTWRITEBYTECODE :=

test: $(STAMP)
	$(PYTEST) --durations=15 $(ARGS)

# unit tests only: no learning runs, no worker processes
test-fast: $(STAMP)
	$(PYTEST) -m "not slow" $(ARGS)

# the formatter's layout and the rule set in pyproject.toml ([tool.ruff]) over all Python in the tree
lint: $(STAMP)
	$(BIN)/ruff format --check src tests benchmarks examples docs .ci
	$(BIN)/ruff check src tests benchmarks examples docs .ci

format: $(STAMP)
	$(BIN)/ruff format src tests benchmarks examples docs .ci
	$(BIN)/ruff check --fix src tests benchmarks examples docs .ci

# strict on all of src/ (settings in pyproject.toml, [tool.mypy])
typecheck: $(STAMP)
	$(BIN)/mypy

# the docs site into site/; --strict turns a broken link or reference into a failure
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# build the sdist and wheel, install the wheel into a fresh venv, train from outside the tree
wheel-check: $(STAMP)
	$(BIN)/python .ci/wheel_check.py

bench: $(STAMP)
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,bench]'
	$(BIN)/python benchmarks/cartpole_vs_sb3.py $(ARGS)

clean:
	rm -rf $(VENV) runs site dist
