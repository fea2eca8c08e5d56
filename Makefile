# Every target sets up .venv from the pinned constraints first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test lint demo clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check controller tests
	$(BIN)/ruff format --check controller tests
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -q

demo: $(STAMP)
	$(BIN)/poolkeeper demo

clean:
	rm -rf $(VENV) .cache .mypy_cache .pytest_cache .ruff_cache
