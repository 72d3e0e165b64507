# Quick start: `make demo` and `make test` do all set-up themselves.
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: install demo test docs bench clean

# torch comes first and pinned: on our CPU boxes `torch==2.13.0` is a local CPU wheel, and
# installing it before ember means ember's loose `torch>=2.4` never pulls a CUDA build.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev,serve]"

demo: install
	$(PYTHON) -m ember train --config configs/demo.yaml --overwrite

# Two test processes at a time (pytest-xdist, each file in one of them) for all but the `serial`
# tests (several ranks each: they run after, alone but for the next run; ~3.8 + 2.8 min here
# instead of 9.4 in one process). The native core off (EMBER_NATIVE=0): the numpy/torch fallbacks
# of every kernel (ember/_native/) must pass the same embedding, tier, optimizer, checkpoint,
# featurize and native tests; that run takes, at nice 19, only the CPU the serial tests leave
# idle (their ranks keep their timing), and its output follows theirs.
NATIVE_OFF_TESTS := tests/embedding tests/tiers tests/optim tests/checkpoint tests/featurize tests/native
test: install
	$(PYTHON) -m pytest -q -n 2 --dist loadfile -m "not serial" --durations=25
	@log=$$(mktemp); \
	EMBER_NATIVE=0 nice -n 19 $(PYTHON) -m pytest -q -p no:cacheprovider $(NATIVE_OFF_TESTS) > $$log 2>&1 & off_pid=$$!; \
	echo "$(PYTHON) -m pytest -q -m serial --durations=10  (beside it: EMBER_NATIVE=0 nice -n 19 pytest $(NATIVE_OFF_TESTS))"; \
	$(PYTHON) -m pytest -q -m serial --durations=10; serial=$$?; \
	wait $$off_pid; off=$$?; \
	echo "--- EMBER_NATIVE=0 $(PYTHON) -m pytest -q $(NATIVE_OFF_TESTS) (exit $$off):"; cat $$log; rm -f $$log; \
	[ $$serial -eq 0 ] && [ $$off -eq 0 ]

# The docs site (docs/, mkdocs.yml): regenerates the config and CLI references from the code,
# then builds with every warning an error. Offline: no plugin fetches anything. Output: site/.
docs:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[docs]"
	$(PYTHON) -m mkdocs build --strict

bench: install
	$(PYTHON) bench/bench_dlrm.py

clean:
	rm -rf runs site .pytest_cache build *.egg-info
