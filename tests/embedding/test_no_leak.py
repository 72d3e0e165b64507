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


def test_lookups_do_not_pile_up_over_a_training_run(monkeypatch, tmp_path):
    """Through the trainer (pipeline on, stages on threads): at any step at most the pipeline's
    lookups in flight are alive, however long the run, with the garbage collector off."""
    from ember.config import from_dict
    from ember.train.loop import train

    made: list[weakref.ref] = []
    alive_max = [0]
    pool = GroupLookup.pool

    def tracked(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        made.append(weakref.ref(self))
        alive_max[0] = max(alive_max[0], sum(r() is not None for r in made))
        return pool(self, *args, **kwargs)

    monkeypatch.setattr(GroupLookup, "pool", tracked)
    cfg = from_dict({"data": {"preset": "synthetic", "batch_size": 64,
                              "synthetic": {"num_dense": 2, "num_sparse": 3, "rows": 64 * 40, "eval_rows": 64}},
                     "embedding": {"dim": 4}, "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
                     "train": {"out_dir": str(tmp_path), "run_name": "r", "progress": False, "threads": 1},
                     "pipeline": {"enabled": True, "engine": "threads"}})
    gc.disable()
    try:
        train(cfg)
    finally:
        gc.enable()
    assert len(made) >= 40
    assert alive_max[0] <= 8, f"{alive_max[0]} lookups alive at once"  # the few in flight, not one per step
