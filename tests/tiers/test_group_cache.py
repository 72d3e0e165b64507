"""GroupCache: a table group's one device cache keeps the chain exclusive and the rows exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.batch import SparseFeatures
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig

F = 5


def _collection(storage: dict | None) -> EmbeddingCollection:
    extra = {} if storage is None else {"storage": storage}
    tables = [TableConfig(name=f"t{i}", dim=4, optimizer={"type": "sgd", "lr": 0.1}, **extra) for i in range(F)]
    return EmbeddingCollection(tables, [FeatureConfig(name=f"f{i}", table=f"t{i}") for i in range(F)])


def test_admitted_rows_leave_their_own_tables_slower_tier():
    # admission ranks misses by frequency, across tables: each admitted row must still leave
    # (and enter) its own table (a mix-up left rows in two tiers and dropped rows of others)
    cached = _collection({"device_rows": 30, "device": "cpu", "admit_after": 1})
    plain = _collection(None)
    opts = SparseOptimizer(cached), SparseOptimizer(plain)
    rng = np.random.default_rng(0)
    for _ in range(30):
        ids = torch.from_numpy(np.minimum(rng.zipf(1.2, F * 64), 300))
        sf = SparseFeatures([f"f{i}" for i in range(F)], ids, torch.ones(F * 64, dtype=torch.int64))
        for ec, opt in zip((cached, plain), opts):
            sum(v.sum() for v in ec(sf).values()).backward()
            opt.step()
    for name, t in cached.tables.items():
        got = {int(i): r for ids, rec in t.items() for i, r in zip(ids, rec)}
        want = {int(i): r for ids, rec in plain.tables[name].items() for i, r in zip(ids, rec)}
        assert sum(ids.numel() for ids, _ in t.items()) == len(got) == len(t)  # each ID once
        assert got.keys() == want.keys()
        assert all(torch.equal(got[i], want[i]) for i in want)
    assert sum(t.tier.arena_rows for t in cached.tables.values()) > 0


def test_a_lookup_dropped_without_write_back_gives_its_slots_back():
    import gc

    ec = _collection({"device_rows": 40, "device": "cpu", "admit_after": 1})
    sf = SparseFeatures([f"f{i}" for i in range(F)], torch.arange(F * 8) % 11, torch.ones(F * 8, dtype=torch.int64))
    sum(v.sum() for v in ec(sf).values()).backward()
    SparseOptimizer(ec).step()  # rows admitted
    cache = ec.groups[0].cache
    lk = ec.groups[0].plan(sf, True)
    lk.fetch()  # holds every row of the batch (all hits now)
    assert cache.held.sum() > 0
    del lk
    gc.collect()
    ec.groups[0].plan(sf, False).fetch()  # the next fetch adopts the orphaned slots
    assert cache.held.sum() == 0 and not cache.orphans


def test_overlaps_finds_a_shared_id_of_the_same_table_only():
    """drain's question (does a pending copy hold an ID a fetch needs?), answered for all tables
    in one search: a shared ID of one table is found; the same ID in two tables is not a match."""
    from ember.tiers.group_cache import _overlaps

    mix = (np.arange(1, 4, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
    pending = [np.array([1, 2, 3]), np.empty(0, np.int64), np.array([7])]
    assert _overlaps(pending, [np.array([9]), np.array([1]), np.array([7])], mix)
    assert _overlaps(pending, [np.array([3])], mix)  # fewer tables asked about
    assert not _overlaps(pending, [np.array([9]), np.array([1, 2, 3]), np.array([8])], mix)
    assert not _overlaps(pending, [np.empty(0, np.int64)] * 3, mix)


@pytest.mark.parametrize("policy", ["lfu", "lru"])
@pytest.mark.parametrize("count_dtype", [np.int64, np.int32])
def test_victim_score_in_place_equals_the_allocating_one(policy, count_dtype):
    """The group cache's scan writes the scores into a buffer it keeps (``out``): the same
    scores as without it, for a host tier's int32 counts as for the cache's int64 ones."""
    from ember.tiers.policy import victim_score

    rng = np.random.default_rng(3)
    count = rng.integers(0, 1 << 20, 500).astype(count_dtype)
    last = rng.integers(0, 1 << 40, 500)
    out = np.full(500, -7, dtype=np.int64)
    got = victim_score(policy, last, count, out=out)
    assert got is out
    np.testing.assert_array_equal(got, victim_score(policy, last, count))


def test_the_tables_own_caches_are_gone_before_the_group_arena_is_allocated(monkeypatch):
    """A group cache replaces each table's own device cache: their arenas are freed before the
    group's is allocated (on a GPU, both at once would need twice the device memory)."""
    import gc
    import weakref

    from ember.tiers.device import DeviceTier
    from ember.tiers.group_cache import GroupCache

    made: list = []
    alive_at_group: list = []
    init, ginit = DeviceTier.__init__, GroupCache.__init__

    def tier_init(self, *a, **k):
        init(self, *a, **k)
        made.append(weakref.ref(self))

    def group_init(self, *a, **k):
        gc.collect()
        alive_at_group.append(sum(w() is not None for w in made))
        ginit(self, *a, **k)

    monkeypatch.setattr(DeviceTier, "__init__", tier_init)
    monkeypatch.setattr(GroupCache, "__init__", group_init)
    ec = _collection({"device_rows": 40, "device": "cpu", "admit_after": 1})
    assert len(made) == F and alive_at_group == [0]
    assert all(type(t.tier).__name__ == "GroupCacheView" for t in ec.tables.values())


def test_a_gpu_without_room_for_the_group_arena_is_named_before_allocating(monkeypatch):
    """The group arena is the tables' device_rows plus the spill rows: a GPU without room for
    it gets a CapacityError naming the group, sizes and what to lower, not an allocator error."""
    from ember.errors import CapacityError
    from ember.tiers.group_cache import GroupCache

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 << 20, 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    with pytest.raises(CapacityError, match=r"table group \['a', 'b'\]: its device cache needs .* GPU memory .* "
                                            r"65,536 spill rows .* 2.00 MiB is free; lower storage.device_rows"):
        GroupCache.check_room(1000, 17, torch.device("cuda"), ["a", "b"])
    GroupCache.check_room(1000, 17, torch.device("cpu"), ["a", "b"])  # host memory: the tables' own checks
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 1 << 30)
    GroupCache.check_room(1000, 17, torch.device("cuda"), ["a", "b"])  # room enough: torch's allocator holds 1 GiB unused
