"""A training step leaves nothing behind: a lookup (its rows, gradients, records) is freed by
reference counting once its step is done, never kept by a reference cycle through the hooks on
its autograd leaf (a cycle through the tensor's hooks is one the garbage collector cannot see:
memory grew by the batch's rows every step of a long run)."""

from __future__ import annotations

import gc
import weakref

import torch

from ember.batch import SparseFeatures
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig
from ember.embedding.group import GroupLookup


def test_a_trained_lookup_is_freed_without_the_garbage_collector(monkeypatch):
    ec = EmbeddingCollection([TableConfig(name="t", dim=8, optimizer={"type": "rowwise_adagrad", "lr": 0.1}),
                              TableConfig(name="u", dim=8, optimizer={"type": "sgd", "lr": 0.1})],
                             [FeatureConfig(name="a", table="t"), FeatureConfig(name="b", table="u", pooling="mean"),
                              FeatureConfig(name="c", table="t", pooling="sqrtn")])
    opt = SparseOptimizer(ec)
    made: list[weakref.ref] = []
    pool = GroupLookup.pool

    def tracked(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        made.append(weakref.ref(self))
        return pool(self, *args, **kwargs)

    monkeypatch.setattr(GroupLookup, "pool", tracked)
    sf = SparseFeatures(["a", "b", "c"], torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9]), torch.tensor([1, 2, 1, 1, 2, 2]))
    gc.disable()
    try:
        for _ in range(3):
            out = ec(sf)
            (out["a"].sum() + out["b"].pow(2).sum() + out["c"].sum()).backward()
            opt.step()
            del out
        assert made and all(ref() is None for ref in made), "a lookup outlived its step"
    finally:
        gc.enable()
