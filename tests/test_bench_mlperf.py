"""Smoke test of bench/bench_mlperf.py: tiny arguments (a few steps of batch 256 over tables of at
most 5,000 rows, most of them on host cache + disk tiers), so that the script cannot rot. Only the
final JSON line's keys and that its figures are positive are checked, not the speeds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

HEADLINE = ["samples_per_s_fp32", "samples_per_s_bf16", "per_core_fp32", "per_core_bf16", "per_core_vs_intel",
            "ember_vs_plain", "ember_bf16_vs_plain_bf16", "batch", "physical_cores"]


@pytest.mark.slow
def test_bench_mlperf_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(REPO / "bench" / "bench_mlperf.py"), "--batch", "256", "--steps", "2", "--warmup", "1",
           "--max-rows", "5000", "--ram-gib", "0.002", "--disk", str(tmp_path), "--bf16", "always"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    for key in HEADLINE:
        assert record[key] > 0, (key, record[key])
    assert record["batch"] == 256
    machine = record["machine"]
    assert machine["cpu"] and isinstance(machine["bf16"], list)
    assert record["bf16_is_target"] == bool(machine["bf16"])
    assert record["cpu_topology"]["threads_per_core"] >= 1
    assert record["tiers"]["ember"]["tiered_tables"] > 0  # the disk tier path ran
    assert set(record["samples_per_s"]) == {"ember", "ember-bf16", "plain", "plain-bf16"}
    assert list(tmp_path.iterdir()) == []  # the disk tiers' temporary directory is removed


@pytest.mark.slow
def test_bench_mlperf_skips_emulated_bf16_by_default(tmp_path: Path) -> None:
    """``--bf16 auto`` (the default) runs the bf16 variants only on a CPU with native bf16: where
    they would be emulated (over an hour at the default size) they are skipped, said in a line,
    and their figures are null; ``--bf16 never`` skips them anywhere."""
    for flag in ([], ["--bf16", "never"]):
        cmd = [sys.executable, str(REPO / "bench" / "bench_mlperf.py"), "--batch", "128", "--steps", "1", "--warmup", "1",
               "--max-rows", "2000", "--ram-gib", "0.002", "--disk", str(tmp_path), *flag]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        record = json.loads(out.stdout.strip().splitlines()[-1])
        native = bool(record["machine"]["bf16"])
        ran = native and not flag
        assert set(record["samples_per_s"]) == ({"ember", "ember-bf16", "plain", "plain-bf16"} if ran else {"ember", "plain"})
        assert (record["samples_per_s_bf16"] is not None) == ran and (record["per_core_vs_intel"] is not None) == ran
        assert record["samples_per_s_fp32"] > 0 and record["ember_vs_plain"] > 0
        assert ran or "bf16 variants skipped" in out.stdout
