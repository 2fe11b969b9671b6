# Two commands: `make train` and `make test`. Both create .venv on first use.
#
# Two stacks are tested. The newest that tfmjax supports, Python 3.12 with jax 0.11 (what GPU
# images run), is .venv: `make train`, and the fast tests. The oldest, Python 3.11 with jax
# 0.10 and flax 0.12.8 (the bottom of pyproject.toml's ranges), is .venv-oldest: the tests
# marked slow. `make test` (CI) runs both halves, so every test runs once, on one stack:
# the whole suite twice did not fit CI's 90 minutes (README "Tests"). `make test-newest` and
# `make test-oldest` run the whole suite on one stack. tools/find_python.sh finds each
# interpreter (pyenv's versions, then PATH); without Python 3.12 .venv uses python3, and
# without a second version the slow tests run in .venv too.
# `make test PYTHON=/path/to/python` picks another newest interpreter.
NEWEST := 3.12
OLDEST := 3.11
ifndef PYTHON
PYTHON := $(or $(shell tools/find_python.sh $(NEWEST)),python3)
endif
OLDEST_PYTHON ?= $(shell tools/find_python.sh $(OLDEST))
PY_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(PY_VERSION)
OLDEST_VENV := .venv-oldest
OLDEST_STAMP := $(OLDEST_VENV)/.installed-$(OLDEST)
OLDEST_PINS := 'jax>=0.10,<0.11' 'flax==0.12.8'
# Two workers; a worker that crashes ends the run (xdist's default replaces it, and with
# --dist loadgroup the run then hung until CI's limit: tests/test_fail_fast.py). A test that
# hangs is stopped by pytest-timeout (pyproject.toml), which ends its worker the same way.
XDIST := -n 2 --dist loadgroup --max-worker-restart=0

.PHONY: install lint format train test test-fast test-slow test-oldest test-newest oldest-pytest newest-only-slow mutate bench clean

$(STAMP): pyproject.toml
	tools/make_venv.sh $(PYTHON) $(VENV) $(STAMP)

$(OLDEST_STAMP): pyproject.toml
	tools/make_venv.sh $(OLDEST_PYTHON) $(OLDEST_VENV) $(OLDEST_STAMP) $(OLDEST_PINS)

install: $(STAMP)

train: $(STAMP)
	$(PY) train.py configs/reverse.toml

# Lint first (ruff: pyflakes, pycodestyle, import order, bugbear; and the formatter's check).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Apply the formatter and the safe lint fixes.
format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The lint, the fast tests on the newest stack, then the slow tests on the oldest (CI).
test: test-fast test-slow

# Everything but the tests marked slow, after the lint. XLA:CPU's most optimizations are off
# (jax's switch; LLVM's expensive passes too) except for the tests of tests/kernels and
# tests/layers, which compare with their references what users compile (tests/conftest.py
# turns them back on there): the other tests' small programs compile in more time than they
# then lose running (540 of them: 3 min 29 s against 4 min 42 s).
test-fast: export JAX_DISABLE_MOST_OPTIMIZATIONS ?= 1
test-fast: lint
	$(PY) -m pytest $(XDIST) -q -m "not slow"

# The tests marked slow, on the oldest stack (in .venv when there is none), with most
# optimizations off for every test, the kernels' too (so both levels are tested): the half
# takes ~25-35% less time (tests/train/test_step.py 100 s -> 66 s), which brought make test
# within CI's 90 minutes. `JAX_DISABLE_MOST_OPTIMIZATIONS=0 make test` compiles every test
# of both halves as users compile.
test-slow: export JAX_DISABLE_MOST_OPTIMIZATIONS ?= 1
test-slow:
	$(MAKE) --no-print-directory oldest-pytest PYTEST_ARGS='-m slow --durations=25'
	$(MAKE) --no-print-directory newest-only-slow

# The slow tests of the modules that need the newest stack (they skip on the oldest: jax 0.10
# has no Mosaic GPU interpreter) run in .venv, unless the oldest-stack run was .venv already;
# in one process, as xdist would keep their group (xdist_group) on one worker anyway.
NEWEST_ONLY := tests/kernels/test_mosaic_gpu.py
newest-only-slow: $(STAMP)
ifneq ($(and $(OLDEST_PYTHON),$(filter-out $(OLDEST),$(PY_VERSION))),)
	$(PY) -m pytest -p no:xdist -q -m slow $(NEWEST_ONLY)
endif

# The whole suite on the oldest stack, and on the newest (neither is in CI).
test-oldest:
	$(MAKE) --no-print-directory oldest-pytest PYTEST_ARGS='--durations=25'

test-newest: lint
	$(PY) -m pytest $(XDIST) -q --durations=25

oldest-pytest:
ifeq ($(OLDEST_PYTHON),)
	@echo "no Python $(OLDEST) found (pyenv's versions or PATH): these tests run in $(VENV)"
	$(MAKE) --no-print-directory $(STAMP)
	$(PY) -m pytest $(XDIST) -q $(PYTEST_ARGS)
else ifeq ($(PY_VERSION),$(OLDEST))
	@echo "$(VENV) is Python $(OLDEST) already (no Python $(NEWEST) found): these tests run there"
	$(MAKE) --no-print-directory $(STAMP)
	$(PY) -m pytest $(XDIST) -q $(PYTEST_ARGS)
else
	$(MAKE) --no-print-directory $(OLDEST_STAMP)
	$(OLDEST_VENV)/bin/python -m pytest $(XDIST) -q $(PYTEST_ARGS)
endif

# Mutation testing of the math modules (about 45 minutes on 2 cores; not in CI).
# Sessions are kept in .mutation/, so a second run only does what is missing.
mutate: $(STAMP)
	$(PY) -m pip install -q -e '.[mutate]'
	$(PY) tools/mutate.py --jobs 2

bench: $(STAMP)
	$(PY) bench/attention.py
	$(PY) bench/train.py

clean:
	rm -rf $(VENV) $(OLDEST_VENV) runs .pytest_cache .mutation
