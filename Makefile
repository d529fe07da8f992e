# Two entry points a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/shigoto demo

test: $(STAMP)
	$(BIN)/ruff check runner operator tests
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/shigoto bench

clean:
	rm -rf $(VENV) .shigoto dist
