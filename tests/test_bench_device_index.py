"""Smoke test of bench/bench_device_index.py on a CPU with tiny sizes, so that the script cannot
rot: its JSON keys, no sync per call, and every variant timed."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_runs_and_reports_its_keys() -> None:
    out = subprocess.run([sys.executable, str(REPO / "bench" / "bench_device_index.py"), "--rows", "2000", "--batch-ids", "300",
                          "--steps", "2", "--warmup", "1", "--device", "cpu"], capture_output=True, text=True, timeout=120, check=True)
    record = json.loads(out.stdout.strip().splitlines()[-1])
    for key in ("find_or_insert_ms", "find_ms", "host_index_ms", "device_ops_find_or_insert", "device_ops_find"):
        assert record[key] > 0, key
    assert record["syncs_per_call"] == 0
    assert record["device"] == "cpu"
