# `make run` and `make test` work on a fresh machine: they create .venv, install, then act.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SPEC   ?= spaces/cnn.yaml
PYTEST_ARGS ?=
# Two pytest-xdist workers, whole files each, slowest first (tests/conftest.py): the CPUs sit a
# third idle in a serial run, on trials that wait. TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2

.PHONY: run test test-fast docs lint install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[torch,tf,lightning,hf,mlflow,dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m search run $(SPEC)

test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The quick loop: unit tests and doctests, no Ray, no PyTorch or TensorFlow, nothing over 5 s a
# file (tests/conftest.py marks a test that uses the session's Ray as `ray`).
# A file whose module-level `pytestmark` carries one of those marks has no test left: it is not
# even imported (TensorFlow's import alone would cost more than most of the loop).
FAST := not slow and not ray and not torch and not tf
FAST_SKIP := $(shell grep -lE '^pytestmark = .*pytest\.mark\.(slow|ray|torch|tf)\b' tests/test_*.py)
test-fast: $(STAMP)
	$(PY) -m pytest -n 0 -m "$(FAST)" $(addprefix --ignore=,$(FAST_SKIP)) $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml) into site/; --strict fails on a broken link, a
# missing anchor or an API reference that does not resolve. `make test` builds it too
# (tests/test_docs.py), with every block a user copies.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

lint: $(STAMP)
	$(VENV)/bin/ruff check search trainables tests benchmarks scripts examples
	$(VENV)/bin/ruff format --check search trainables tests benchmarks scripts examples
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) site results/optuna.db results/*/
