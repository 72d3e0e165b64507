"""Smoke test of bench/bench_own_work.py (ember's own work per step at two thread counts, fitted
as serial + parallel / threads) with tiny arguments, so that the script cannot rot: its final JSON
line holds every part's times and fit. The speeds themselves are not checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize("min_count", [1, 2])
def test_bench_own_work_smoke(tmp_path: Path, min_count: int) -> None:
    cmd = [sys.executable, str(REPO / "bench" / "bench_own_work.py"), "--steps", "2", "--warmup", "2", "--batch", "256",
           "--min-count", str(min_count)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO / "bench")
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    parts = {"plan+fetch", "pooling", "sparse step"}
    assert set(record["ms"]) == {"1", "2"} and all(set(v) == parts and min(v.values()) > 0 for v in record["ms"].values())
    for key in ("serial_ms", "parallel_ms", "predicted_ms"):
        assert set(record[key]) == parts | {"total"}
    assert record["machine"]["cpu"] and record["min_count"] == min_count
