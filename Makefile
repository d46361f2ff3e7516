# The commands of the README: `make demo` (set up + main job, about 12 min on a quiet 2-core machine), `make demo-quick`
# (set up + the quick tour, about 4 min) and `make test` (set up + tests);
# `make docs` builds the API reference site offline (docs/_build/html), warnings as errors.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo demo-quick demo-long test lint docs bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# Pin the CPU wheel first so no multi-GB CUDA build of torch is pulled in.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[all,dev,docs]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/attnkit list
	$(BIN)/attnkit tour --out tour-report

demo-quick: $(STAMP)
	$(BIN)/attnkit list
	$(BIN)/attnkit tour --quick --out tour-report

demo-long: $(STAMP)
	$(BIN)/attnkit tour --suite long --out docs/tour-long --readme docs/guide/tour.md

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples docs/site
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest

docs: $(STAMP)
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs/site docs/_build/html
	@echo "built: docs/_build/html/index.html"

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis docs/_build docs/site/generated
