# Two commands for a fresh machine:
#   make demo   - create .venv if needed, run a small scaling study of the cnn workload (1 and 2 CPU ranks)
#   make test   - create .venv if needed, run the whole test suite (starts and stops a 2-node SLURM test cluster)
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test venv clean

venv:
	@bash scripts/setup-env.sh

demo: venv
	$(PY) -m trainscale bench --workload cnn --configs 1,2 --epochs 2 --out bench-out/demo-$$(date +%Y%m%d-%H%M%S)

test: venv
	$(PY) -m pytest -q -p no:cacheprovider

clean:
	rm -rf bench-out trainscale-logs
