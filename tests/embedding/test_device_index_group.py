"""A table group with storage.index: device (``MappedRows``): bit for bit the host index's rows for
every optimizer it takes, multi-hot bags, mixed initializers and optimizers in one group; an
evaluation inserts nothing; a step never waits for the device and its operation count does not
grow with the tables (the same code a GPU runs, with the native core off where budgets count)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import _native
from ember.batch import SparseFeatures
from ember.config import from_dict
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig
from ember.models import MODEL_TYPES
from ember.testing import SPARSE_OPTIMIZERS
from ember.tiers.device_budget import DeviceBudget
from ember.tiers.mapped_rows import MappedTier
from ember.train.builder import build_components

CPU = torch.device("cpu")
DEVICE_INDEX = {"index": "device", "device": "cpu"}
OPTIMIZERS = SPARSE_OPTIMIZERS  # (ftrl's new state depends on the weights: made from them on the device)


pytestmark = pytest.mark.usefixtures("padding")  # (tests/conftest.py: every test unpadded, then padded)


def _collection(index: str, opts: list[dict], pooling: str = "sum", inits: list[dict] | None = None,
                dtype: str = "fp32", ttl: list[int | None] | None = None,
                min_count: list[int] | None = None) -> EmbeddingCollection:
    storage = DEVICE_INDEX if index == "device" else {}
    tables = [TableConfig(name=f"t{i}", dim=7, optimizer=o, storage=storage, dtype=dtype,
                          ttl_steps=None if ttl is None else ttl[i % len(ttl)],
                          min_count=1 if min_count is None else min_count[i % len(min_count)],
                          **({} if inits is None else {"initializer": inits[i % len(inits)]})) for i, o in enumerate(opts)]
    return EmbeddingCollection(tables, [FeatureConfig(name=f"f{i}", table=f"t{i}", pooling=pooling) for i in range(len(opts))])


def _batch(n: int, b: int, rng: np.random.Generator, multi: bool) -> SparseFeatures:
    lengths = rng.integers(0, 4, n * b) if multi else np.ones(n * b, dtype=np.int64)
    values = (np.minimum(rng.zipf(1.1, int(lengths.sum())), 3000) * 7919) ^ rng.integers(0, 2, int(lengths.sum())) << 62
    return SparseFeatures([f"f{i}" for i in range(n)], torch.from_numpy(values), torch.from_numpy(lengths))


def _rows(ec: EmbeddingCollection) -> dict[str, dict[int, torch.Tensor]]:
    return {n: {int(i): r for ids, rec in t.tier.items() for i, r in zip(ids, rec)} for n, t in ec.tables.items()}


def _train_both(opts: list[dict], steps: int = 6, multi: bool = False, pooling: str = "sum",
                inits: list[dict] | None = None, dtype: str = "fp32", ttl: list[int | None] | None = None,
                batch: int = 64, min_count: list[int] | None = None) -> tuple[EmbeddingCollection, EmbeddingCollection]:
    host = _collection("host", opts, pooling, inits, dtype, ttl, min_count)
    dev = _collection("device", opts, pooling, inits, dtype, ttl, min_count)
    assert all(isinstance(t.tier, MappedTier) for t in dev.tables.values()) and all(g.mapped is not None for g in dev.groups)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        sf = _batch(len(opts), batch, rng, multi)
        losses = []
        for ec in (host, dev):
            emb = ec(sf)
            loss = sum((emb[k] ** 2).sum() * (i + 1) + emb[k].sum() for i, k in enumerate(emb))
            loss.backward()
            SparseOptimizer(ec).step()
            losses.append(loss.item())
        assert losses[0] == losses[1]
    return host, dev


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=[o["type"] for o in OPTIMIZERS])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_every_optimizer_stores_the_host_index_rows(opt, pooling):
    host, dev = _train_both([opt] * 4, multi=True, pooling=pooling)
    a, b = _rows(host), _rows(dev)
    for n in a:
        assert a[n].keys() == b[n].keys() and all(torch.equal(a[n][k], b[n][k]) for k in a[n]), n
        assert len(host.tables[n]) == len(dev.tables[n])


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_16_bit_rows_store_the_host_index_bits(dtype):
    """Fresh rows rounded to nearest, updated rows rounded stochastically with the noise of (table
    seed, table step, ID, column): the host path's bits (odd dim: the pad half-word too)."""
    host, dev = _train_both([OPTIMIZERS[2], OPTIMIZERS[3], OPTIMIZERS[2]], multi=True, dtype=dtype)
    a, b = _rows(host), _rows(dev)
    for n in a:
        assert a[n].keys() == b[n].keys() and all(torch.equal(a[n][k], b[n][k]) for k in a[n]), n
    assert next(iter(b["t0"].values())).shape == (4 + 1,)  # packed: 7 16-bit weights in 4 words, 1 state


