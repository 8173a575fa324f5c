# Everything goes through .venv, created on first use. Override the torch pin with
#   make test TORCH=torch==2.5.1
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast gpu-check lint typecheck bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	echo "$(TORCH)" > $(VENV)/torch-constraint.txt
	$(PY) -m pip install -q -c $(VENV)/torch-constraint.txt -e ".[test]"
	touch $(STAMP)

demo: setup
	$(PY) examples/demo.py

# Coverage of replay/ and tui/ (package replay_tui), child processes included; the floor is
# what the suite measured when it was set (92% on 2026-12-03), less a little slack.
COV_FLOOR ?= 90
# Two pytest workers, a test file each at a time: most tests wait on a child process (a training
# script, a `replay` command), so one worker leaves a core idle. More workers oversubscribe a
# small machine (every child's torch starts a thread per core); `make test JOBS=0` runs serially.
JOBS ?= 2
XDIST = $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadfile)

test: setup typecheck
	$(PY) -m pytest -q $(XDIST) --cov --cov-report=term --cov-fail-under=$(COV_FLOOR)

test-fast: setup
	$(PY) -m pytest -q $(XDIST) -m "not slow"

# On a machine with a CUDA device: the GPU-marked tests (a CUDA run recorded, verified bitwise
# on the GPU, a CUDA failure bisected and reproduced). Everywhere else they are skipped.
gpu-check: setup
	$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu-check: no CUDA device here')"
	$(PY) -m pytest -q -rs -m gpu tests

lint: setup typecheck
	$(VENV)/bin/ruff check replay tui tests examples benchmarks
	$(VENV)/bin/ruff format --check replay tui tests examples benchmarks

# mypy --strict over the packages [tool.mypy] lists in pyproject.toml (seconds).
typecheck: setup
	$(VENV)/bin/mypy

bench: setup
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) runs .pytest_cache .coverage .coverage.* htmlcov
