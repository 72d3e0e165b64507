"""Smoke test of bench/bench_autocast_size.py (the measurements behind ``train.precision: auto``'s
size rule) with two steps per configuration, so that the script cannot rot: its final JSON line
covers every configuration with the multiply-adds ``dense_macs`` counts and a positive speed-up,
and names the threshold auto uses. The speeds themselves are not checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ember.train.precision import AMX_MIN_MACS, AMX_MIN_MACS_PER_SAMPLE, BF16_MIN_MACS
from tests.conftest import REPO


@pytest.mark.slow
def test_bench_autocast_size_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(REPO / "bench" / "bench_autocast_size.py"), "--steps", "2", "--warmup", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    assert record["bf16_min_macs"] == BF16_MIN_MACS
    found = {(r["model"], r["batch"]): r for r in record["speedups"]}
    assert len(found) == 13 and all(r["speedup"] > 0 for r in found.values())
    # criteo.yaml's DLRM: 13-32-4 bottom, (351 + 4)-16-1 top = 6,240 multiply-adds a sample
    assert found[("criteo.yaml", 128)]["macs"] == 6_240 * 128
    assert record["machine"]["cpu"]
    assert found[("criteo.yaml", 128)]["macs_per_sample"] == 6_240
    assert (record["amx_min_macs"], record["amx_min_macs_per_sample"]) == (AMX_MIN_MACS, AMX_MIN_MACS_PER_SAMPLE)
    # what auto picks on this CPU: the size rules only where it computes bf16 natively
    for r in found.values():
        if "amx_bf16" in record["machine"]["bf16"]:
            gains = r["macs"] >= AMX_MIN_MACS and r["macs_per_sample"] >= AMX_MIN_MACS_PER_SAMPLE
        else:
            gains = bool(record["machine"]["bf16"]) and r["macs"] >= BF16_MIN_MACS
        assert r["auto_picks"] == ("bf16" if gains else "fp32"), r
