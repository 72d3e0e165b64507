"""Prefetching the next batch's rows on the worker thread gives exactly the synchronous results."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ember.batch import SparseFeatures
from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig
from ember.embedding.collection import EmbeddingCollection as _EC

KEYS = ["a", "b", "c", "d", "unused"]


def _batches(n: int = 12, b: int = 64) -> list[SparseFeatures]:
    g = torch.Generator().manual_seed(5)
    out = []
    for _ in range(n):
        lengths = torch.randint(0, 3, (len(KEYS) * b,), generator=g)
        # a small vocabulary: consecutive batches share most IDs, so stale reads would show
        values = torch.randint(0, 40, (int(lengths.sum()),), generator=g) * 7919
        out.append(SparseFeatures(KEYS, values, lengths))
    return out


def _collection(storage: dict | None) -> EmbeddingCollection:
    opt = {"type": "rowwise_adagrad", "lr": 0.3}
    extra = {} if storage is None else {"storage": storage}
    tables = [TableConfig(name=n, dim=4, optimizer=opt, **extra) for n in ("t0", "t1", "t2")]
    tables.append(TableConfig(name="t3", dim=4, optimizer={"type": "adam", "lr": 0.1}))
    feats = [
        FeatureConfig(name="a", table="t0"),
        FeatureConfig(name="b", table="t1"),
        FeatureConfig(name="c", table="t1"),  # shared table
        FeatureConfig(name="d", table="t3", pooling="sqrtn"),  # per-table path
        FeatureConfig(name="unused", table="t2"),  # never reaches the loss: never updated
    ]
    return EmbeddingCollection(tables, feats)


def _train(storage: dict | None, prefetch: bool, settle: bool = False) -> dict[str, list]:
    torch.manual_seed(0)
    ec = _collection(storage)
    head = nn.Linear(16, 1)
    batches = _batches()
    prefetched = 0
    for i, sf in enumerate(batches):
        lookups = ec.prepare(sf)
        if prefetch and i + 1 < len(batches):
            prefetched += ec.prefetch(batches[i + 1])
            if settle:  # the next batch's rows are read *before* this update: all stale
                ec._ahead[1].result()  # type: ignore[index]
        out = ec(sf, lookups)
        x = torch.cat([out[k] for k in ("a", "b", "c", "d")], dim=1)
        loss = (head(x) - 1).pow(2).mean()
        head.zero_grad()
        loss.backward()
        ec.apply_gradients()
    ec.close()
    assert prefetched == (len(batches) - 1 if prefetch else 0)
    state = {}
    for name, t in ec.tables.items():
        rows = [(int(i), r.tolist()) for ids, rec in t.items() for i, r in zip(ids, rec)]
        state[name] = sorted(rows)
    return state


@pytest.mark.parametrize("settle", [False, True])
def test_prefetch_equals_synchronous_in_memory(settle):
    assert _train(None, prefetch=True, settle=settle) == _train(None, prefetch=False)


def test_prefetch_equals_synchronous_with_cache_and_disk(tmp_path):
    def storage(tag: str) -> dict:
        return dict(host_rows=8, policy="lfu", admit_after=2, disk_path=str(tmp_path / tag), disk_rows=64)

    assert _train(storage("p"), prefetch=True, settle=True) == _train(storage("s"), prefetch=False)


def test_without_the_patch_prefetch_would_read_stale_rows(monkeypatch):
    # the check above is sensitive: skip the patch and the settled prefetch diverges
    monkeypatch.setattr(_EC, "_patch", lambda self, lookups: None)
    assert _train(None, prefetch=True, settle=True) != _train(None, prefetch=False)


def test_tables_with_min_count_or_ttl_are_not_prefetched():
    ec = EmbeddingCollection([TableConfig(name="t", dim=2, min_count=2)], [FeatureConfig(name="a", table="t")])
    sf = SparseFeatures(["a"], torch.tensor([1, 2]), torch.tensor([1, 1]))
    assert ec.prefetch(sf) is False
    ec.prepare(sf)  # and the synchronous path still works
