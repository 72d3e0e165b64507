"""A table group with a device cache costs the device a fixed few operations per training step
and never a device->host synchronisation, whatever the number of tables (issue: the GPU path).

The arena is in host memory here (every CPU machine), with the native core off so that the
steps take the torch paths a GPU takes; ``DeviceBudget`` counts the operations on the arena's
data (``ember.tiers.device_budget``). Each table group's embedding path is measured on its
own: plan, fetch, pool, backward (fixed cotangents), update, write back.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import _native
from ember.batch import SparseFeatures
from ember.config import from_dict
from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig
from ember.models import MODEL_TYPES
from ember.testing import SPARSE_OPTIMIZERS
from ember.tiers.device_budget import DeviceBudget
from ember.tiers.group_cache import GroupCacheView
from ember.train.builder import build_components

OPS_PER_GROUP = 25  # the budget per table group and step
OPTIMIZERS = SPARSE_OPTIMIZERS
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _torch_paths(monkeypatch):
    """The torch paths a GPU runs (the C core serves only CPU tensors, through .numpy())."""
    monkeypatch.setattr(_native, "_core", None)


def _batch(names: list[str], b: int, rng: np.random.Generator, multi: bool = False) -> SparseFeatures:
    lengths = rng.integers(0, 4, len(names) * b) if multi else np.ones(len(names) * b, dtype=np.int64)
    values = np.minimum(rng.zipf(1.1, int(lengths.sum())), 4000) * 7919
    return SparseFeatures(names, torch.from_numpy(values), torch.from_numpy(lengths))


def _measure(collections: list[EmbeddingCollection], names: list[str], b: int = 256, warmup: int = 4, steps: int = 3,
             multi: bool = False) -> list[DeviceBudget]:
    """Budgets of every cached group's embedding path for ``steps`` steps after ``warmup``."""
    rng = np.random.default_rng(0)
    g = torch.Generator().manual_seed(1)
    cot = {n: torch.randn(b, ec.table_configs[ec.features[0].table_name].dim, generator=g)
           for ec in collections for n in names}
    out = []
    for step in range(warmup + steps):
        sf = _batch(names, b, rng, multi)
        for ec in collections:
            for group in ec.groups:
                if group.cache is None:
                    continue
                budget = DeviceBudget(CPU)
                with budget:
                    budget.mark(*cot.values())
                    lk = group.plan(sf, True)
                    lk.fetch()
                    pooled = lk.pool(CPU)
                    torch.autograd.backward([pooled[k] for k in pooled], [cot[k][:, : pooled[k].shape[1]] for k in pooled])
                    lk.update(step)
                    lk.write_back()
                if step >= warmup:
                    out.append(budget)
    assert out, "no table group had a device cache"
    return out


def _measure_ahead(ec: EmbeddingCollection, names: list[str], b: int = 256, warmup: int = 4, steps: int = 3) -> list[DeviceBudget]:
    """Budgets of a cached group's step as the pipelined trainer orders it: batch t+1's host half
    prepared (its victims sent) before batch t's write-back, then the rows that write-back stored
    outside the arena re-read into its plan and the plan loaded (``TrainStages.fetch``). One
    step of the cycle: re-read(t), load(t), pool, backward, prepare(t+1), update(t), write back(t)."""
    rng = np.random.default_rng(0)
    (group,) = [g for g in ec.groups if g.cache is not None]
    g = torch.Generator().manual_seed(1)
    cot = {n: torch.randn(b, group.dim, generator=g) for n in names}
    nxt = group.plan(_batch(names, b, rng), True).prepare()
    last: list[np.ndarray] = []
    out, reread = [], 0
    for step in range(warmup + steps):
        budget = DeviceBudget(CPU)
        with budget:
            budget.mark(*cot.values())
            lk = nxt
            reread += lk.reread(lambda: last)
            lk.fetch()
            pooled = lk.pool(CPU)
            torch.autograd.backward([pooled[k] for k in pooled], [cot[k][:, : pooled[k].shape[1]] for k in pooled])
            nxt = group.plan(_batch(names, b, rng), True).prepare()
            lk.update(step)
            lk.write_back()
            last = [lk.keys(lk.written)]
        if step >= warmup:
            out.append(budget)
    assert reread > 0  # later batches did read rows an earlier write-back stored meanwhile
    return out


