"""``MappedFetch``: storage.index: device's step as functions of fixed-size tensors (what a GPU
captures as CUDA graphs). The padded runs' results are held to the unpadded path bit for bit in
test_device_index_group.py / test_device_index_train.py (the ``padding`` fixture); here: the
buckets, the graphs retired when the rows or the index are replaced, and a capture that fails."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from ember.batch import SparseFeatures
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig, mapped_fetch

DEVICE_INDEX = {"index": "device", "device": "cpu"}


def _collection(dtype: str = "fp32") -> EmbeddingCollection:
    tables = [TableConfig(name=f"t{i}", dim=5, optimizer={"type": "adagrad", "lr": 0.1}, storage=DEVICE_INDEX, dtype=dtype)
              for i in range(3)]
    return EmbeddingCollection(tables, [FeatureConfig(name=f"f{i}", table=f"t{i}") for i in range(3)])


def _step(ec: EmbeddingCollection, rng: np.random.Generator, b: int, vocab: int) -> None:
    sf = SparseFeatures(["f0", "f1", "f2"], torch.from_numpy(rng.integers(0, vocab, 3 * b)), torch.ones(3 * b, dtype=torch.int64))
    emb = ec(sf)
    sum((emb[k] ** 2).sum() for k in emb).backward()
    SparseOptimizer(ec).step()


def test_buckets_are_powers_of_two_from_the_smallest():
    assert [mapped_fetch.bucket(n) for n in (0, 1, 1024, 1025, 5000)] == [1024, 1024, 1024, 2048, 8192]


def test_a_growth_retires_the_graphs_of_the_replaced_tensors(monkeypatch):
    monkeypatch.setattr(mapped_fetch, "PAD_ON_CPU", True)
    monkeypatch.setattr(mapped_fetch, "MIN_BUCKET", 16)
    ec = _collection("bf16")
    (group,) = ec.groups
    fetch, m = group.mapped_fetch, group.mapped
    rng = np.random.default_rng(0)
    seen = []
    for step in range(12):
        before = (m.generation, m.index.generation)
        _step(ec, rng, 8 + 6 * step, 40 + 400 * step)  # (more new IDs each step: the rows and the index grow)
        after = (m.generation, m.index.generation)
        assert fetch._generation == after
        seen.append((before != after, sorted(fetch._graphs)))
    assert any(grew for grew, _ in seen) and any(not grew for grew, _ in seen)
    for grew, graphs in seen:
        if grew:  # only this step's graphs, made after the growth: one fetch, one write-back
            assert sorted(call for call, _ in graphs) == ["fetch", "write"], graphs
    assert {call for call, _ in seen[-1][1]} == {"fetch", "write"}  # (16-bit rows: the write-back has one too)


def test_a_capture_that_fails_is_said_once_and_the_step_runs_operation_by_operation(monkeypatch, caplog):
    monkeypatch.setattr(mapped_fetch, "PAD_ON_CPU", True)
    monkeypatch.setattr(mapped_fetch, "MIN_BUCKET", 64)

    class NoGraphs:
        def __init__(self) -> None:
            raise RuntimeError("capture is not supported here")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", NoGraphs)
    runs = []
    for graphs in (True, False):
        ec = _collection()
        (group,) = ec.groups
        group.mapped_fetch.graphs_on = graphs  # (as on a GPU: try to capture)
        rng = np.random.default_rng(1)
        with caplog.at_level(logging.WARNING, logger="ember.embedding"):
            for _ in range(4):
                _step(ec, rng, 20, 50)
        runs.append({n: sorted((int(i), r.tolist()) for ids, rec in t.tier.items() for i, r in zip(ids, rec))
                     for n, t in ec.tables.items()})
        if graphs:
            assert not group.mapped_fetch.graphs_on
            said = [r for r in caplog.records if "could not be captured" in r.getMessage()]
            assert len(said) == 1 and "capture is not supported here" in said[0].getMessage()
    assert runs[0] == runs[1]


@pytest.mark.parametrize("dtype,min_count", [("fp32", 1), ("bf16", 1), ("fp32", 2), ("bf16", 2)])
def test_a_steady_step_launches_within_the_budget_as_a_gpu_replays_it(dtype, min_count, monkeypatch):
    """Issue 25's budget, checked on a CPU: a steady step of a 26-table group (plan, fetch, pool,
    backward, update, write-back) counted as a GPU runs it, each captured function one launch:
    at most 25 operations with every sparse optimizer, fp32 or 16-bit rows, with or without
    min_count (counted on the device), and no sync. (The GPU test counts the replays themselves.)"""
    budget = 25
    from ember import _native
    from ember.testing import SPARSE_OPTIMIZERS, group_step
    from ember.tiers.device_budget import DeviceBudget

    monkeypatch.setattr(_native, "_core", None)  # (the torch paths a GPU takes)
    monkeypatch.setattr(mapped_fetch, "PAD_ON_CPU", True)
    monkeypatch.setattr(mapped_fetch, "COUNT_AS_GRAPHS", True)
    names = [f"C{i}" for i in range(26)]
    for opt in SPARSE_OPTIMIZERS:
        ec = EmbeddingCollection([TableConfig(name=n, dim=16, optimizer=opt, storage=DEVICE_INDEX, dtype=dtype,
                                              min_count=min_count) for n in names],
                                 [FeatureConfig(name=n) for n in names])
        (group,) = ec.groups
        rng = np.random.default_rng(0)
        cot = torch.randn(256, 16)
        counts = []
        for step in range(6):
            sf = SparseFeatures(names, torch.from_numpy(rng.zipf(1.2, 26 * 256) % 50_000), torch.ones(26 * 256, dtype=torch.int64))
            with DeviceBudget("cpu") as b:
                b.mark(cot)
                group_step(group, sf, cot, step)
            assert b.syncs == 0, b.report()
            counts.append(b.ops)
        assert b.op_names["cuda graph"] == 1 + (dtype != "fp32"), b.report()
        assert max(counts[2:]) <= budget, (opt["type"], counts, b.report(30))


@pytest.mark.parametrize("dtype,ttl", [("fp32", None), ("bf16", 2)])
def test_replays_read_the_loaded_tensors_and_equal_running_the_step(dtype, ttl, monkeypatch):
    """The graphs' plumbing on a CPU, a replay standing in for CUDA's (it runs the captured
    function on the graph's own tensors and writes the graph's own outputs, as a replay does):
    each call's pairs loaded into the fixed tensors, the padding masked, the outputs copied out
    before the next replay, graphs retired by a growth. The rows equal a run without graphs,
    bit for bit (16-bit rows and a TTL: the write-back's graph and the steps' upload too)."""
    monkeypatch.setattr(mapped_fetch, "PAD_ON_CPU", True)
    monkeypatch.setattr(mapped_fetch, "MIN_BUCKET", 16)

    class Replay:
        def __init__(self, gr, fn) -> None:
            self.gr, self.fn, self.replays = gr, fn, 0

        def replay(self) -> None:
            out = self.fn(*self.gr.inputs.values())
            if not self.gr.out:
                self.gr.out = tuple(torch.empty_like(t) for t in out)
            for dst, src in zip(self.gr.out, out):
                dst.copy_(src)
            self.replays += 1

    def capture(self, gr, fn) -> None:
        gr.graph = Replay(gr, fn)

    runs, replays = [], 0
    for graphs in (False, True):
        with monkeypatch.context() as mp:
            if graphs:
                mp.setattr(mapped_fetch.MappedFetch, "_capture", capture)
            tables = [TableConfig(name=f"t{i}", dim=5, optimizer={"type": "adagrad", "lr": 0.1}, storage=DEVICE_INDEX,
                                  dtype=dtype, ttl_steps=ttl) for i in range(3)]
            ec = EmbeddingCollection(tables, [FeatureConfig(name=f"f{i}", table=f"t{i}") for i in range(3)])
            (group,) = ec.groups
            group.mapped_fetch.graphs_on = graphs
            rng = np.random.default_rng(4)
            for step in range(14):
                _step(ec, rng, 5 + (step * 7) % 23, 30 + 40 * step)  # (sizes move between buckets; the rows grow)
            if graphs:
                replays = sum(gr.graph.replays for gr in group.mapped_fetch._graphs.values() if gr.graph is not None)
        runs.append({n: sorted((int(i), r.tolist()) for ids, rec in t.tier.items() for i, r in zip(ids, rec))
                     for n, t in ec.tables.items()})
    assert replays > 0
    assert runs[0] == runs[1]
