"""Pooling modes against a plain per-sample reference; gradients reach the tables' rows."""

from __future__ import annotations

import math

import pytest
import torch

from ember.batch import SparseFeatures
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig
from ember.testing import rows as stored_rows

D = 3


def _batch(weighted: bool):
    # feature a: [[1, 2, 2], [], [5]]; feature b: [[9], [1, 7], [7, 7, 7, 9]]
    values = torch.tensor([1, 2, 2, 5, 9, 1, 7, 7, 7, 7, 9])
    lengths = torch.tensor([3, 0, 1, 1, 2, 4])
    weights = torch.tensor([0.5, 2.0, 1.0, 3.0, 1.5, 0.2, 1.0, 2.0, 0.5, 0.5, 4.0]) if weighted else None
    return SparseFeatures(["a", "b"], values, lengths, weights)


def _reference(ec, sf, name, pooling):
    jf = sf[name]
    rows = []
    for b in range(sf.batch_size):
        s, e = int(jf.offsets[b]), int(jf.offsets[b + 1])
        ids = jf.values[s:e]
        w = jf.weights[s:e] if jf.weights is not None else torch.ones(e - s)
        emb = stored_rows(ec.tables["shared"], torch.unique(ids))[:, :D] if e > s else torch.zeros(0, D)
        if e > s:
            uniq = torch.unique(ids)
            emb = emb[torch.searchsorted(uniq, ids)]
        acc = (emb * w.unsqueeze(1)).sum(0) if e > s else torch.zeros(D)
        if pooling == "mean" and e > s:
            acc = acc / w.abs().sum()
        if pooling == "sqrtn" and e > s:
            acc = acc / math.sqrt(float((w * w).sum()))
        rows.append(acc)
    return torch.stack(rows)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("pooling", ["sum", "mean", "sqrtn"])
def test_pooling_matches_reference(pooling, weighted):
    ec = EmbeddingCollection(
        [TableConfig(name="shared", dim=D)],
        [FeatureConfig(name="a", table="shared", pooling=pooling), FeatureConfig(name="b", table="shared", pooling=pooling)],
    )
    sf = _batch(weighted)
    out = ec(sf)
    for name in ["a", "b"]:
        torch.testing.assert_close(out[name], _reference(ec, sf, name, pooling), rtol=1e-5, atol=1e-6)


def test_sequence_lookup_is_padded_with_mask():
    ec = EmbeddingCollection(
        [TableConfig(name="shared", dim=D)],
        [FeatureConfig(name="a", table="shared", pooling="sequence", max_length=2), FeatureConfig(name="b", table="shared")],
    )
    sf = _batch(False)
    seq = ec(sf)["a"]
    assert seq.values.shape == (3, 2, D)
    assert seq.mask.tolist() == [[True, True], [False, False], [True, False]]
    stored = stored_rows(ec.tables["shared"], torch.tensor([1, 2, 5]))[:, :D]
    torch.testing.assert_close(seq.values[0], stored[:2])
    torch.testing.assert_close(seq.values[2, 0], stored[2])
    assert seq.values[1].abs().sum() == 0 and seq.values[2, 1].abs().sum() == 0


def test_shared_table_gradients_sum_over_features_and_update_once():
    ec = EmbeddingCollection(
        [TableConfig(name="shared", dim=D, optimizer={"type": "sgd", "lr": 1.0})],
        [FeatureConfig(name="a", table="shared"), FeatureConfig(name="b", table="shared")],
    )
    sf = _batch(False)
    before = stored_rows(ec.tables["shared"], torch.tensor([1, 2, 5, 7, 9]))[:, :D].clone()
    out = ec(sf)
    (out["a"].sum() + out["b"].sum()).backward()
    SparseOptimizer(ec).step()
    after = stored_rows(ec.tables["shared"], torch.tensor([1, 2, 5, 7, 9]))[:, :D]
    counts = torch.tensor([2.0, 2.0, 1.0, 4.0, 2.0]).unsqueeze(1)  # occurrences over both features
    torch.testing.assert_close(after, before - counts)


def test_new_ids_get_rows_and_no_two_ids_share_one():
    ec = EmbeddingCollection([TableConfig(name="t", dim=8)], [FeatureConfig(name="f", table="t")])
    ids = torch.randint(-(2**62), 2**62, (5000,))
    sf = SparseFeatures(["f"], ids, torch.ones(5000, dtype=torch.int64))
    out = ec(sf)["f"]
    assert len(ec.tables["t"]) == 0  # a row is stored on its first update, so eval never grows a table
    out.sum().backward()
    SparseOptimizer(ec).step()
    assert len(ec.tables["t"]) == torch.unique(ids).numel()
    distinct = torch.unique(out, dim=0).shape[0]
    assert distinct == torch.unique(ids).numel()


def test_eval_mode_records_no_gradients():
    ec = EmbeddingCollection([TableConfig(name="t", dim=2)], [FeatureConfig(name="f", table="t")])
    ec.eval()
    out = ec(SparseFeatures(["f"], torch.tensor([1]), torch.tensor([1])))
    assert not out["f"].requires_grad
    with pytest.raises(RuntimeError, match="no training forward"):
        SparseOptimizer(ec).step()


def test_undefined_table_is_a_clear_error():
    with pytest.raises(ValueError, match="uses table 'nope'"):
        EmbeddingCollection([TableConfig(name="t", dim=2)], [FeatureConfig(name="f", table="nope")])


def _one_table(features=None):
    return EmbeddingCollection([TableConfig(name="t", dim=4)], features or [FeatureConfig(name="u", table="t")], seed=0)


def test_a_lookup_pools_only_the_batch_it_was_planned_for():
    ec = _one_table()
    lk = ec.plan(SparseFeatures(["u"], torch.tensor([1, 2]), torch.tensor([1, 1]))).fetch()
    with pytest.raises(ValueError, match=r"planned for a batch of 2 with keys \['u'\], not for this one \(3, \['u'\]\)"):
        ec(SparseFeatures(["u"], torch.tensor([7, 8, 9]), torch.tensor([1, 1, 1])), lk)


def test_feature_names_are_unique():
    with pytest.raises(ValueError, match=r"feature names must be unique; \['u'\] given more than once"):
        _one_table([FeatureConfig(name="u", table="t"), FeatureConfig(name="u", table="t", pooling="mean")])


def test_state_dict_says_it_holds_no_rows_and_loading_one_restores_none():
    trained, fresh = _one_table(), _one_table()
    opt, sf = SparseOptimizer(trained), SparseFeatures(["u"], torch.tensor([1]), torch.tensor([1]))
    for _ in range(3):
        trained(sf)["u"].sum().backward()
        opt.step()
    with pytest.warns(UserWarning, match="rows are not part of state_dict"):
        state = torch.nn.ModuleDict({"ec": trained}).state_dict()  # also inside a user's model
    with pytest.warns(UserWarning, match="rows here are unchanged by load_state_dict"):
        torch.nn.ModuleDict({"ec": fresh}).load_state_dict(state)
    trained.eval(), fresh.eval()
    assert not torch.equal(trained(sf)["u"], fresh(sf)["u"])  # (what the warning is about)
