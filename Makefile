# Two commands: `make train` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install train test test-fast bench clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	$(PY) train.py configs/reverse.toml

# The whole suite, `slow` tests included (CI runs exactly this).
test: $(STAMP)
	$(PY) -m pytest -n 2 -q

# Everything but the tests marked slow.
test-fast: $(STAMP)
	$(PY) -m pytest -n 2 -q -m "not slow"

bench: $(STAMP)
	$(PY) bench/attention.py
	$(PY) bench/train.py

clean:
	rm -rf $(VENV) runs .pytest_cache