def _check(budgets: list[DeviceBudget]) -> None:
    for b in budgets:
        assert b.syncs == 0, b.report()
        assert b.ops <= OPS_PER_GROUP, b.report()
    assert sum(b.downloads for b in budgets) > 0  # the cache really evicted or bypassed rows


@pytest.mark.parametrize("model", MODEL_TYPES)
@pytest.mark.parametrize("opt", OPTIMIZERS, ids=[o["type"] for o in OPTIMIZERS])
def test_every_model_and_optimizer_keeps_the_budget(model, opt, tmp_path):
    cfg = from_dict({
        "data": {"preset": "synthetic", "synthetic": {"rows": 1000, "eval_rows": 200, "vocab_size": 3000, "num_sparse": 6},
                 "batch_size": 256},
        "embedding": {"dim": 16, "optimizer": opt, "storage": {"device_rows": 150, "device": "cpu", "admit_after": 1}},
        "model": {"type": model},
        "train": {"out_dir": str(tmp_path), "device": "cpu", "progress": False},
    })
    parts = build_components(cfg, announce=False)
    ec = parts.embeddings
    assert all(isinstance(t.tier, GroupCacheView) for t in ec.tables.values())
    _check(_measure([ec], [f.name for f in ec.features]))


@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("opt", OPTIMIZERS, ids=[o["type"] for o in OPTIMIZERS])
def test_multi_hot_bags_keep_the_budget(pooling, opt):
    names = [f"f{i}" for i in range(8)]
    tables = [TableConfig(name=f"t{i}", dim=8, optimizer=opt, storage={"device_rows": 150, "device": "cpu", "admit_after": 1})
              for i in range(8)]
    ec = EmbeddingCollection(tables, [FeatureConfig(name=n, table=f"t{i}", pooling=pooling) for i, n in enumerate(names)])
    _check(_measure([ec], names, multi=True))


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=[o["type"] for o in OPTIMIZERS])
def test_a_step_prepared_ahead_keeps_the_budget(opt):
    names = [f"f{i}" for i in range(6)]
    tables = [TableConfig(name=f"t{i}", dim=8, optimizer=opt, storage={"device_rows": 150, "device": "cpu", "admit_after": 1})
              for i in range(6)]
    ec = EmbeddingCollection(tables, [FeatureConfig(name=n, table=f"t{i}") for i, n in enumerate(names)])
    _check(_measure_ahead(ec, names))


def test_the_count_does_not_grow_with_the_number_of_tables():
    def ops(n: int) -> list[int]:
        tables = [TableConfig(name=f"t{i}", dim=8, optimizer={"type": "rowwise_adagrad", "lr": 0.05},
                              storage={"device_rows": 150, "device": "cpu", "admit_after": 1}) for i in range(n)]
        ec = EmbeddingCollection(tables, [FeatureConfig(name=f"f{i}", table=f"t{i}") for i in range(n)])
        return [b.ops for b in _measure([ec], [f"f{i}" for i in range(n)])]

    two, many = ops(2), ops(26)
    assert max(many) <= max(two), (two, many)  # one group: the same sequence for 2 tables or 26


def test_a_sync_in_the_step_is_caught():
    """The instrument works on this path: a .item() on the fetched rows is counted."""
    tables = [TableConfig(name="t0", dim=8, storage={"device_rows": 50, "device": "cpu", "admit_after": 1})]
    ec = EmbeddingCollection(tables, [FeatureConfig(name="f0", table="t0")])
    sf = _batch(["f0"], 64, np.random.default_rng(0))
    budget = DeviceBudget(CPU)
    with budget:
        lk = ec.groups[0].plan(sf, True)
        lk.fetch()
        assert lk.records is not None
        float(lk.records.sum())
    assert budget.syncs == 1 and budget.ops >= 4