def test_weighted_sqrtn_and_sequence_features_pool_the_same_rows():
    """Features pooled one at a time (weighted bags, sqrt-n, sequences; two features sharing a
    table) read and update the rows the host index gives."""
    feats = [FeatureConfig(name="w", table="t0", pooling="sum"), FeatureConfig(name="q", table="t0", pooling="sqrtn"),
             FeatureConfig(name="s", table="t1", pooling="sequence", max_length=3)]
    made = []
    for storage in ({}, DEVICE_INDEX):
        tables = [TableConfig(name=f"t{i}", dim=7, optimizer=OPTIMIZERS[3], storage=storage) for i in range(2)]
        made.append(EmbeddingCollection(tables, feats))
    rng = np.random.default_rng(3)
    for _ in range(4):
        lengths = rng.integers(0, 4, 3 * 16)
        n = int(lengths.sum())
        sf = SparseFeatures(["w", "q", "s"], torch.from_numpy(rng.integers(0, 60, n)), torch.from_numpy(lengths),
                            weights=torch.from_numpy(rng.uniform(-1, 2, n).astype(np.float32)))
        losses = []
        for ec in made:
            out = ec(sf)
            seq = out["s"]
            loss = (out["w"] ** 2).sum() + out["q"].sum() + (seq.values ** 2).sum()
            loss.backward()
            SparseOptimizer(ec).step()
            losses.append(loss.item())
        assert losses[0] == losses[1]
    a, b = _rows(made[0]), _rows(made[1])
    for n in a:
        assert a[n].keys() == b[n].keys() and all(torch.equal(a[n][k], b[n][k]) for k in a[n]), n


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_ttl_tables_expire_and_reuse_rows_as_the_host_index_does(dtype):
    """Rows not looked up for more than ttl_steps read as new (fresh, counted as expired reads) and
    the sweep every ttl_steps steps removes them: the host index's rows and counters, bit for bit;
    the removed rows' record numbers are reused (the rows in use stay near the live ones). A group
    mixing TTL and plain tables (sgd + TTL has rowwise Adagrad's record width)."""
    opts = [OPTIMIZERS[0], OPTIMIZERS[2], OPTIMIZERS[0], OPTIMIZERS[3]]
    host, dev = _train_both(opts, steps=24, ttl=[2, None, 3, 2], dtype=dtype, batch=16)
    a, b = _rows(host), _rows(dev)
    for n in a:
        assert a[n].keys() == b[n].keys() and all(torch.equal(a[n][k], b[n][k]) for k in a[n]), n
    for n in host.tables:
        sa, sb = host.tables[n].stats(), dev.tables[n].stats()
        for k in ("rows", "expired_reads", "expired_rows"):
            assert sa.get(k) == sb.get(k), (n, k, sa.get(k), sb.get(k))
    assert sum(host.tables[n].stats().get("expired_reads", 0) for n in host.tables) > 0  # (it did expire rows)
    live = sum(len(t) for t in dev.tables.values())
    numbered = max(g.mapped.index.check() for g in dev.groups)
    assert live < numbered  # rows were removed ...
    assert numbered <= live + 3 * 16 * 3  # ... and their numbers reused, not grown past the live rows


