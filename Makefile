# Two commands for a fresh machine:
#   make demo   - create .venv with what the demo needs (torch, trainscale, matplotlib), run a small scaling study
#                 of the cnn workload (1 and 2 CPU ranks)
#   make test   - create .venv with everything the tests use (DeepSpeed, transformers, trackers, pytest, ...), run
#                 the whole test suite (starts and stops a 2-node SLURM test cluster)
#   make test-scale - trainscale at 16 SLURM nodes (a 16-node test cluster on this machine) and 64 local
#                   ranks: tests/scale, left out of `make test` (minutes, most of the memory; docs/scaling.md)
#   make test-gpu - the GPU suite (tests/gpu) on this machine's GPUs, with .venv's python where there is one, else
#                   the system's python3 and its CUDA/ROCm torch (PYTHONPATH=src: nothing built or installed). It
#                   fails with one line when no GPU is visible or no test passed. The whole check of a bare GPU
#                   machine (the suite, selftest, the seed CNN's time, every strategy) is scripts/gpu-check.sh OUTDIR.
VENV ?= .venv
PY := $(VENV)/bin/python
# Test files spread over this many pytest processes (pytest-xdist), longest first (tests/conftest.py): the
# tests wait on the SLURM scheduler and on subprocesses, so three processes on 2 cores finish sooner than two
# (pytest 22-23 min vs 25, fresh clones). The two tests that once failed under that load (a restart's cause,
# a requeued job's log) were races in trainscale, fixed.
TEST_WORKERS ?= 3

.PHONY: demo test lint test-scale test-gpu venv venv-demo clean

# compileall: every rank and launcher is a new interpreter importing trainscale; where PYTHONDONTWRITEBYTECODE
# is set, none would write its bytecode, and each would compile the same sources again (~0.2 CPU-s each).
venv:
	@EXTRAS=test bash scripts/setup-env.sh
	@$(PY) -m compileall -q src tests > /dev/null

venv-demo:
	@EXTRAS=bench bash scripts/setup-env.sh
	@$(PY) -m compileall -q src > /dev/null

# the last line names what a new shell needs first: `trainscale` is on the PATH only with the venv active
demo: venv-demo
	$(PY) -m trainscale bench --workload cnn --configs 1,2 --epochs 2 --out bench-out/demo-$$(date +%Y%m%d-%H%M%S)
	@echo "next: source $(VENV)/bin/activate && trainscale report bench-out/latest   (the study's page)"

# ruff's lint and format check (rules in pyproject.toml, docs/development.md): seconds, so every `make test` runs it first.
lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: venv lint
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-scale: venv
	$(PY) -m pytest tests/scale -m scale -v -s -p no:cacheprovider --timeout 3600

# -o timeout: a selftest on 8 GPUs outlasts pyproject's 300 s per test; an image without pytest-timeout warns only.
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
test-gpu:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) -m pytest tests/gpu -v -rs -p no:cacheprovider -o timeout=1800

clean:
	rm -rf bench-out trainscale-runs
