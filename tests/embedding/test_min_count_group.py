"""``min_count`` tables of a group on host rows complete their reads together (one native pass of
fresh rows for every table's admitted IDs, the rest zeroed), their counters lose only the IDs
they admitted, and row-wise Adagrad's one-pass update writes the rows not held back: bit for bit
what each table's own ``EmbeddingTable.complete``, a removal of every written ID and the two
phases (update, then write back) give, for any optimizer, dtype and initializer mix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember.embedding.group as group_module
from ember.batch import SparseFeatures
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig

D, B = 4, 64
NAMES = ["a", "b", "c", "d"]


class _NotACounter:  # isinstance(..., IdCounter) fails for every table: the per-table reference path
    pass


def _tables(opt: dict, dtype: str) -> list[TableConfig]:
    inits = [{"type": "uniform"}, {"type": "uniform", "scale": 0.3}, {"type": "normal", "std": 0.1}, {"type": "uniform"}]
    counts = [2, 3, 1, 2]  # c: no min_count (a plain table in the same group)
    return [TableConfig(name=n, dim=D, optimizer=opt, dtype=dtype, min_count=m, initializer=i)
            for n, m, i in zip(NAMES, counts, inits)]


def _run(opt: dict, dtype: str, steps: int = 8) -> tuple[EmbeddingCollection, list]:
    ec = EmbeddingCollection(_tables(opt, dtype), [FeatureConfig(name=n) for n in NAMES], seed=3)
    assert len(ec.groups) == 1
    so = SparseOptimizer(ec)
    rng = np.random.default_rng(0)
    filtered: list = []
    for step in range(steps):
        ids = torch.from_numpy(rng.zipf(1.3, size=len(NAMES) * B).astype(np.int64) % 200)
        sf = SparseFeatures(NAMES, ids, torch.ones(ids.numel(), dtype=torch.int64))
        lk = ec.plan(sf).fetch()
        out = ec(sf, lk)
        filtered.append(({j: f.clone() for g in lk.groups for j, f in g.filtered.items()},
                         {n: o.detach().clone() for n, o in out.items()}, any(g.admitted for g in lk.groups)))
        use = NAMES if step % 3 else NAMES[:2]  # some steps leave tables c and d out of the loss
        sum((out[n] * torch.linspace(-1, 1, D)).square().sum() for n in use).backward()
        so.step()
    return ec, filtered


@pytest.mark.parametrize("opt", [{"type": "rowwise_adagrad", "lr": 0.1}, {"type": "adam", "lr": 0.01},
                                 {"type": "ftrl", "alpha": 0.1}])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_min_count_tables_complete_together_bit_for_bit(monkeypatch, opt, dtype):
    kept = []
    original = group_module.HostTier.write_segments_native

    def spied(tiers, ids, records, bf16=None, adagrad=None, skip=None):
        if skip is not None and skip.any():
            kept.append(1)
        return original(tiers, ids, records, bf16, adagrad, skip)

    with monkeypatch.context() as m:
        m.setattr(group_module.HostTier, "write_segments_native", staticmethod(spied))
        fast, fast_filtered = _run(opt, dtype)
    # the one pass over the rows not held back: row-wise Adagrad on fp32 rows, in the steps where every table reached the loss
    assert bool(kept) == (opt["type"] == "rowwise_adagrad" and dtype == "fp32")
    with monkeypatch.context() as m:
        m.setattr(group_module, "IdCounter", _NotACounter)
        m.setattr(group_module.GroupLookup, "_fused_hyper", lambda self, step: None)  # the two phases
        ref, ref_filtered = _run(opt, dtype)
    assert any(f for f, _, _ in fast_filtered) and len(fast_filtered) == len(ref_filtered)
    assert all(together for _, _, together in fast_filtered) and not any(together for _, _, together in ref_filtered)
    for (a, out_a, _), (b, out_b, _) in zip(fast_filtered, ref_filtered):  # rows held back, and what every feature pooled
        assert a.keys() == b.keys() and all(torch.equal(a[j], b[j]) for j in a)
        assert all(torch.equal(out_a[n].view(torch.int32), out_b[n].view(torch.int32)) for n in NAMES)
    for n in NAMES:
        t, r = fast.tables[n], ref.tables[n]
        (ti, tr), (ri, rr) = [torch.cat(x) for x in zip(*t.items())], [torch.cat(x) for x in zip(*r.items())]
        to, ro = torch.argsort(ti), torch.argsort(ri)
        assert torch.equal(ti[to], ri[ro]), n
        assert torch.equal(tr[to].view(torch.int32), rr[ro].view(torch.int32)), n
        assert all(torch.equal(x, y) for x, y in zip(t.admission_state(), r.admission_state())), n
        assert t.filtered_reads == r.filtered_reads and t.step == r.step, n
        if t.admission is not None:
            assert len(t.admission) == len(r.admission) > 0, n  # the counters hold the same IDs, no stale ones


def _run_ahead(opt: dict, ahead: int = 3, steps: int = 9) -> EmbeddingCollection:
    """Lookups fetched ``ahead`` batches before their update (a pipeline's staleness): a tier's
    memo of a lookup's slots is gone by its write (later fetches replaced it, their writes
    inserted IDs), so the one pass probes again."""
    ec = EmbeddingCollection(_tables(opt, "fp32"), [FeatureConfig(name=n) for n in NAMES], seed=3)
    rng = np.random.default_rng(1)
    batches = []
    for _ in range(steps):
        ids = torch.from_numpy(rng.zipf(1.3, size=len(NAMES) * B).astype(np.int64) % 200)
        batches.append(SparseFeatures(NAMES, ids, torch.ones(ids.numel(), dtype=torch.int64)))
    (group,) = ec.groups
    flight = []
    for step, sf in enumerate(batches + [None] * ahead):
        if sf is not None:
            flight.append((sf, group.plan(sf, True).fetch()))
        if len(flight) > ahead or sf is None and flight:
            sf0, lk = flight.pop(0)
            lk.backward(torch.linspace(-1, 1, lk.ids.numel() * D).reshape(-1, D))
            lk.apply(step)
    return ec


def test_the_one_pass_over_rows_not_held_back_when_lookups_run_ahead(monkeypatch):
    opt = {"type": "rowwise_adagrad", "lr": 0.1}
    fast = _run_ahead(opt)
    with monkeypatch.context() as m:
        m.setattr(group_module.GroupLookup, "_fused_hyper", lambda self, step: None)  # the two phases
        ref = _run_ahead(opt)
    for n in NAMES:
        (ti, tr), (ri, rr) = [torch.cat(x) for x in zip(*fast.tables[n].items())], [torch.cat(x) for x in zip(*ref.tables[n].items())]
        to, ro = torch.argsort(ti), torch.argsort(ri)
        assert torch.equal(ti[to], ri[ro]), n  # no ID twice in a tier, none lost
        assert torch.equal(tr[to].view(torch.int32), rr[ro].view(torch.int32)), n
        assert all(torch.equal(x, y) for x, y in zip(fast.tables[n].admission_state(), ref.tables[n].admission_state())), n
