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

# Two test processes: most of the suite's time is end-to-end tests waiting on servers, outages and sandboxed
# children, so two overlap well even on two cores. Whole files go to one process (--dist loadfile), so a
# module's fixtures (compiled spaces, a search run once for several checks) are not built twice.
unit: $(BIN)/kf
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=30

up: $(BIN)/kf
	$(BIN)/kf up

down: $(BIN)/kf
	$(BIN)/kf down

status: $(BIN)/kf
	$(BIN)/kf status

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