def test_mixed_optimizers_and_initializers_in_one_group():
    inits = [{"type": "uniform"}, {"type": "uniform", "scale": 0.5}, {"type": "zeros"}, {"type": "normal"},
             {"type": "normal", "std": 0.3}]
    rowwise = [{"type": "rowwise_adagrad", "lr": lr} for lr in (0.05, 0.1, 0.05)]  # one group, two optimizer runs
    ftrl = [{"type": "ftrl", "alpha": 0.05, "l2": l2} for l2 in (0.0, 0.01)]  # state from the weights, per table
    host, dev = _train_both(rowwise + OPTIMIZERS + ftrl, inits=inits)  # (+ a group per other record width)
    assert len(dev.groups) == 5 and len(dev.groups[0].runs) >= 2
    assert any(len(g.fresh_from_weights) == 3 and len(g.runs) == 3 for g in dev.groups)  # the ftrl group
    a, b = _rows(host), _rows(dev)
    for n in a:
        assert a[n].keys() == b[n].keys() and all(torch.equal(a[n][k], b[n][k]) for k in a[n]), n


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("ttl", [None, [2]], ids=["no-ttl", "ttl"])
def test_min_count_holds_back_and_admits_as_the_host_index_does(dtype, ttl):
    """``min_count`` counted on the device: an ID without a row (or whose row expired) is counted,
    reads the zero row and is stored nowhere until its count reaches the threshold, then gets
    its fresh row; rows, counts, stats and the change log equal the host index's."""
    opts = [{"type": "sgd", "lr": 0.1}, {"type": "adam", "lr": 0.01}, {"type": "rowwise_adagrad", "lr": 0.1}]
    host = _collection("host", opts, dtype=dtype, ttl=ttl, min_count=[3, 1, 2])
    dev = _collection("device", opts, dtype=dtype, ttl=ttl, min_count=[3, 1, 2])
    logs = [[t.track_changes() for t in ec.tables.values()] for ec in (host, dev)]
    rng = np.random.default_rng(0)
    for _ in range(8):
        sf = _batch(len(opts), 64, rng, multi=False)
        for ec in (host, dev):
            emb = ec(sf)
            sum((emb[k] ** 2).sum() * (i + 1) + emb[k].sum() for i, k in enumerate(emb)).backward()
            SparseOptimizer(ec).step()
    a, b = _rows(host), _rows(dev)
    for n in a:
        assert a[n].keys() == b[n].keys() and all(torch.equal(a[n][k], b[n][k]) for k in a[n]), n
    for n, t in host.tables.items():
        mine = dev.tables[n]
        for got, want in zip(mine.admission_state(), t.admission_state()):
            assert torch.equal(got, want), n
        stats = ("pending_ids", "filtered_reads", "expired_reads")
        assert {k: v for k, v in t.stats().items() if k in stats} == {k: v for k, v in mine.stats().items() if k in stats}
    assert dev.tables["t0"].stats()["filtered_reads"] > 0 and dev.tables["t0"].stats()["pending_ids"] > 0
    counting = sum(len(g.pending) for g in dev.groups if g.pending is not None)  # admitted pairs left, as the host's
    assert counting == sum(len(t.admission) for t in host.tables.values() if t.admission is not None) > 0
    for lh, ld in zip(*logs):
        assert np.array_equal(np.sort(lh.take()), np.sort(ld.take()))  # (the IDs stored: none held back)
    sf = _batch(len(opts), 64, rng, multi=False)
    with torch.no_grad():  # an evaluation: held-back and unseen IDs of a min_count table read the zero row
        ea, eb = host.eval()(sf), dev.eval()(sf)
    assert all(torch.equal(ea[k], eb[k]) for k in ea)


def test_an_evaluation_reads_fresh_rows_and_inserts_nothing():
    host, dev = _train_both([OPTIMIZERS[2]] * 3, steps=2)
    before = {n: len(t) for n, t in dev.tables.items()}
    sf = _batch(3, 64, np.random.default_rng(9), multi=False)
    with torch.no_grad():
        ea, eb = host.eval()(sf), dev.eval()(sf)
    for k in ea:
        assert torch.equal(ea[k], eb[k]), k
    assert {n: len(t) for n, t in dev.tables.items()} == before


def test_the_tier_view_reads_writes_and_removes():
    _, dev = _train_both([OPTIMIZERS[2]] * 2, steps=1)
    t = dev.tables["t1"].tier
    ids = torch.tensor([11, 22])
    t.put(ids, torch.ones(2, t.record_dim))
    out = torch.zeros(3, t.record_dim)
    assert t.get_into(torch.tensor([22, 5, 11]), out).tolist() == [True, False, True]
    assert torch.equal(out[[0, 2]], torch.ones(2, t.record_dim)) and not out[1].any()
    assert t.contains(torch.tensor([11, 5])).tolist() == [True, False]
    n = len(t)
    assert t.remove(torch.tensor([11, 5])).tolist() == [True, False] and len(t) == n - 1
    assert 11 not in {int(i) for ids_, _ in t.items() for i in ids_}
    assert dev.tables["t0"].tier.contains(torch.tensor([22])).tolist() == [False]  # (another table's rows)


