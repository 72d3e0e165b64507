"""Tiered tables train exactly like all-in-memory ones; admission (min_count) and TTL behave."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.embedding import EmbeddingTable, TableConfig
from ember.errors import CapacityError
from ember.testing import apply, lookup

OPTIMIZERS = {
    "adam": {"type": "adam", "lr": 0.01},
    "rowwise_adagrad": {"type": "rowwise_adagrad", "lr": 0.1},
}


def _run(table: EmbeddingTable, steps: int = 120, batch: int = 300, a: float = 1.2, seed: int = 0) -> None:
    """Zipf-drawn IDs (hashed to spread them), deterministic per-ID gradients, lookup + apply."""
    rng = np.random.default_rng(seed)
    for step in range(steps):
        raw = rng.zipf(a, size=batch)
        raw = raw[raw < 5000]
        ids = torch.unique(torch.from_numpy(raw * 7919 - 2**40))
        lk = lookup(table, ids)
        w = lk.records[:, : table.dim]
        grads = torch.sin(w * 3 + step) + 0.01 * ids.to(torch.float32).unsqueeze(1) % 1.0
        apply(lk, grads)


def _state(table: EmbeddingTable) -> tuple[torch.Tensor, torch.Tensor]:
    chunks = list(table.items(chunk_rows=500))
    ids = torch.cat([c[0] for c in chunks])
    rec = torch.cat([c[1] for c in chunks])
    order = torch.argsort(ids)
    assert torch.unique(ids).numel() == ids.numel(), "an ID appears in two tiers"
    return ids[order], rec[order]


def _tiny_tiers(tmp_path, **extra) -> dict:
    return {
        "device_rows": 64,
        "device": "cpu",
        "host_rows": 256,
        "disk_path": str(tmp_path / "disk"),
        "disk_rows": 128,  # grows while training
        **extra,
    }


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("policy,admit", [("lfu", 2), ("lru", 1)])
def test_tiered_training_equals_in_memory(tmp_path, opt, policy, admit):
    base = dict(name="t", dim=8, optimizer=OPTIMIZERS[opt])
    ref = EmbeddingTable(TableConfig(**base))
    tiered = EmbeddingTable(
        TableConfig(**base, storage=_tiny_tiers(tmp_path, policy=policy, admit_after=admit))
    )
    _run(ref)
    _run(tiered)
    r_ids, r_rec = _state(ref)
    t_ids, t_rec = _state(tiered)
    assert len(ref) == len(tiered) > 1000  # far more rows than the 64 + 256 cached
    assert torch.equal(r_ids, t_ids)
    assert torch.equal(r_rec, t_rec)  # weights and optimizer state, bit for bit
    stats = tiered.stats()
    assert 48 <= stats["tier.device.rows"] <= 64 and 200 <= stats["tier.host.rows"] <= 256
    assert stats["tier.device.promotions"] > 0 and stats["tier.host.demotions"] > 0


def test_checkpoint_roundtrip_into_another_layout(tmp_path):
    base = dict(name="t", dim=4, optimizer=OPTIMIZERS["adam"])
    tiered = EmbeddingTable(TableConfig(**base, storage=_tiny_tiers(tmp_path)))
    _run(tiered, steps=40)
    ids, rec = _state(tiered)
    flat = EmbeddingTable(TableConfig(**base))  # resume all in memory
    flat.load(ids, rec)
    f_ids, f_rec = _state(flat)
    assert torch.equal(ids, f_ids) and torch.equal(rec, f_rec)
    back = EmbeddingTable(TableConfig(**base, storage=_tiny_tiers(tmp_path / "other", device_rows=16)))
    back.load(ids, rec)  # and into a different tiered layout
    b_ids, b_rec = _state(back)
    assert torch.equal(ids, b_ids) and torch.equal(rec, b_rec)


@pytest.mark.parametrize("tiered", [False, True])
def test_min_count_admission(tmp_path, tiered):
    storage = _tiny_tiers(tmp_path) if tiered else {}
    cfg = TableConfig(name="t", dim=4, optimizer={"type": "sgd", "lr": 1.0}, min_count=3, storage=storage)
    table = EmbeddingTable(cfg)
    ids = torch.tensor([11, 22])
    for seen in (1, 2):
        lk = lookup(table, ids if seen == 1 else torch.tensor([11]))
        rec = lk.records
        assert torch.equal(rec[:, :4], torch.zeros(rec.shape[0], 4))  # the shared default row
        apply(lk, torch.ones(rec.shape[0], 4))
        assert len(table) == 0  # no row, no update
    lk = lookup(table, torch.tensor([11, 22]))  # 11: third sighting -> own row; 22: second
    rec = lk.records
    fresh = table.new_records(torch.tensor([11]))
    assert torch.equal(rec[0], fresh[0])
    assert torch.equal(rec[1, :4], torch.zeros(4))
    apply(lk, torch.ones(2, 4))
    assert len(table) == 1
    (got_ids, got_rec), = list(table.items())
    assert got_ids.tolist() == [11]
    assert torch.equal(got_rec[0, :4], fresh[0, :4] - 1.0)
    assert table.stats()["pending_ids"] == 1.0  # 22 still counting
    assert table.admission_state()[1].tolist() == [2]
    # evaluation lookups neither count nor create
    lookup(table, torch.tensor([22]), train=False)
    assert table.admission_state()[1].tolist() == [2]


@pytest.mark.parametrize("tiered", [False, True])
def test_ttl_expiry_returns_fresh_rows(tmp_path, tiered):
    storage = _tiny_tiers(tmp_path) if tiered else {}
    cfg = TableConfig(name="t", dim=4, optimizer={"type": "adagrad", "lr": 0.5}, ttl_steps=3, storage=storage)
    table = EmbeddingTable(cfg)
    a, b = torch.tensor([5]), torch.tensor([6])
    apply(lookup(table, torch.tensor([5, 6])), torch.ones(2, 4))  # step 1; both seen at step 0
    trained = lookup(table, a).records
    assert not torch.equal(trained[0, :8], table.new_records(a)[0])
    for _ in range(3):  # keep 6 alive, let 5 age: steps 2..4
        apply(lookup(table, b), torch.ones(1, 4))
    # step 4: 5 was last seen at step 0, 4 - 0 > 3, so it reads as gone already; the sweep
    # (automatic every ttl_steps, or explicit) reclaims its storage
    assert table.expire() == 1
    assert len(table) == 1
    ids = torch.cat([i for i, _ in table.items()])
    assert ids.tolist() == [6]
    again = lookup(table, a).records
    assert torch.equal(again[0, :8], table.new_records(a)[0])  # freshly initialised
    assert table.stats()["expired_rows"] >= 1


def test_ttl_exact_boundary():
    cfg = TableConfig(name="t", dim=2, optimizer={"type": "sgd", "lr": 1.0}, ttl_steps=2)
    table = EmbeddingTable(cfg)
    a = torch.tensor([1])
    apply(lookup(table, a), torch.ones(1, 2))  # seen at step 0 -> step 1
    other = torch.tensor([2])
    apply(lookup(table, other), torch.ones(1, 2))  # step 2 (sweep: 2-0 = 2, kept)
    assert lookup(table, a, train=False).records[0, 0] != table.new_records(a)[0, 0]  # step 2: not seen for 2 steps, alive
    apply(lookup(table, other), torch.ones(1, 2))  # step 3
    assert torch.equal(lookup(table, a, train=False).records[0, :2], table.new_records(a)[0, :2])  # 3 - 0 > 2: expired


def test_capacity_errors_up_front(tmp_path):
    with pytest.raises(CapacityError, match="disk tier needs"):
        EmbeddingTable(TableConfig(name="big", dim=16, storage={"disk_path": str(tmp_path), "disk_rows": 10**14}))
    assert not (tmp_path / "big").exists()  # nothing was allocated
    with pytest.raises(CapacityError, match="host memory"):
        EmbeddingTable(TableConfig(name="big", dim=16, storage={"host_bytes": "100TiB"}))
    full = EmbeddingTable(TableConfig(name="clicks", dim=4, storage={"host_rows": 8}))  # no disk tier behind it
    with pytest.raises(CapacityError, match="HostTier of table 'clicks': 12 rows would exceed its capacity of 8"):
        apply(lookup(full, torch.arange(12)), torch.zeros(12, 4))  # (several tables may share one storage section)
    plan = EmbeddingTable(TableConfig(name="t", dim=16, storage=_tiny_tiers(tmp_path))).storage_plan()
    text = plan.describe()
    assert "device" in text and "disk" in text and plan.disk_bytes > 0


def test_warm_start_fills_the_device_cache(tmp_path):
    cfg = TableConfig(name="t", dim=4, storage=_tiny_tiers(tmp_path, admit_after=3))
    table = EmbeddingTable(cfg)
    ids = torch.arange(1000)
    table.load(ids, table.new_records(ids))  # all land in the last tier
    counts = torch.arange(1000, 0, -1)  # ID 0 most frequent
    promoted = table.warm_start(ids, counts)
    assert promoted == 64
    assert table.tier.fast.contains(torch.arange(64)).all()  # type: ignore[attr-defined]


@pytest.mark.parametrize("policy,admit", [("lfu", 2), ("lru", 1)])
def test_cache_slots_remembered_across_promotions_equal_fresh_probes(tmp_path, policy, admit):
    """A CachedTier hands its fast tier the slots it derives from its own probes and moves (the
    batch after promotions and demotions, the promoted rows, the rows written back), and the
    disk tier remembers its last read: each remembered slot equals a fresh index probe, and
    the rows read back are the ones written."""
    from ember.tiers import CachedTier, DiskTier, HostTier

    fast = HostTier(3, capacity=40, policy=policy)
    disk = DiskTier(tmp_path / "d", 3, rows=64)
    c = CachedTier(fast, disk, admit_after=admit, evict_slack=30)  # demotions reach the batch's own rows
    rng = np.random.default_rng(2)
    truth: dict[int, float] = {}
    for step in range(60):
        ids = torch.from_numpy(np.unique(rng.zipf(1.3, 50) % 400 * 1_000_003 - 7))
        out = torch.zeros(ids.numel(), 3)
        found = c.get_into(ids, out)
        want = [truth.get(i) for i in ids.tolist()]
        assert found.tolist() == [w is not None for w in want]
        assert [out[j, 0].item() for j in range(len(want)) if want[j] is not None] == [w for w in want if w is not None]
        fresh = torch.from_numpy(fast._index.lookup(ids.numpy()).astype(np.int64))
        assert torch.equal(fast.slots_of(ids), fresh)
        vals = torch.full((ids.numel(), 3), float(step))
        c.put(ids, vals)
        truth.update({i: float(step) for i in ids.tolist()})
        fresh = torch.from_numpy(fast._index.lookup(ids.numpy()).astype(np.int64))
        assert torch.equal(fast.slots_of(ids), fresh)
        assert len(c) == len(truth)
    assert c.promotions > 0 and c.demotions > 0
