# Two commands for a fresh machine: `make demo` (the main job on the embedded default) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck unit up down status clean

$(BIN)/kf: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(BIN)/kf

demo: $(BIN)/kf
	$(BIN)/kf demo

test: lint typecheck unit

lint: $(BIN)/kf
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BIN)/kf
	$(BIN)/mypy

unit: $(BIN)/kf
	$(BIN)/pytest -q --durations=30

up: $(BIN)/kf
	$(BIN)/kf up

down: $(BIN)/kf
	$(BIN)/kf down

status: $(BIN)/kf
	$(BIN)/kf status

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