# what a steady step launches today (rows of 7 floats, every optimizer): a ceiling that catches
# a change adding work to the step (the 25 asks for fusion; see docs/performance.md)
_OP_CEILING = {"fp32": 165, "bf16": 260, "fp16": 275}


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("opt", OPTIMIZERS, ids=[o["type"] for o in OPTIMIZERS])
def test_a_step_never_syncs_and_its_op_count_does_not_grow_with_the_tables(opt, dtype, padding, monkeypatch):
    """Every device operation of the step is counted (the group's device memory is marked by the
    library, whenever the budget began): the look-up's, the fresh rows', the upload. (Padded,
    the count is of the function a GPU replays as one CUDA graph: no ceiling on a CPU.)"""
    monkeypatch.setattr(_native, "_core", None)  # the torch paths a GPU takes

    def ops(n: int) -> list[int]:
        ec = _collection("device", [opt] * n, dtype=dtype)
        (group,) = ec.groups
        rng = np.random.default_rng(0)
        cot = torch.randn(64, 7)
        out = []
        for step in range(5):
            sf = _batch(n, 64, rng, multi=False)
            with DeviceBudget(CPU) as budget:
                budget.mark(cot)
                lk = group.plan(sf, True)
                lk.fetch()
                pooled = lk.pool(CPU)
                torch.autograd.backward([pooled[k] for k in pooled], [cot] * len(pooled))
                lk.update(step)
                lk.write_back()
            if step >= 3:  # (past the first calls of this size)
                assert budget.syncs == 0, budget.report()
                assert {"sort", "searchsorted", "index_select", "index_copy_"} <= set(budget.op_names), budget.report()
                out.append(budget.ops)
        return out

    two, many = ops(2), ops(26)
    assert max(many) <= max(two), (two, many)
    if padding == "unpadded":
        assert max(two) <= _OP_CEILING[dtype], two


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_normal_rows_are_made_on_the_device_as_on_the_host(dtype):
    """A normal initializer's new rows, made by tensor operations where the rows live, have the
    host's bits (``ember.portable.normal``), rounded as they are stored."""
    inits = [{"type": "normal"}, {"type": "normal", "std": 0.05}, {"type": "uniform"}]
    host, dev = _train_both([{"type": "adam", "lr": 0.01}, {"type": "ftrl", "alpha": 0.05}, {"type": "sgd", "lr": 0.1}],
                            inits=inits, dtype=dtype, steps=4)
    assert any(g.fresh_normal is not None for g in dev.groups)
    a, b = _rows(host), _rows(dev)
    for n in a:
        assert a[n].keys() == b[n].keys() and all(torch.equal(a[n][k], b[n][k]) for k in a[n]), n


def test_what_it_cannot_hold_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="does not combine with disk_path.*index: host"):
        TableConfig(name="t", storage={**DEVICE_INDEX, "disk_path": "/tmp/x"})
    TableConfig(name="t", storage=DEVICE_INDEX, initializer={"type": "normal"}, min_count=2)  # (both made on the device)


@pytest.mark.parametrize("model", MODEL_TYPES)
def test_every_model_steps_without_a_sync(model, tmp_path, monkeypatch):
    """Each model of the zoo with every table on the device index: each group's embedding path
    (plan, fetch, pool, backward, update, write back) never reads device data back, once past
    the first calls of a size (the native core off: the torch paths a GPU takes), min_count
    counted on the device too."""
    monkeypatch.setattr(_native, "_core", None)
    cfg = from_dict({
        "data": {"preset": "synthetic", "synthetic": {"rows": 1000, "eval_rows": 200, "vocab_size": 3000, "num_sparse": 6},
                 "batch_size": 128},
        "embedding": {"dim": 16, "optimizer": {"type": "adam", "lr": 0.01}, "storage": DEVICE_INDEX, "min_count": 2},
        "model": {"type": model},
        "train": {"out_dir": str(tmp_path), "device": "cpu", "progress": False},
    })
    ec = build_components(cfg, announce=False).embeddings
    assert all(isinstance(t.tier, MappedTier) for t in ec.tables.values())
    names = [f.name for f in ec.features]
    rng = np.random.default_rng(0)
    for step in range(5):
        sf = SparseFeatures(names, torch.from_numpy(rng.integers(0, 3000, len(names) * 128)),
                            torch.ones(len(names) * 128, dtype=torch.int64))
        for group in ec.groups:
            with DeviceBudget(CPU) as budget:
                lk = group.plan(sf, True)
                lk.fetch()
                pooled = lk.pool(CPU)
                torch.autograd.backward([pooled[k] for k in pooled], [torch.ones_like(pooled[k]) for k in pooled])
                lk.update(step)
                lk.write_back()
            if step >= 3:
                assert budget.syncs == 0, budget.report()
