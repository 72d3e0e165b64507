"""HostTier.get_into (one native pass straight into a caller's buffer) equals its numpy path;
reading and writing a group's segments in one pass equals each tier on its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import _native
from ember.testing import read
from ember.tiers import HostTier
from ember.tiers.segments import read_segments, write_segments


def test_native_get_into_equals_the_numpy_path(monkeypatch):
    if not _native.is_available():
        pytest.skip("native core not built")
    g = torch.Generator().manual_seed(0)
    a, b = HostTier(5, capacity=500, policy="lfu"), HostTier(5, capacity=500, policy="lfu")
    monkeypatch.setattr(a, "reads_natively_into", lambda out: False)  # a: probe + gather in torch
    ids = torch.randint(-(2**40), 2**40, (400,), generator=g).unique()
    rec = torch.randn(ids.numel(), 5, generator=g)
    for t in (a, b):
        t.put(ids, rec)
    query = torch.cat([ids[::3], torch.tensor([7, 8, 9])])  # some absent
    rows, found = read(a, query)
    out = torch.full((query.numel(), 5), -1.0)
    found2 = b.get_into(query, out)
    assert torch.equal(found, found2)
    assert torch.equal(out[found2], rows[found]) and bool((out[~found2] == -1).all())  # absent rows untouched
    assert np.array_equal(a._count, b._count) and np.array_equal(a._last, b._last)  # same policy state
    assert a.stats() == b.stats()
    # the slots it found serve the put that follows (no second probe needed, same result)
    b.put(query[found2], out[found2] * 2)
    again, _ = read(b, query[found2])
    assert torch.equal(again, rows[found] * 2)


def _state(t: HostTier) -> dict:
    """Everything a tier's reads and later evictions depend on, by ID (slots may differ)."""
    ids, slots = t._index.items()
    order = np.argsort(ids)
    ids, slots = ids[order], slots[order].astype(np.int64)
    return {
        "ids": ids.tolist(),
        "rows": t._arena[torch.from_numpy(slots)].tolist(),
        "last": t._last[slots].tolist(),
        "count": t._count[slots].tolist(),
        "slot_ids": t._ids[slots].tolist(),
        "held": bool(t._held[slots].all()),
        "len": len(t),
        "stats": t.stats(),
    }


@pytest.mark.parametrize("bounded", [False, True])
def test_many_tiers_in_one_call_equal_each_tier_on_its_own(bounded):
    """read_segments / write_segments over a group of tiers == get_into / put per tier, over steps that
    insert, grow the arenas and rehash the indexes (and, bounded, free slots to reuse)."""
    if not _native.is_available():
        pytest.skip("native core not built")
    g = torch.Generator().manual_seed(1)
    cap = 3000 if bounded else None
    many = [HostTier(4, capacity=cap, initial_rows=16) for _ in range(3)]
    each = [HostTier(4, capacity=cap, initial_rows=16) for _ in range(3)]
    if not bounded:  # nothing to check or reuse: the one native pass must serve every put
        for t in many:
            t.put = t.get_into = lambda *a, **k: pytest.fail("took the per-tier path")
    for step in range(12):
        ids = [torch.randint(0, 3000, (int(n),), generator=g).unique() for n in torch.randint(0, 400, (3,), generator=g)]
        ids[step % 3] = ids[step % 3][:0] if step == 4 else ids[step % 3]  # an empty segment too
        n = sum(i.numel() for i in ids)
        out_many, out_each = torch.full((n, 4), -1.0), torch.full((n, 4), -1.0)
        found = read_segments(many, ids, out_many)
        found_each = torch.cat([t.get_into(i, rows) for t, i, rows in zip(each, ids, out_each.split([i.numel() for i in ids]))])
        assert torch.equal(found, found_each) and torch.equal(out_many, out_each)
        new = torch.randn(n, 4, generator=g)
        write_segments(many, ids, new)
        for t, i, rows in zip(each, ids, new.split([i.numel() for i in ids])):
            t.put(i, rows)
        if bounded and step % 4 == 3:  # freed slots: write_segments must reuse them as put does
            for t_many, t_each in zip(many, each):
                gone = torch.from_numpy(t_each._index.items()[0][:50])
                t_many.remove(gone), t_each.remove(gone)
        for a, b in zip(many, each):
            assert _state(a) == _state(b)
    assert any(t._arena.shape[0] > 16 for t in many) and any(t._index.keys.size > 32 for t in many)  # grew, rehashed


def test_many_tiers_reject_a_buffer_of_the_wrong_shape():
    tiers = [HostTier(4), HostTier(4)]
    ids = [torch.tensor([1, 2]), torch.tensor([3])]
    with pytest.raises(ValueError, match=r"must be \[3, 4\]"):
        write_segments(tiers, ids, torch.zeros(3, 5))
    with pytest.raises(ValueError, match=r"must be \[3, 4\]"):
        read_segments(tiers, ids, torch.zeros(2, 4))


def test_segment_ids_made_once_read_and_write_as_separate_tensors():
    """A group's IDs split once (``SegmentIds``: sizes, bounds and the IDs back to back kept)
    read and write every tier as the same segments given as separate tensors do, growth of
    every arena included (the kept numpy view of an arena follows it)."""
    from ember.tiers.host import SegmentIds, _segments

    g = torch.Generator().manual_seed(3)
    sizes = [0, 700, 1, 300]  # an empty segment; 700 new rows outgrow a first arena of 8
    flat = torch.randperm(10**6, generator=g)[: sum(sizes)].to(torch.int64)
    made = SegmentIds.split(flat, sizes)
    loose = [t.clone() for t in made]
    assert isinstance(made, tuple) and [t.numel() for t in made] == made.sizes
    sizes_a, bounds_a, flat_a = _segments(made)
    sizes_b, bounds_b, flat_b = _segments(loose)
    assert sizes_a == sizes_b and np.array_equal(bounds_a, bounds_b) and np.array_equal(flat_a, flat_b)
    tiers = {k: [HostTier(3, initial_rows=8) for _ in sizes] for k in ("made", "loose")}
    rec = torch.randn(flat.numel(), 3, generator=g)
    write_segments(tiers["made"], made, rec)
    write_segments(tiers["loose"], loose, rec)
    for k in tiers:
        out = torch.zeros_like(rec)
        found = read_segments(tiers[k], made if k == "made" else loose, out)
        assert bool(found.all()) and torch.equal(out, rec), k
    with pytest.raises(ValueError, match="segments of 5 IDs"):
        SegmentIds.split(flat[:4], [5])
    with pytest.raises(ValueError, match="contiguous CPU int64"):
        SegmentIds.split(flat.to(torch.int32), [flat.numel()])
