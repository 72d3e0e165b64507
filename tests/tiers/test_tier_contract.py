"""One contract suite every Tier implementation passes (get/put/remove/evict/items/len)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.errors import CapacityError
from ember.tiers import CachedTier, DeviceTier, DiskTier, HostTier
from ember.testing import read

R = 5


def _host(tmp):
    return HostTier(R, initial_rows=4)


def _host_bounded(tmp):
    return HostTier(R, capacity=4096, initial_rows=4, policy="lfu")


def _device(tmp):
    return DeviceTier(R, capacity=4096, policy="lru")


def _disk(tmp):
    return DiskTier(tmp / "disk", R, rows=16)  # tiny: forces the file to grow


def _cached_lru(tmp):
    return CachedTier(HostTier(R, capacity=8, policy="lru"), HostTier(R), admit_after=1)


def _cached_lfu_disk(tmp):
    return CachedTier(DeviceTier(R, capacity=8, policy="lfu"), DiskTier(tmp / "d", R, rows=16), admit_after=2)


def _three_levels(tmp):
    host = CachedTier(HostTier(R, capacity=24, policy="lfu"), DiskTier(tmp / "d3", R, rows=16), admit_after=1)
    return CachedTier(DeviceTier(R, capacity=6, policy="lru"), host, admit_after=2)


FACTORIES = {
    "host": _host,
    "host_bounded": _host_bounded,
    "device": _device,
    "disk": _disk,
    "cached_lru": _cached_lru,
    "cached_lfu_disk": _cached_lfu_disk,
    "three_levels": _three_levels,
}


@pytest.fixture(params=list(FACTORIES))
def tier(request, tmp_path):
    return FACTORIES[request.param](tmp_path)


def _rec(ids: torch.Tensor, version: int) -> torch.Tensor:
    return ids.to(torch.float32).unsqueeze(1) * 10 + torch.arange(R) + version * 1000


def _as_dict(tier) -> dict[int, torch.Tensor]:
    out: dict[int, torch.Tensor] = {}
    for ids, rec in tier.items(chunk_rows=7):
        for i, r in zip(ids.tolist(), rec.cpu()):
            assert i not in out, f"items() yielded ID {i} twice"
            out[i] = r
    return out


def test_put_get_overwrite(tier):
    ids = torch.tensor([3, -7, 2**62, 0])
    tier.put(ids, _rec(ids, 0))
    assert len(tier) == 4
    rows, found = read(tier, torch.tensor([-7, 5, 2**62]))
    assert found.tolist() == [True, False, True]
    assert torch.equal(rows.cpu()[[0, 2]], _rec(torch.tensor([-7, 2**62]), 0))
    tier.put(torch.tensor([0, 3]), _rec(torch.tensor([0, 3]), 1))
    rows, found = read(tier, ids)
    assert bool(found.all()) and len(tier) == 4
    assert torch.equal(rows.cpu()[[0, 3]], _rec(torch.tensor([3, 0]), 1))
    assert torch.equal(rows.cpu()[1], _rec(torch.tensor([-7]), 0)[0])
    assert tier.contains(torch.tensor([3, 4])).tolist() == [True, False]


def test_remove_and_evict(tier):
    ids = torch.arange(100, 140)
    tier.put(ids, _rec(ids, 0))
    found = tier.remove(torch.tensor([100, 101, 999]))
    assert found.tolist() == [True, True, False]
    assert len(tier) == 38
    assert not bool(read(tier, torch.tensor([100, 101]))[1].any())
    ev_ids, ev_rows = tier.evict(5)
    assert ev_ids.numel() == 5 and len(tier) == 33
    assert torch.equal(ev_rows.cpu(), _rec(ev_ids, 0))
    assert not bool(read(tier, ev_ids)[1].any())
    left = _as_dict(tier)
    assert set(left) == set(range(102, 140)) - set(ev_ids.tolist())


def test_items_exactly_once_newest(tier):
    ids = torch.arange(0, 64)
    tier.put(ids, _rec(ids, 0))
    for v in range(1, 4):  # accesses move rows between tiers; writes must land on the newest copy
        sub = ids[v::3]
        read(tier, sub)
        tier.put(sub, _rec(sub, v))
    got = _as_dict(tier)
    assert sorted(got) == list(range(64))
    for i in range(64):
        v = max([0] + [w for w in range(1, 4) if i >= w and (i - w) % 3 == 0])
        assert torch.equal(got[i], _rec(torch.tensor([i]), v)[0]), i


def test_random_ops_match_dict_reference(tier):
    rng = np.random.default_rng(0)
    ref: dict[int, torch.Tensor] = {}
    universe = np.concatenate([np.arange(200), rng.integers(-(2**62), 2**62, 50)])
    for step in range(250):
        op = rng.choice(["get", "put", "put", "remove", "evict"], p=[0.35, 0.25, 0.25, 0.1, 0.05])
        ids = torch.from_numpy(np.unique(rng.choice(universe, size=int(rng.integers(1, 40)))))
        if op == "get":
            rows, found = read(tier, ids)
            assert found.tolist() == [i in ref for i in ids.tolist()]
            for k, i in enumerate(ids.tolist()):
                if i in ref:
                    assert torch.equal(rows[k].cpu(), ref[i]), (step, i)
        elif op == "put":
            rec = torch.from_numpy(rng.standard_normal((ids.numel(), R)).astype(np.float32))
            tier.put(ids, rec)
            ref.update({i: rec[k] for k, i in enumerate(ids.tolist())})
        elif op == "remove":
            found = tier.remove(ids)
            assert found.tolist() == [i in ref for i in ids.tolist()]
            for i in ids.tolist():
                ref.pop(i, None)
        else:
            ev_ids, ev_rows = tier.evict(int(rng.integers(0, 6)))
            for k, i in enumerate(ev_ids.tolist()):
                assert torch.equal(ev_rows[k].cpu(), ref.pop(i))
        assert len(tier) == len(ref), step
    got = _as_dict(tier)
    assert got.keys() == ref.keys()
    for i in ref:
        assert torch.equal(got[i], ref[i])


def test_stats_count_what_happened(tier):
    ids = torch.arange(10)
    tier.put(ids, _rec(ids, 0))
    tier.reset_step_stats()
    read(tier, torch.arange(5, 15))  # 5 held, 5 absent
    stats = tier.stats()
    assert all(k.startswith("tier.") and isinstance(v, float) for k, v in stats.items())
    chain = _chain(tier)
    assert stats[f"tier.{chain[0].name}.requests"] == 10.0  # the first tier sees every read
    assert sum(t.hits for t in chain) == 5 and len(tier) == 10  # each ID lives in exactly one tier
    if tier.device.type == "cpu":  # the device tiers default to a GPU where there is one
        assert all(v == 0 for k, v in stats.items() if k.endswith(".transfer_bytes"))  # all on the CPU
    tier.reset_step_stats()
    assert all(v == 0 for k, v in tier.stats().items() if k.endswith((".requests", ".hits", ".inserts")))
    tier.flush()


def _chain(tier) -> list:
    """The leaf tiers of a chain, fastest first."""
    return _chain(tier.fast) + _chain(tier.slow) if hasattr(tier, "fast") else [tier]


def test_bounded_memory_tier_refuses_overflow():
    t = DeviceTier(R, capacity=3, device="cpu")
    t.put(torch.arange(3), _rec(torch.arange(3), 0))
    with pytest.raises(CapacityError, match="capacity of 3"):
        t.put(torch.tensor([7]), _rec(torch.tensor([7]), 0))


def test_policies_pick_victims():
    lru = HostTier(R, capacity=8, policy="lru")
    lfu = HostTier(R, capacity=8, policy="lfu")
    for t in (lru, lfu):
        t.put(torch.arange(4), _rec(torch.arange(4), 0))
        for _ in range(3):
            read(t, torch.tensor([0]))  # 0: frequent but old
        read(t, torch.tensor([1, 2]))
        read(t, torch.tensor([3]))
    assert lru.evict(1)[0].tolist() == [0]  # least recently used
    victims = lfu.evict(3)[0].tolist()  # fewest uses, ties by age: 1 and 2 (2 uses, older), then 3
    assert sorted(victims[:2]) == [1, 2] and victims[2] == 3


def test_count_min_sketch_saturates_instead_of_wrapping():
    from ember.tiers.policy import CountMinSketch

    s = CountMinSketch(width=64)
    s.add(np.array([3]), 65_000)
    s.add(np.array([3, 3, 4]), np.array([400, 400, 1]))  # would wrap a uint16 counter
    assert s.estimate(np.array([3])).tolist() == [65_535]
    assert s.estimate(np.array([4])).tolist()[0] >= 1  # never under-counts
    s.halve()
    assert s.estimate(np.array([3])).tolist() == [32_767]
