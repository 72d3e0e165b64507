"""MappedRows: records in (pinned) host memory, found and moved by device operations, against a dict."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.tiers.device_budget import DeviceBudget, to_device
from ember.tiers.mapped_rows import MappedRows

CPU = torch.device("cpu")
R = 5


def _steps(seed: int, steps: int, n: int = 300, tables: int = 3):
    """Unique (ID, table) pairs per step, a quarter of them seen before (random int64 IDs over the
    whole range, small IDs shared by the tables)."""
    rng = np.random.default_rng(seed)
    seen: list[tuple[int, int]] = []
    for _ in range(steps):
        ids = rng.integers(-(2**63), 2**63 - 1, size=n, dtype=np.int64, endpoint=True)
        ids[: n // 4] = rng.integers(0, 40, size=n // 4)
        pairs = list(zip(ids.tolist(), rng.integers(0, tables, size=n).tolist()))
        if seen:
            pairs += [seen[i] for i in rng.choice(len(seen), min(len(seen), n // 4), replace=False)]
        pairs = list(dict.fromkeys(pairs))
        pairs = [pairs[i] for i in rng.permutation(len(pairs))]
        seen = list(dict.fromkeys(seen + pairs))
        yield (torch.tensor([p[0] for p in pairs], dtype=torch.int64), torch.tensor([p[1] for p in pairs], dtype=torch.int32),
               pairs, torch.from_numpy(rng.standard_normal((len(pairs), R)).astype(np.float32)))


def _train(m: MappedRows, seed: int, steps: int) -> dict[tuple[int, int], torch.Tensor]:
    """Steps of lookup + store against a dict: a stored pair reads back its last record, a new
    one is new exactly once; returns the dict."""
    ref: dict[tuple[int, int], torch.Tensor] = {}
    for keys, tags, pairs, upd in _steps(seed, steps):
        rows, new, rec = m.lookup(keys.to(m.device), tags.to(m.device))
        assert new.cpu().tolist() == [p not in ref for p in pairs]
        old = [i for i, p in enumerate(pairs) if p in ref]
        assert torch.equal(rec.cpu()[old], torch.stack([ref[pairs[i]] for i in old]) if old else rec.cpu()[:0])
        m.store(rows, upd.to(m.device))
        ref.update({p: upd[i] for i, p in enumerate(pairs)})
    return ref


@pytest.mark.parametrize("seed", [0, 1])
def test_records_read_back_as_stored_through_growth(seed: int) -> None:
    m = MappedRows(R, CPU, capacity=8)
    ref = _train(m, seed, 8)
    assert m.capacity >= len(ref) > 8 and m.index.buckets > 1  # grew, rows and index
    got = {}
    for keys, tags, rec in m.items(chunk_rows=100):
        got.update({(k, t): r for k, t, r in zip(keys.tolist(), tags.tolist(), rec)})
    assert got.keys() == ref.keys() and all(torch.equal(got[p], ref[p]) for p in ref)
    assert len(m) == len(ref)


def test_find_reads_without_inserting_and_remove_takes_out() -> None:
    m = MappedRows(R, CPU, capacity=16)
    ref = _train(m, 2, 2)
    (a, ta), (b, tb) = list(ref)[:2]
    keys, tags = torch.tensor([a, 123456789, b]), torch.tensor([ta, 0, tb])
    found, rec = m.find(keys, tags)
    assert found.tolist() == [True, (123456789, 0) in ref, True]
    assert torch.equal(rec[0], ref[(a, ta)]) and torch.equal(rec[2], ref[(b, tb)])
    n = len(m)
    m.find(torch.tensor([987654321]), torch.tensor([1]))
    assert len(m) == n
    assert m.remove(torch.tensor([a, 55555]), torch.tensor([ta, 2])).tolist() == [True, False]
    assert len(m) == n - 1 and not m.find(torch.tensor([a]), torch.tensor([ta]))[0].item()
    m.put(torch.tensor([a]), torch.tensor([ta]), torch.ones(1, R))
    assert torch.equal(m.find(torch.tensor([a]), torch.tensor([ta]))[1], torch.ones(1, R))


def test_a_step_launches_a_fixed_few_ops_and_never_syncs() -> None:
    """lookup + store of a training step: the same operation count for 64 pairs as for 4,096
    (the index's own plus one gather and one scatter), no sync, once past growth."""
    counts = []
    for n in (64, 4096):
        m = MappedRows(R, CPU, capacity=4 * n)
        steps = list(_steps(3, 3, n=n))
        for keys, tags, _, upd in steps[:2]:  # warm: past the first insert of this size
            rows, _, _ = m.lookup(keys, tags)
            m.store(rows, upd)
        keys, tags, _, upd = steps[2]
        with DeviceBudget("cpu") as b:
            b.mark(m.rows, m.index.keys, m.index.tags, m.index.rows, m.index.fill, m.index.counts)
            k, t, u = to_device(keys, CPU), to_device(tags, CPU), to_device(upd, CPU)
            b.reset()
            rows, _, _ = m.lookup(k, t)
            m.store(rows, u)
        assert b.syncs == 0, b.report()
        counts.append(b.ops)
    assert counts[0] == counts[1] <= 92, counts


def test_growth_waits_for_the_device_only_when_the_rows_could_run_out() -> None:
    m = MappedRows(R, CPU, capacity=64)
    grew = []
    for keys, tags, _, upd in _steps(4, 6, n=40):
        with DeviceBudget("cpu") as b:
            b.mark(m.rows, m.index.keys, m.index.tags, m.index.rows, m.index.fill, m.index.counts)
            before = (m.capacity, m.index.buckets)
            rows, _, _ = m.lookup(to_device(keys, CPU), to_device(tags, CPU))
        m.store(rows, upd)
        grew.append((b.syncs > 0, (m.capacity, m.index.buckets) != before))
    assert any(g for _, g in grew) and all(s == g for s, g in grew), grew


@pytest.mark.gpu
def test_the_same_records_on_a_gpu() -> None:
    """Records in pinned host memory, moved by CUDA gathers and scatters: what the CPU run stores."""
    cpu, gpu = MappedRows(R, CPU, capacity=8), MappedRows(R, "cuda", capacity=8)
    assert gpu.host.is_pinned()
    ref = _train(cpu, 5, 6)
    assert _train(gpu, 5, 6).keys() == ref.keys()
    got = {}
    for keys, tags, rec in gpu.items():
        got.update({(k, t): r for k, t, r in zip(keys.tolist(), tags.tolist(), rec)})
    assert all(torch.equal(got[p], ref[p]) for p in ref)
    keys, tags, _, upd = next(_steps(6, 1))
    rows, _, _ = gpu.lookup(keys.cuda(), tags.cuda())  # (past this size's first insert)
    keys, tags, upd = keys.cuda(), tags.cuda(), upd.cuda()  # (a blocking upload is a sync: uploaded before)
    with DeviceBudget("cuda") as b:
        rows, _, _ = gpu.lookup(keys, tags)
        gpu.store(rows, upd)
    assert b.syncs == 0, b.report()


def test_a_growth_past_the_free_memory_is_a_capacity_error(monkeypatch):
    import ember.tiers.mapped_rows as mr
    from ember.errors import CapacityError

    m = MappedRows(R, CPU, capacity=8)
    monkeypatch.setattr(mr, "mem_available", lambda: 100)  # 100 bytes free
    keys, tags, _, _ = next(_steps(7, 1, n=40))
    with pytest.raises(CapacityError, match="host memory to grow.*storage.index: auto picks.*set storage.index: host.*add a disk tier"):
        m.lookup(keys, tags)
    monkeypatch.setattr(mr, "mem_available", lambda: None)  # unknown: grows
    m.lookup(keys, tags)
    assert m.capacity >= keys.numel()


def test_a_removed_row_is_reused_only_once_no_open_lookup_can_write_it():
    m = MappedRows(R, CPU, capacity=16)
    keys, tags = torch.tensor([10, 11, 12]), torch.zeros(3, dtype=torch.int32)
    rows, _, _ = m.lookup(keys, tags)
    m.store(rows, torch.ones(3, R))
    seq = m.begin()  # a lookup holding row 1, say, until its write-back
    assert m.remove(torch.tensor([11]), torch.tensor([0])).tolist() == [True]
    new, _, _ = m.lookup(torch.tensor([99]), torch.tensor([0]))
    assert new.tolist() == [3]  # row 1 is not handed out while the lookup is open
    m.end(seq)
    again, _, _ = m.lookup(torch.tensor([98]), torch.tensor([0]))
    assert again.tolist() == [1]
    m.remove(torch.tensor([12]), torch.tensor([0]))  # no lookup open: at once
    assert m.lookup(torch.tensor([97]), torch.tensor([0]))[0].tolist() == [2]
    seq = m.begin()
    m.remove(torch.tensor([10]), torch.tensor([0]))
    m.end_later(seq)  # dropped without an end: adopted at the next call
    m.remove(torch.tensor([55]), torch.tensor([0]))  # (an absent pair: nothing to reuse)
    assert m.lookup(torch.tensor([96]), torch.tensor([0]))[0].tolist() == [0]


def test_an_allocation_that_fails_is_a_capacity_error(monkeypatch):
    from ember.errors import CapacityError

    m = MappedRows(R, CPU, capacity=8)

    def refuse(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(torch, "empty", refuse)
    with pytest.raises(CapacityError, match="could not allocate.*storage.index: host"):
        m._alloc(1 << 20)
