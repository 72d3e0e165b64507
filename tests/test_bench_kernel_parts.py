"""Smoke test of bench/bench_kernel_parts.py (a row kernel in one part, in two on a Python pool,
in two on OpenMP's threads; each kernel moved to OpenMP in one part and in its parts) with few
calls, so that the script cannot rot: its final JSON line holds a positive speed-up of each split
per call size and kernel. The speeds themselves are not checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ember import _native
from tests.conftest import REPO


@pytest.mark.skipif(not _native.native_parts(), reason="the native core is off, or built without OpenMP")
def test_bench_kernel_parts_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(REPO / "bench" / "bench_kernel_parts.py"), "--calls", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(record["openmp_vs_one"]) == set(record["pool_vs_one"]) == {"2048", "4096", "8192", "16384", "41500", "106496"}
    assert all(v > 0 for v in record["openmp_vs_one"].values()) and record["handoff_us"] > 0
    moved = {"rowwise_adagrad", "uniform01", "normal01", "bf16_pack_sr", "arrow_hash_ints", "pair_find", "gc_scores",
             "disk_find", "disk_write"}
    assert set(record["kernel_vs_one"]) == moved
    assert all(set(v) == {"4096", "16384", "106496"} and min(v.values()) > 0 for v in record["kernel_vs_one"].values())
    assert record["machine"]["cpu"]
