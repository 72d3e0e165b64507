"""DeviceCounts: min_count's sightings on the device, against the host's IdCounter."""

from __future__ import annotations

import numpy as np
import torch

from ember.tiers.device_budget import DeviceBudget
from ember.tiers.device_counts import DeviceCounts
from ember.tiers.policy import IdCounter


def test_counts_clears_and_restores_as_the_host_counter_through_growth():
    rng = np.random.default_rng(0)
    dev, host = DeviceCounts("cpu", capacity=64), [IdCounter(), IdCounter()]
    for step in range(40):
        n = int(rng.integers(1, 300))
        keys = np.unique(rng.integers(-500, 500 + 40 * step, 2 * n))[:n]  # (more distinct pairs than the capacity)
        tags = rng.integers(0, 2, keys.size).astype(np.int32)
        keys, tags = torch.from_numpy(keys), torch.from_numpy(tags)
        want = torch.from_numpy(rng.random(keys.numel()) < 0.8)
        dev.prepare(keys.numel())
        slot, got, entry = dev.count(keys, tags, want)
        admitted = want & (got >= 3)
        dev.admit(slot, entry, admitted)
        dev.inserted(keys.numel())
        for t in (0, 1):
            mine = (tags == t) & want
            want_counts = host[t].add(keys[mine].numpy())
            assert np.array_equal(got[mine].numpy(), want_counts)
            host[t].remove(keys[(tags == t) & admitted].numpy())
        if step % 10 == 9:  # a checkpoint's restore: removed (a row from elsewhere), then added back
            k = keys[:5]
            dev.remove(k, tags[:5])
            for t in (0, 1):
                host[t].remove(k[tags[:5] == t].numpy())
        assert len(dev) == len(host[0]) + len(host[1])  # admitted and removed pairs left, as the host's
    assert dev.scratch > 64  # (it grew)
    for t in (0, 1):
        ids, counts = host[t].items()
        live = counts > 0
        got_ids, got_counts = dev.items(t)
        assert np.array_equal(got_ids, ids[live]) and np.array_equal(got_counts, counts[live])
        probe = torch.from_numpy(np.concatenate([ids[:50], [10**9]]))
        assert np.array_equal(dev.get(probe, torch.full_like(probe, t, dtype=torch.int32)).numpy(), host[t].get(probe.numpy()))
    assert dev.table_counts(2).tolist() == [int((host[t].items()[1] > 0).sum()) for t in (0, 1)]
    fresh = DeviceCounts("cpu")
    for t in (0, 1):
        ids, counts = dev.items(t)
        fresh.add(torch.from_numpy(ids), torch.full((ids.size,), t, dtype=torch.int32), torch.from_numpy(counts))
        assert all(np.array_equal(x, y) for x, y in zip(fresh.items(t), dev.items(t)))


def test_a_count_is_device_work_alone():
    c = DeviceCounts("cpu")
    keys, tags = torch.arange(4096), torch.zeros(4096, dtype=torch.int32)
    c.prepare(4096)
    with DeviceBudget("cpu") as b:
        b.mark(*c.device_tensors(), keys, tags)
        slot, n, entry = c.count(keys, tags, keys % 3 == 0)
        c.admit(slot, entry, (n >= 1) & (keys % 2 == 0))
    assert b.ops > 10 and b.syncs == 0, b.sync_names  # (its operations were counted: none read back)


def test_admitted_pairs_leave_and_their_room_is_reused():
    """A stream of new pairs, each admitted at its second sighting: the counts hold only the
    pairs still counting, so neither the counts nor the index's buckets grow with the pairs
    ever seen (they once kept an entry per pair ever counted), and a pair that comes back after
    its admission counts from zero."""
    c = DeviceCounts("cpu", capacity=1024)
    zero = torch.zeros(500, dtype=torch.int32)
    for step in range(60):  # 60 x 500 distinct pairs, 30 x the capacity
        keys = torch.arange(step * 250, step * 250 + 500)  # half seen the step before, half new
        c.prepare(500)
        slot, n, entry = c.count(keys, zero, None)
        assert n.tolist() == [2] * 250 * (step > 0) + [1] * (500 - 250 * (step > 0))
        c.admit(slot, entry, n >= 2)
        c.inserted(500)
        assert len(c) == 500  # the 250 new ones, and 0..249 (seen once, at step 0)
        if step == 5:  # sized for 500 pairs counting (and a rehash's headroom)
            buckets, scratch = c.index.buckets, c.scratch
    assert c.index.buckets == buckets <= 128 and c.scratch == scratch <= 2048
    back = torch.arange(250, 260)  # admitted at step 1: counted from zero
    c.prepare(10)
    slot, n, entry = c.count(back, zero[:10], None)
    assert n.tolist() == [1] * 10
