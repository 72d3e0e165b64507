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
        slot, got = dev.count(keys, tags, want)
        dev.inserted(keys.numel())
        admitted = want & (got >= 3)
        dev.clear(slot, admitted)
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
        slot, n = c.count(keys, tags, keys % 3 == 0)
        c.clear(slot, n >= 1)
    assert b.ops > 10 and b.syncs == 0, b.sync_names  # (its operations were counted: none read back)
