# Everything goes through .venv, created on first use. Override the torch pin with
#   make test TORCH=torch==2.5.1
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-all test-fast soak gpu-check lint typecheck bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	echo "$(TORCH)" > $(VENV)/torch-constraint.txt
	@# one resolver run for torch and the rest (two runs looked every shared dependency up twice)
	$(PY) -m pip install -q -c $(VENV)/torch-constraint.txt "$(TORCH)" -e ".[test]"
	@# replay report's browser tests drive the system's chromium (never a downloaded one); as
	@# root with apt-get it is installed, elsewhere (or on failure) those tests skip with a reason
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get update -qq && apt-get install -y -qq chromium) || echo "chromium not installed: the browser tests will skip"; fi
	touch $(STAMP)

demo: setup
	$(PY) examples/demo.py

# Two pytest workers, a test file each at a time: most tests wait on a child process (a training
# script, a `replay` command), so one worker leaves a core idle. More workers oversubscribe a
# small machine (every child's torch starts a thread per core); `make test JOBS=0` runs serially.
JOBS ?= 2
XDIST = $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadfile)

# Every claim once, in about 9 minutes on 2 cores from a fresh clone (stop 58: 458 s of pytest,
# 499 s in all; stop 57: 504 s and 553 s; a machine a third slower took 554-635 s and 610-698 s):
# the default tier (tests/tiers.py says what the matrix repeats), no coverage, mypy --strict
# beside pytest rather than before it, niced. The suite is bound by CPU (a third worker
# gains 4%: benchmarks/RESULTS.md), so only running less makes it faster.
test: setup
	@log=$$(mktemp); nice -n 15 $(VENV)/bin/mypy > $$log 2>&1 & mypy=$$!; \
	$(PY) -m pytest -q $(XDIST) -m "not matrix"; rc=$$?; \
	wait $$mypy || rc=1; echo "mypy: $$(tail -n 1 $$log)"; \
	if [ $$rc -ne 0 ]; then cat $$log; fi; rm -f $$log; exit $$rc

# Coverage of replay/ and tui/ (package replay_tui), child processes included; the floor is
# what the suite measured when it was set (92% on 2026-12-03), less a little slack.
COV_FLOOR ?= 90

# Everything: the default tier and the matrix (every rank count, precision, framework spelling,
# TUI corpus view), with coverage measured in every child process too. CI runs it after make test.
test-all: setup typecheck
	$(PY) -m pytest -q $(XDIST) --cov --cov-report=term --cov-fail-under=$(COV_FLOOR)

test-fast: setup
	$(PY) -m pytest -q $(XDIST) -m "not slow and not matrix"

# The crash-safety figures of benchmarks/RESULTS.md: the kill loops with 200 kills each (the
# suite kills 16 times).
soak: setup
	REPLAY_KILLS=200 $(PY) -m pytest -q tests/integration/test_crash_safety.py \
		tests/integration/test_returned_steps.py -k "kill"

# On a machine with a CUDA device, in at most 10 minutes: re-entry with a CPU batch moved inside
# the step, bf16 autocast, cuDNN, attention, torch.compile, a NaN bisected on the GPU, the
# self-check, sync debug mode around rec.step, DDP over NCCL on two GPUs, a sparse batch on the
# GPU, a fused AdamW under fp16 and a GradScaler, a complex (cuFFT) layer's overflow. Each check's result and time in gpu-check-report.md (and .json, and the failed commands'
# output in .log); exit 1 if one failed, 3 where there is no CUDA.
# `$(PY) tests/gpu/gpu_check.py --device cpu` runs the same checks on the CPU.
# GPU_PY=python3: a Python that already holds torch with CUDA, h5py, numpy and click (a GPU
# machine's own image, often with no network): used as it is, nothing installed, no .venv.
# GPU_REPORT: where the report goes (its .json and .log beside it).
GPU_PY ?=
GPU_REPORT ?= gpu-check-report.md
gpu-check: $(if $(GPU_PY),,setup)
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" PYTHONUNBUFFERED=1 \
		$(or $(GPU_PY),$(PY)) tests/gpu/gpu_check.py --report "$(GPU_REPORT)"

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
