"""Table-batched path (one leaf, one embedding_bag, one optimizer call per group) against the
per-table reference path (``batched = False``): same outputs, gradients and stored rows."""

from __future__ import annotations

import pytest
import torch

from ember.batch import SparseFeatures
from ember.embedding import EmbeddingCollection, FeatureConfig, SequenceEmbedding, TableConfig

D, B = 4, 6
OPTIMIZERS = [
    {"type": "sgd", "lr": 0.1},
    {"type": "adagrad", "lr": 0.1},
    {"type": "rowwise_adagrad", "lr": 0.1},
    {"type": "adam", "lr": 0.01},
    {"type": "ftrl", "alpha": 0.1},
]


def _features(pooling: str) -> list[FeatureConfig]:
    # t0 has two features (shared table), t1 and t2 one each; t3 has a different dim
    return [
        FeatureConfig(name="a", table="t0", pooling=pooling),
        FeatureConfig(name="b", table="t1", pooling=pooling),
        FeatureConfig(name="c", table="t0", pooling=pooling),
        FeatureConfig(name="d", table="t2", pooling=pooling),
        FeatureConfig(name="e", table="t3", pooling=pooling),
    ]


def _tables(opt: dict, **kw) -> list[TableConfig]:
    out = [TableConfig(name=f"t{i}", dim=D, optimizer=opt, seed=i, **kw) for i in range(3)]
    return out + [TableConfig(name="t3", dim=D + 1, optimizer=opt)]


def _batch(rng: torch.Generator, weighted: bool = False) -> SparseFeatures:
    keys = ["a", "b", "c", "d", "e"]
    lengths = torch.randint(0, 4, (len(keys) * B,), generator=rng)
    values = torch.randint(0, 12, (int(lengths.sum()),), generator=rng) * 1_000_003 - 5
    weights = torch.rand(values.numel(), generator=rng) if weighted else None
    return SparseFeatures(keys, values, lengths, weights)


def _pair(tables, features):
    fast, ref = EmbeddingCollection(tables, features), EmbeddingCollection(tables, features)
    ref.batched = False
    return fast, ref


def _step(ec, sf, proj, use=None):
    out = ec(sf)
    vals = {k: o.values if isinstance(o, SequenceEmbedding) else o for k, o in out.items()}
    loss = sum((v * proj[: v.shape[-1]]).square().sum() for k, v in vals.items() if use is None or k in use)
    if use != set():
        loss.backward()
    ec.apply_gradients()
    return out


def _assert_tables_equal(fast, ref):
    for name in ref.tables:
        fi, fr = map(torch.cat, zip(*fast.tables[name].items()))
        ri, rr = map(torch.cat, zip(*ref.tables[name].items()))
        assert torch.equal(fi, ri)
        torch.testing.assert_close(fr, rr, rtol=1e-5, atol=1e-6)
        assert fast.tables[name].step == ref.tables[name].step


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=[o["type"] for o in OPTIMIZERS])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_batched_matches_per_table(opt, pooling):
    fast, ref = _pair(_tables(opt), _features(pooling))
    assert any(len(g) > 1 for g in fast._groups)
    rng = torch.Generator().manual_seed(0)
    proj = torch.randn(D + 1, generator=rng)
    for _ in range(4):
        sf = _batch(rng)
        of, orf = _step(fast, sf, proj), _step(ref, sf, proj)
        for k in orf:
            torch.testing.assert_close(of[k], orf[k], rtol=1e-5, atol=1e-6)  # sums may round apart by an ulp
    _assert_tables_equal(fast, ref)


@pytest.mark.parametrize("pooling", ["sqrtn", "sequence"])
def test_unbatchable_pooling_takes_the_per_table_path(pooling):
    fast, ref = _pair(_tables(OPTIMIZERS[2]), _features(pooling))
    assert all(len(g) == 1 for g in fast._groups)
    rng = torch.Generator().manual_seed(1)
    proj = torch.randn(D + 1, generator=rng)
    for _ in range(3):
        sf = _batch(rng)
        _step(fast, sf, proj), _step(ref, sf, proj)
    _assert_tables_equal(fast, ref)


def test_weighted_batch_and_mixed_optimizers_match():
    tables = _tables(OPTIMIZERS[2])
    tables[1] = TableConfig(name="t1", dim=D, optimizer=OPTIMIZERS[3])  # wider records: own group
    tables[2] = TableConfig(name="t2", dim=D, optimizer={"type": "rowwise_adagrad", "lr": 0.3})
    fast, ref = _pair(tables, _features("sum"))
    rng = torch.Generator().manual_seed(2)
    proj = torch.randn(D + 1, generator=rng)
    for i in range(4):
        sf = _batch(rng, weighted=i % 2 == 1)
        _step(fast, sf, proj), _step(ref, sf, proj)
    _assert_tables_equal(fast, ref)


def test_tables_whose_features_miss_the_loss_are_not_updated():
    fast, ref = _pair(_tables(OPTIMIZERS[3]), _features("sum"))
    rng = torch.Generator().manual_seed(3)
    proj = torch.randn(D + 1, generator=rng)
    for use in [{"a"}, {"b", "d"}, {"c", "e"}, set()]:
        sf = _batch(rng)
        _step(fast, sf, proj, use), _step(ref, sf, proj, use)
    _assert_tables_equal(fast, ref)
    assert [ref.tables[f"t{i}"].step for i in range(4)] == [2, 1, 1, 1]


def test_min_count_and_ttl_tables_match():
    fast, ref = _pair(_tables(OPTIMIZERS[1], min_count=2, ttl_steps=2), _features("sum"))
    rng = torch.Generator().manual_seed(4)
    proj = torch.randn(D + 1, generator=rng)
    for _ in range(6):
        sf = _batch(rng)
        _step(fast, sf, proj), _step(ref, sf, proj)
    _assert_tables_equal(fast, ref)


def test_eval_mode_outputs_match():
    fast, ref = _pair(_tables(OPTIMIZERS[0]), _features("mean"))
    fast.eval(), ref.eval()
    sf = _batch(torch.Generator().manual_seed(5))
    with torch.no_grad():
        of, orf = fast(sf), ref(sf)
    for k in orf:
        torch.testing.assert_close(of[k], orf[k], rtol=0, atol=0)
