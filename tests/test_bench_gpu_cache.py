"""Smoke test of bench/bench_gpu_cache.py's budget measurement on a CPU (the "device" arena in host
memory), with tiny sizes so that the script cannot rot. Only the JSON keys and that the figures
are counts are checked, not the budget targets (the per-table caches of today miss them)."""

from __future__ import annotations

import importlib
import json
import sys

import pytest
import torch

from tests.conftest import REPO


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))  # the bench imports its siblings (bench_dlrm, benchkit)
    for name in ("bench_gpu_cache", "bench_dlrm"):
        sys.modules.pop(name, None)
    mod = importlib.import_module("bench_gpu_cache")
    yield mod
    for name in ("bench_gpu_cache", "bench_dlrm"):
        sys.modules.pop(name, None)


def test_budgets_on_cpu(bench) -> None:
    vocab = 400
    bench.bench_dlrm.W = bench.bench_dlrm.Workload([vocab] * bench.F)
    batches = bench.make_batches(4, 32, zipf=bench.ZIPF)
    budgets = bench.measure_budgets(torch.device("cpu"), batches, vocab, warmup=1, steps=2, log=False)
    assert set(budgets) == set(bench.CACHES) | {f"{c} ahead" for c in bench.CACHES} | {"ember-device-index",
                                                                                       "ember-device-index-hot-1/4"}
    from benchkit import json_line  # the bench's last line

    record = json.loads(json_line(bench.budget_summary(budgets)))
    for key in ("device_ops_per_step_per_group", "syncs_per_step", "budget", "device_index_ops_per_step",
                "device_index_syncs_per_step", "hot_ops_per_step", "hot_syncs_per_step"):
        assert key in record, key
    # the cache's headline is the cache's; storage.index: device (its look-up on the device) apart
    assert record["device_ops_per_step_per_group"] == max(b["ops_per_step_per_group"] for n, b in budgets.items()
                                                          if not n.startswith("ember-device-index"))
    assert record["device_index_ops_per_step"] == budgets["ember-device-index"]["ops_per_step_per_group"]
    assert budgets["ember-device-index"]["top_ops"].get("cuda graph", 0) > 0  # (a CPU counts each graph as its replay)
    assert budgets["ember-device-index-hot-1/4"]["top_ops"].get("cuda graph", 0) > 0
    assert isinstance(record["syncs_per_step"], int) and record["syncs_per_step"] >= 0
    assert isinstance(record["device_ops_per_step_per_group"], int) and record["device_ops_per_step_per_group"] > 0
    for name, b in record["budget"].items():
        assert set(b["phases"]) == (set(bench.PHASES) if not name.endswith(" ahead") else
                                    {"re-read+load", "pool+backward", "prepare next", "update", "write_back"}), name
        assert b["groups"] == 1  # the 26 tables form one group
        assert b["ops_per_step_per_group"] >= sum(p["ops"] for p in b["phases"].values()) - 1e-9  # max >= mean


