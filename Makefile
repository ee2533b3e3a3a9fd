# Two commands on a fresh machine (the README's first lines; CI runs `make test`):
#   make quickstart   set everything up, run the quickstart sweep on a local Ray, write its report
#                     (MODEL=ID_OR_PATH: on another model than ../shared's stories260K)
#   make test         set everything up, then ruff and the test suite
# Setup is a virtual environment in .venv: torch 2.13.0 first (a range that allowed a newer torch
# would pull a CUDA build of several GB), then sodaray with its test tools and extras.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= results
# MODEL=ID_OR_PATH runs the quickstart on another model (a hub id, a folder or a .gguf file), for
# a checkout without the workspace's ../shared/models/stories260K.
MODEL ?=
# pytest workers: each takes whole test files (a module's Ray instance and fixtures stay in
# one process); two halve the suite's wall on 2 cores, where most of a test is waiting on Ray.
JOBS ?= 2

.PHONY: setup quickstart test clean-results

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $@

quickstart: setup
	$(BIN)/sodaray sweep run sweeps/quickstart.yaml $(if $(MODEL),--model '$(MODEL)') --out $(OUT)
	$(BIN)/sodaray report $(OUT)/quickstart --out report

test: setup
	$(BIN)/ruff check sodaray tests benchmarks
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile

clean-results:
	rm -rf $(OUT)/quickstart report
