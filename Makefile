# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv when missing and install the pinned torch first, so that no
# unpinned requirement can pull a multi-GB CUDA build during set-up.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.hetpp-installed

.PHONY: setup demo test lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[train,data,dev]"
	@touch $(STAMP)

demo: setup
	$(VENV)/bin/hetpp demo

test: setup lint
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