def test_make_batches_zipf_default_unchanged(bench) -> None:
    a = bench.make_batches(1, 16)[0][0]
    b = bench.make_batches(1, 16, zipf=1.1)[0][0]
    c = bench.make_batches(1, 16, zipf=1.05)[0][0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_comparison_runs_on_cpu(bench) -> None:
    """The CUDA-only comparison's bookkeeping, run on a CPU "device" with tiny tables."""
    vocab = 300
    bench.bench_dlrm.W = bench.bench_dlrm.Workload([vocab] * bench.F)
    batches = bench.make_batches(3, 16, zipf=bench.ZIPF)
    out = bench.compare_on_gpu(torch.device("cpu"), batches, vocab, warmup=1)
    names = {*bench.CACHES, "ember-host", "ember-device-index", "ember-device-index-eager", "ember-mapped", "plain-gpu",
             "ember-device-index-hot-1/4", "ember-device-index-hot-all"}
    assert set(out["ms_per_step"]) == names and set(out["embedding_ids_per_s"]) == names
    assert out["cache_vs_host"] > 0 and out["cache_vs_all_device"] > 0
    assert out["mapped_vs_host"] > 0 and out["mapped_vs_all_device"] > 0 and out["mapped_vs_plain_gpu"] > 0
    assert out["device_index_vs_host"] > 0 and out["device_index_vs_all_device"] > 0
    assert out["device_index_graphs_vs_eager"] > 0
    assert min(out[k] for k in ("hot_vs_host", "hot_vs_all_device", "hot_vs_device_index", "hot_vs_plain_gpu")) > 0
    assert 0 <= out["cache_hit_rate"]["ember-cache-1/4"] <= 1 and out["cache_hit_rate"]["ember-host"] is None


def test_phase_timing_and_trainer_comparison_on_cpu(bench) -> None:
    """--phases and --trainer run on a CPU (tiny sizes): every phase timed, every trainer
    variant's samples/s and the cache / host ratio per staleness reported."""
    vocab = 400
    bench.bench_dlrm.W = bench.bench_dlrm.Workload([vocab] * bench.F)
    batches = bench.make_batches(5, 32, zipf=bench.ZIPF)  # warm-up, 2 embedding-path steps, 2 full steps
    phases = bench.profile_phases(torch.device("cpu"), batches, vocab, warmup=1, steps=2, caches={"c": 4, "h": None})
    assert set(phases) == {"c", "h", "c full step", "h full step", "c page faults per step", "h page faults per step"}
    assert all(phases[f"{v} page faults per step"] >= 0 for v in "ch")
    assert set(phases["c"]) == set(phases["h"]) == set(bench.PHASES)
    assert set(phases["c full step"]) == set(phases["h full step"]) == {
        "embedding forward", "dense forward+backward", "dense optimizer", "sparse step"}
    assert all(ms >= 0 for p in phases.values() if isinstance(p, dict) for ms in p.values())
    out = bench.compare_trainer(torch.device("cpu"), batches, vocab, warmup=2, rounds=1, staleness=(0, 1))
    assert set(out["trainer_samples_per_s"]) == {"trainer-cache-1/4-k0", "trainer-host-k0", "trainer-cache-1/4-k1",
                                                 "trainer-host-k1", "trainer-cache-1/4-k0-inline-plan",
                                                 "trainer-device-index-k0", "trainer-device-index-k1"}
    assert out["trainer_device_index_vs_host_k0"] > 0 and out["trainer_device_index_vs_host_k1"] > 0
    assert all(v > 0 for v in out["trainer_samples_per_s"].values())
    assert out["trainer_cache_vs_host_k1"] > 0 and out["trainer_prepared_ahead_gain"] > 0


def test_the_mapped_variant_trains_as_ember_host_and_never_syncs(bench, monkeypatch: pytest.MonkeyPatch) -> None:
    """ember-mapped (records in host memory found and moved by device operations) stores the very
    rows ember-host stores, on the same batches (a CPU "device": the same code as on a GPU), and
    its embedding path reads nothing back from the device."""
    vocab = 500
    bench.bench_dlrm.W = bench.bench_dlrm.Workload([vocab] * bench.F)
    batches = bench.make_batches(5, 64, zipf=bench.ZIPF)
    cpu = torch.device("cpu")
    host, mapped = bench.EmberVariant("ember-host", None, cpu), bench.MappedVariant(cpu)
    for ids, dense, labels in batches[:4]:
        host.step(host.features(ids), dense, labels)
        mapped.step(ids, dense, labels)
    for f in (0, 13, 25):
        u = torch.unique(batches[0][0][f])
        t = host.ec.tables[f"C{f + 1}"]
        want = torch.empty(u.numel(), t.config.record_dim)
        t.tier.get_into(u, want)
        found, got = mapped.rows.find(u, torch.full_like(u, f, dtype=torch.int32))
        assert bool(found.all()) and torch.equal(got, want), f
    from ember import _native

    monkeypatch.setattr(_native, "_core", None)  # the torch paths a GPU takes (main does the same)
    budget = bench.measure_mapped_budget(cpu, batches, warmup=3, steps=1)
    assert budget["syncs_per_step"] == 0 and budget["ops_per_step"] > 0
