"""The fast tier is device-resident: hits are gathered, pooled and updated where the cache lives,
and only misses and evictions cross between host and device (counted in ``transfer_bytes``).
A miss the cache declines to admit goes back to the host after its update (a ``bypass``: an
eviction on the spot), so it counts among the evictions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.batch import SparseFeatures
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig
from ember.testing.reference import ReferenceCollection

D, B, F = 8, 256, 3


def _batches(n: int, vocab: int = 3000, seed: int = 0) -> list[SparseFeatures]:
    rng = np.random.default_rng(seed)
    keys = [f"f{i}" for i in range(F)]
    out = []
    for _ in range(n):
        raw = np.minimum(rng.zipf(1.2, size=F * B), vocab)
        out.append(SparseFeatures(keys, torch.from_numpy(raw * 7919 + 3), torch.ones(F * B, dtype=torch.int64)))
    return out


def _tables(device: str, policy: str = "lfu") -> list[TableConfig]:
    storage = {"device_rows": 400, "device": device, "admit_after": 1, "policy": policy}
    return [TableConfig(name=f"t{i}", dim=D, optimizer={"type": "rowwise_adagrad", "lr": 0.1}, storage=storage) for i in range(F)]


def _train(device: str, batches: list[SparseFeatures], policy: str = "lfu"):
    feats = [FeatureConfig(name=f"f{i}", table=f"t{i}") for i in range(F)]
    ec = EmbeddingCollection(_tables(device, policy), feats).to(device)
    opt = SparseOptimizer(ec)
    moved = expected = 0.0
    for sf in batches:
        out = ec(sf.to(device))
        sum((o * torch.arange(1, D + 1, device=device)).square().sum() for o in out.values()).backward()
        opt.step()
        for t in ec.tables.values():
            s = t.stats()
            misses = s["tier.device.requests"] - s["tier.device.hits"]
            evictions = s["tier.device.demotions"] + s["tier.device.bypasses"]
            moved += s["transfer_bytes"]
            expected += (misses + evictions) * 4 * t.config.stored_dim
            t.reset_step_stats()
    return ec, moved, expected


def test_on_cpu_no_bytes_cross():
    ec, moved, expected = _train("cpu", _batches(6))
    assert expected > 0  # the cache did miss and evict...
    assert moved == 0  # ...but host and cache are one memory


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["lfu", "lru"])
def test_gpu_cache_moves_only_misses_and_evictions(policy):
    batches = _batches(12)
    ec, moved, expected = _train("cuda", batches, policy)
    tier = ec.tables["t0"].tier
    assert tier.cache.arena.is_cuda and tier.arena_rows > 0 and len(tier.slow) > 0  # one group cache
    assert 0 < moved <= 1.1 * expected, (moved, expected)
    # and the rows equal the per-table reference trained on the CPU
    feats = [FeatureConfig(name=f"f{i}", table=f"t{i}") for i in range(F)]
    ref = ReferenceCollection(_tables("cpu", policy), feats)
    for sf in batches:
        out = ref.forward(sf)
        sum((o * torch.arange(1, D + 1)).square().sum() for o in out.values()).backward()
        ref.step()
    for name, t in ec.tables.items():
        a = sorted((int(i), r) for ids, rec in t.items() for i, r in zip(ids, rec))
        b = sorted((int(i), r) for ids, rec in ref.tables[name].items() for i, r in zip(ids, rec))
        assert [i for i, _ in a] == [i for i, _ in b]
        torch.testing.assert_close(torch.stack([r for _, r in a]), torch.stack([r for _, r in b]), rtol=1e-4, atol=1e-5)
