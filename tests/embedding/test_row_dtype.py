"""Reduced-precision row storage (``TableConfig.dtype``): the grouped engine equals the reference,
every tier layout trains identically, records and disk files shrink as promised, groups split
by dtype, and the dtype is a run-config default."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.config import apply_overrides, from_dict
from ember.embedding import EmbeddingCollection, EmbeddingTable, TableConfig
from ember.testing import apply, lookup, rows
from tests.embedding.test_grouped_vs_reference import OPTIMIZERS, _batches, _features, _tables, assert_tables_equal, run_both
from tests.tiers.test_tiered_table import _run, _state, _tiny_tiers


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("opt", OPTIMIZERS, ids=[o["type"] for o in OPTIMIZERS])
def test_grouped_equals_reference_at_reduced_precision(dtype, opt):
    ec, ref = run_both(_tables(opt, dtype=dtype), _features("sum"), _batches(4))
    assert_tables_equal(ec, ref)
    for t in ec.tables.values():  # weights are representable at the dtype, state is fp32 as computed
        ids, rec = next(iter(t.items()))
        w = rec[:, : t.dim]
        assert torch.equal(w.to(torch.bfloat16 if dtype == "bf16" else torch.float16).float(), w)


@pytest.mark.parametrize("kw", [{"min_count": 2}, {"ttl_steps": 2}], ids=["min_count", "ttl"])
def test_admission_and_ttl_at_bf16_equal_reference(kw):
    ec, ref = run_both(_tables(OPTIMIZERS[2], dtype="bf16", **kw), _features("mean"), _batches(5))
    assert_tables_equal(ec, ref)


def test_fresh_rows_are_rounded_once_and_read_as_stored():
    t = EmbeddingTable(TableConfig(name="t", dim=5, dtype="bf16"), seed=3)
    ids = torch.tensor([4, 8, 15])
    fresh = t.new_records(ids)
    assert torch.equal(fresh[:, :5], fresh[:, :5].to(torch.bfloat16).float())
    lk = lookup(t, ids)
    assert torch.equal(lk.records, fresh)
    apply(lk, torch.zeros(3, 5))  # a zero gradient: row-wise Adagrad leaves the weights, so the store is exact
    assert torch.equal(rows(t, ids)[:, :5], fresh[:, :5])


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_every_tier_layout_trains_like_the_host_tier(tmp_path, dtype):
    """Device cache (on the CPU) + host cache + disk, and disk alone, give bit-identical rows to
    the host tier: the rounding noise depends on (seed, step, ID, column), not on where a row is."""
    base = dict(name="t", dim=8, optimizer={"type": "rowwise_adagrad", "lr": 0.1}, dtype=dtype)
    ref = EmbeddingTable(TableConfig(**base))
    tiered = EmbeddingTable(TableConfig(**base, storage=_tiny_tiers(tmp_path)))
    disk = EmbeddingTable(TableConfig(**base, storage={"disk_path": str(tmp_path / "d2"), "disk_rows": 64}))
    for t in (ref, tiered, disk):
        _run(t, steps=40)
    ids, rec = _state(ref)
    assert ids.numel() > 300
    for t in (tiered, disk):
        ids_t, rec_t = _state(t)
        assert torch.equal(ids_t, ids) and torch.equal(rec_t, rec)
    tiered.close()
    disk.close()


def test_same_run_twice_is_bit_identical():
    def run() -> tuple[torch.Tensor, torch.Tensor]:
        t = EmbeddingTable(TableConfig(name="t", dim=6, dtype="bf16", optimizer={"type": "adam", "lr": 0.01}), seed=1)
        _run(t, steps=10)
        return _state(t)

    (ia, ra), (ib, rb) = run(), run()
    assert torch.equal(ia, ib) and torch.equal(ra.view(torch.int32), rb.view(torch.int32))


def test_bytes_per_record_and_disk_file_follow_the_dtype(tmp_path):
    """dim 16 + row-wise Adagrad: a bf16 record is 9 words (36 B) against 17 (68 B) = 53 % <= 56 %;
    a disk slot 8 + 36 = 44 B against 76 B = 58 % <= 60 %, in the plan and in the file."""
    sizes = {}
    for dtype in ("fp32", "bf16"):
        cfg = TableConfig(name=f"t{dtype}", dim=16, dtype=dtype, optimizer={"type": "rowwise_adagrad", "lr": 0.1},
                          storage={"disk_path": str(tmp_path), "disk_rows": 4096, "host_rows": 100})
        t = EmbeddingTable(cfg)
        assert t.tier.record_dim == cfg.stored_words == t.codec.words
        plan = t.storage_plan()
        _run(t, steps=3)
        t.close()
        sizes[dtype] = (4 * cfg.stored_words, plan.disk_bytes, (tmp_path / cfg.name / "slots.bin").stat().st_size,
                        plan.host_bytes)
    (rec32, plan32, file32, host32), (rec16, plan16, file16, host16) = sizes["fp32"], sizes["bf16"]
    assert (rec32, rec16) == (68, 36) and rec16 / rec32 <= 0.56
    assert plan16 / plan32 <= 0.60 and file16 / file32 <= 0.60 and file16 == plan16
    assert host16 < host32  # the host cache's arena shrinks too
    assert TableConfig(name="x", dim=16, dtype="fp16", ttl_steps=5).stored_words == 8 + 1 + 1


def test_tables_of_other_dtypes_form_other_groups():
    tables = [TableConfig(name="a", dim=4), TableConfig(name="b", dim=4, dtype="bf16"), TableConfig(name="c", dim=4)]
    from ember.embedding import FeatureConfig

    ec = EmbeddingCollection(tables, [FeatureConfig(name=n) for n in "abc"])
    assert sorted(sorted(g.names) for g in ec.groups) == [["a", "c"], ["b"]]


def test_dtype_is_a_run_config_default_and_an_override():
    raw = {
        "data": {"preset": "synthetic", "synthetic": {"num_dense": 1, "num_sparse": 3, "rows": 64, "eval_rows": 8}},
        "tables": [{"name": "C1", "dtype": "fp16"}, {"name": "C2"}],
        "model": {"type": "lr"},
    }
    cfg = from_dict(apply_overrides(raw, ["embedding.dtype=bf16"]))
    listed = {t.name: t.dtype for t in cfg.tables}
    assert listed == {"C1": "fp16", "C2": "bf16"}
    assert cfg.embedding.dtype == "bf16"
    with pytest.raises(ValueError, match="dtype"):
        from_dict(apply_overrides(raw, ["embedding.dtype=int8"]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_cuda_device_cache_trains_like_the_host_tier(dtype):
    """Decode, update and stochastic rounding on the GPU give the host tier's rows bit for bit
    (SGD and gradients made from the IDs on the CPU: each step's arithmetic is exact alike)."""
    base = dict(name="t", dim=8, optimizer={"type": "sgd", "lr": 0.1}, dtype=dtype)
    ref = EmbeddingTable(TableConfig(**base))
    gpu = EmbeddingTable(TableConfig(**base, storage={"device_rows": 64, "device": "cuda", "admit_after": 1}))
    rng = np.random.default_rng(0)
    for step in range(30):
        raw = rng.zipf(1.2, size=300)
        ids = torch.unique(torch.from_numpy(raw[raw < 5000] * 7919 - 2**40))
        grads = torch.sin(ids.to(torch.float64).unsqueeze(1) * 0.37 + torch.arange(8) + step).float()
        for t in (ref, gpu):
            apply(lookup(t, ids), grads)
    assert gpu.tier.fast._arena.is_cuda and len(gpu.tier.fast) > 0
    ids, rec = _state(ref)
    ids_g, rec_g = _state(gpu)
    assert torch.equal(ids_g, ids) and torch.equal(rec_g.cpu(), rec)
