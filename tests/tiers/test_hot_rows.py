"""The device index's hot rows (``ember.tiers.hot_rows``): copies of the records read most in
device memory. Checked against the host rows alone: every read returns what was last written,
wherever the record lives; the hot set is the records read most; a step with them stays within
issue 25's budgets (no sync, a fixed few operations)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.tiers.hot_rows import HotRows
from ember.tiers.mapped_rows import MappedRows


def test_reads_return_the_last_write_wherever_the_record_lives():
    """Random gathers, scatters, counts, rebalances, flushes and a growth against one plain table."""
    rng = np.random.default_rng(0)
    n, width = 40, 3
    host = torch.randn(n + 1, width)  # records 0..n-1, the scratch row n
    ref = host[:n].clone()
    hot = HotRows(8, width, n + 1, "cpu", every=3)
    for step in range(200):
        rows = torch.from_numpy(rng.choice(n, size=int(rng.integers(1, 12)), replace=False))
        assert torch.equal(hot.gather(host, rows, n), ref[rows]), step
        hot.count(rows)
        new = torch.randn(rows.numel(), width)
        hot.scatter(host, rows, new, n)
        ref[rows] = new
        if hot.due():
            hot.rebalance(host, n)
            assert torch.equal(hot.gather(host, torch.arange(n), n), ref), step
        if step == 120:  # the host rows grow (the old scratch row becomes a record)
            grown = torch.randn(2 * n + 1, width)
            grown[:n] = host[:n]
            hot.grow(2 * n + 1)
            host = grown
            ref = torch.cat([ref, grown[n:2 * n]])
            n *= 2
    assert hot.rebalances > 10 and bool((hot.held >= 0).any())
    hot.flush(host, n)
    assert torch.equal(host[:n], ref)


def test_the_hot_set_is_the_records_read_most_and_recent_reads_weigh_more():
    host = torch.arange(20.0).view(10, 2)  # records 0..8, scratch 9
    hot = HotRows(3, 2, 10, "cpu")
    for rows, times in (([1, 2, 3, 4], 1), ([5], 6), ([6], 4), ([7], 2), ([9], 50)):  # (9: the scratch row, padding)
        for _ in range(times):
            hot.count(torch.tensor(rows))
    hot.rebalance(host, 9)
    assert sorted(hot.held.tolist()) == [5, 6, 7]
    assert hot.slot.tolist() == [-1, -1, -1, -1, -1, 0, 1, 2, -1, -1]
    assert hot.counts[5:8].tolist() == [3, 2, 1]  # (halved)
    for _ in range(5):  # reads since weigh as much as twice as many before
        hot.count(torch.tensor([1]))
    hot.rebalance(host, 9)
    assert sorted(hot.held.tolist()) == [1, 5, 6]
    assert torch.equal(hot.arena[:3], host[hot.held])  # (loaded from home)


def test_the_hit_rate_counts_training_reads_of_hot_rows_and_not_the_padding():
    host = torch.zeros(10, 2)  # records 0..8, scratch 9
    hot = HotRows(2, 2, 10, "cpu")
    hot.count(torch.tensor([3, 4, 9]), 9)  # (nothing hot yet; the scratch row is the padding's)
    hot.count(torch.tensor([3]), 9)
    assert hot.hit_reads() == (0, 3)
    hot.rebalance(host, 9)  # 3 and 4 hot
    hot.count(torch.tensor([3, 5, 4, 9, 9]), 9)
    assert hot.hit_reads() == (2, 6)


def test_the_hit_counts_are_downloaded_once_per_count(monkeypatch):
    """A log record asks every table of a group for the hit rate of the hot rows they share: the
    counters come from the device once after a training read, not once per table."""
    hot = HotRows(2, 2, 10, "cpu")
    hot.count(torch.tensor([3, 4]), 9)
    downloads = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: downloads.append(t is hot.reads) or real(t))
    assert [hot.hit_reads() for _ in range(26)] == [(0, 2)] * 26 and downloads == [True]
    hot.count(torch.tensor([5]), 9)
    assert hot.hit_reads() == (0, 3) and downloads == [True, True]


def test_records_never_read_take_no_slot():
    host = torch.zeros(6, 2)
    hot = HotRows(4, 2, 6, "cpu")
    hot.count(torch.tensor([2]))
    hot.rebalance(host, 5)
    assert hot.held.tolist().count(-1) == 3 and 2 in hot.held.tolist()
    assert (hot.slot >= 0).sum() == 1


@pytest.mark.parametrize("hot_rows", [0, 16])
def test_mapped_rows_with_hot_rows_hold_what_they_hold_without(hot_rows):
    """The same lookups, stores, removals, finds and a growth with and without hot rows: the same
    records found and stored, every step (and ``items`` reads the hot rows' newest values)."""
    rng = np.random.default_rng(1)
    plain, hot = MappedRows(4, "cpu", capacity=32), MappedRows(4, "cpu", capacity=32, hot_rows=hot_rows)
    for step in range(60):
        keys = torch.from_numpy(rng.choice(150, size=20, replace=False)).to(torch.int64)
        tags = torch.from_numpy(rng.integers(0, 2, 20)).to(torch.int32)
        out = []
        for m in (plain, hot):
            m.prepare(20, training=True)
            rows, new = m.index.insert(keys, tags)
            m.inserted(20)
            m.read_by_training(rows)
            rec = torch.where(new.unsqueeze(1), 0.0, m.gather(rows)) + step
            m.scatter(rows, rec)
            out.append(rec)
            if step % 7 == 3:
                m.remove(keys[:3], tags[:3])
        assert torch.equal(out[0], out[1]), step
        f0, r0 = plain.find(keys, tags)
        f1, r1 = hot.find(keys, tags)
        assert torch.equal(f0, f1) and torch.equal(r0[f0], r1[f1]), step
    assert plain.generation > 0  # (grew past its 32 rows)
    if hot_rows:
        assert hot.hot is not None and hot.hot.rebalances > 2 and bool((hot.hot.held >= 0).any())

    def items(m):
        k, t, r = (torch.cat(x) for x in zip(*m.items()))
        o = torch.argsort(k * 2 + t)
        return k[o], t[o], r[o]

    for a, b in zip(items(plain), items(hot)):
        assert torch.equal(a, b)


def test_a_step_with_hot_rows_launches_within_the_budget(monkeypatch):
    """Issue 25's budget with hot rows (the fetch and the write-back each one graph on a GPU): a
    steady step of a 26-table group at most 25 operations and no sync, as without them; choosing
    the hot rows again (every 64 steps) a fixed few operations, no sync either."""
    from ember import _native
    from ember.batch import SparseFeatures
    from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig, mapped_fetch
    from ember.testing import group_step
    from ember.tiers.device_budget import DeviceBudget

    monkeypatch.setattr(_native, "_core", None)  # (the torch paths a GPU takes)
    monkeypatch.setattr(mapped_fetch, "PAD_ON_CPU", True)
    monkeypatch.setattr(mapped_fetch, "COUNT_AS_GRAPHS", True)
    names = [f"C{i}" for i in range(26)]
    storage = {"index": "device", "device": "cpu", "device_rows": 500}
    ec = EmbeddingCollection([TableConfig(name=n, dim=16, optimizer={"type": "rowwise_adagrad", "lr": 0.05}, storage=storage)
                              for n in names], [FeatureConfig(name=n) for n in names])
    (group,) = ec.groups
    hot = group.mapped.hot
    assert hot is not None and hot.capacity == 26 * 500
    rng = np.random.default_rng(0)
    cot = torch.randn(256, 16)
    counts, rebalance_ops = [], []
    real = HotRows.rebalance

    def counted(self, host_rows, scratch):  # (a rebalance's operations apart from the step's)
        with DeviceBudget("cpu") as rb:
            rb.mark(host_rows, *self.tensors())
            real(self, host_rows, scratch)
        assert rb.syncs == 0, rb.report()
        rebalance_ops.append(rb.ops)

    monkeypatch.setattr(HotRows, "rebalance", counted)
    for step in range(10):
        sf = SparseFeatures(names, torch.from_numpy(rng.zipf(1.2, 26 * 256) % 50_000), torch.ones(26 * 256, dtype=torch.int64))
        with DeviceBudget("cpu") as b:
            b.mark(cot)
            group_step(group, sf, cot, step)
        assert b.syncs == 0, b.report()
        counts.append((b.ops, len(rebalance_ops)))
    assert rebalance_ops and max(rebalance_ops) <= 16, rebalance_ops
    assert hot.rebalances == len(rebalance_ops) == 2 and bool((hot.held >= 0).any())  # (after fetches 2 and 2 + 4)
    steady = [ops for i, (ops, n) in enumerate(counts) if i >= 2 and n == counts[i - 1][1]]  # (steps without one)
    assert len(steady) >= 5 and max(steady) <= 25, counts
