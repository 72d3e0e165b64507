# Quick start: `make demo` and `make test` do all set-up themselves.
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: install demo test bench clean

# torch comes first and pinned: on our CPU boxes `torch==2.13.0` is a local CPU wheel, and
# installing it before ember means ember's loose `torch>=2.4` never pulls a CUDA build.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"

demo: install
	$(PYTHON) -m ember train --config configs/demo.yaml

test: install
	$(PYTHON) -m pytest -q

bench: install
	$(PYTHON) bench/bench_dlrm.py

clean:
	rm -rf runs .pytest_cache build *.egg-info
