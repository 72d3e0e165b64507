"""``GroupLookup.of_ids``: a lookup of given IDs per table (what an owner rank builds from the IDs
every rank sent it) dedupes per table, maps every given ID to its row, and trains like a planned one."""

from __future__ import annotations

import pytest
import torch

from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig
from ember.embedding.group import GroupLookup
from ember.testing import rows


def _ec() -> EmbeddingCollection:
    tables = [TableConfig(name=n, dim=2, optimizer={"type": "sgd", "lr": 1.0}) for n in ("a", "b")]
    return EmbeddingCollection(tables, [FeatureConfig(name="fa", table="a"), FeatureConfig(name="fb", table="b")])


def test_dedupes_per_table_and_maps_every_id():
    ec = _ec()
    group = ec.groups[0]
    given = [torch.tensor([5, 3, 5, 9]), torch.tensor([5, 5])]  # ID 5 in both tables: two rows
    lk = GroupLookup.of_ids(group, given, train=True)
    assert lk.sizes == [3, 1]
    flat = torch.cat(given)
    owner_of = [0] * 4 + [1] * 2
    for k, (i, j) in enumerate(zip(flat.tolist(), owner_of)):
        row = int(lk.inverse[k])
        assert int(lk.ids[row]) == i and lk.starts[j] <= row < lk.starts[j + 1]
    with pytest.raises(RuntimeError, match="no features to pool"):
        lk.fetch().pool(torch.device("cpu"))
    with pytest.raises(ValueError, match="2 tables"):
        GroupLookup.of_ids(group, given[:1], train=True)


def test_backward_update_write_back_like_a_planned_lookup():
    ec = _ec()
    group = ec.groups[0]
    a, b = (ec.tables[n] for n in ("a", "b"))
    lk = GroupLookup.of_ids(group, [torch.tensor([5, 3, 5]), torch.tensor([5])], train=True).fetch()
    ids_a, ids_b = lk.table_ids
    before_a, before_b = rows(a, ids_a), rows(b, ids_b)
    grad = torch.arange(6, dtype=torch.float32).view(3, 2)  # one row per unique (table, ID)
    lk.backward(grad)
    lk.update()
    lk.write_back()
    torch.testing.assert_close(rows(a, ids_a)[:, :2], before_a[:, :2] - grad[:2])  # sgd, lr 1
    torch.testing.assert_close(rows(b, ids_b)[:, :2], before_b[:, :2] - grad[2:])
    assert sorted(ids_a.tolist()) == [3, 5] and ids_b.tolist() == [5]
    assert a.step == 1 and b.step == 1 and len(a) == 2 and len(b) == 1
