"""The grouped engine against the per-table reference (ember.testing.reference): same pooled
outputs, gradients, stored rows with optimizer state, and table steps, for every optimizer,
pooling mode, tier layout, admission and TTL setting, over several steps."""

from __future__ import annotations

import logging

import pytest
import torch

from ember.batch import SparseFeatures
from ember.embedding import EmbeddingCollection, FeatureConfig, SequenceEmbedding, SparseOptimizer, TableConfig
from ember.testing.reference import ReferenceCollection
from ember.tiers.group_cache import GroupCacheView

D, B = 4, 6
OPTIMIZERS = [
    {"type": "sgd", "lr": 0.1},
    {"type": "adagrad", "lr": 0.1},
    {"type": "rowwise_adagrad", "lr": 0.1},
    {"type": "adam", "lr": 0.01},
    {"type": "ftrl", "alpha": 0.1, "l1": 0.01},
]
KEYS = ["a", "b", "c", "d", "e"]


def _features(pooling: str | list[str]) -> list[FeatureConfig]:
    # t0 has two features (shared table), t1 and t2 one each; t3 has another dim (its own group)
    p = pooling if isinstance(pooling, list) else [pooling] * 5
    tables = ["t0", "t1", "t0", "t2", "t3"]
    return [FeatureConfig(name=k, table=t, pooling=q, max_length=3 if q == "sequence" else None) for k, t, q in zip(KEYS, tables, p)]


def _tables(opt: dict, **kw) -> list[TableConfig]:
    out = [TableConfig(name=f"t{i}", dim=D, optimizer=opt, **kw) for i in range(3)]
    return out + [TableConfig(name="t3", dim=D + 1, optimizer=opt, **kw)]


def _batch(rng: torch.Generator, weighted: bool = False, vocab: int = 12) -> SparseFeatures:
    lengths = torch.randint(0, 4, (len(KEYS) * B,), generator=rng)
    values = torch.randint(0, vocab, (int(lengths.sum()),), generator=rng) * 1_000_003 - 5
    weights = torch.rand(values.numel(), generator=rng) if weighted else None
    return SparseFeatures(KEYS, values, lengths, weights)


def _loss(out: dict, proj: torch.Tensor, use: set[str] | None) -> torch.Tensor:
    vals = {k: o.values if isinstance(o, SequenceEmbedding) else o for k, o in out.items()}
    return sum((v * proj[: v.shape[-1]]).square().sum() for k, v in vals.items() if use is None or k in use)


def run_both(tables, features, batches, use=None, seed=0, check_grads=True):
    """Train both on ``batches``; assert equal outputs and gradients each step; return both."""
    ec, ref = EmbeddingCollection(tables, features, seed=seed), ReferenceCollection(tables, features, seed=seed)
    opt = SparseOptimizer(ec)
    proj = torch.linspace(-1, 1, D + 1)
    for sf in batches:
        lk = ec.plan(sf).fetch()
        out = ec(sf, lk)
        ref_out = ref.forward(sf)
        for k in ref_out:
            a, b = (out[k].values, ref_out[k].values) if isinstance(ref_out[k], SequenceEmbedding) else (out[k], ref_out[k])
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        _loss(out, proj, use).backward()
        _loss(ref_out, proj, use).backward()
        if check_grads:
            _assert_grads_equal(lk, ref)
        opt.step()
        ref.step()
    return ec, ref


def _assert_grads_equal(lk, ref):
    for g in lk.groups:
        for j, t in enumerate(g.group.tables):
            ids, w, _, _ = ref.leaves[t.name]
            a, b = int(g.starts[j]), int(g.starts[j + 1])
            assert torch.equal(g.ids[a:b], ids)
            if w.grad is None:
                assert not g.reached[j]
            else:
                assert g.reached[j]
                torch.testing.assert_close(g.grad[a:b], w.grad, rtol=1e-5, atol=1e-6)


def assert_tables_equal(ec, ref):
    for name, rt in ref.tables.items():
        t = ec.tables[name]
        assert t.step == rt.step, name
        fi, fr = _sorted_items(t)
        ri, rr = _sorted_items(rt)
        assert torch.equal(fi, ri), name
        torch.testing.assert_close(fr, rr, rtol=1e-5, atol=1e-6)
        assert torch.equal(t.admission_state()[0], rt.admission_state()[0])


def _sorted_items(table):
    chunks = list(table.items_with_seen())
    if not chunks:
        return torch.empty(0, dtype=torch.int64), torch.empty(0, table.config.stored_dim)
    ids = torch.cat([c[0] for c in chunks])
    rec = torch.cat([c[1] if c[2] is None else torch.cat([c[1], c[2].unsqueeze(1)], 1) for c in chunks])
    order = torch.argsort(ids)
    return ids[order], rec[order]


def _batches(n: int, seed: int = 0, **kw) -> list[SparseFeatures]:
    rng = torch.Generator().manual_seed(seed)
    return [_batch(rng, **kw) for _ in range(n)]


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=[o["type"] for o in OPTIMIZERS])
@pytest.mark.parametrize("pooling", ["sum", "mean", "sqrtn", "sequence", ["sum", "mean", "sqrtn", "sequence", "sum"]],
                         ids=["sum", "mean", "sqrtn", "sequence", "mixed"])
def test_grouped_equals_reference(opt, pooling):
    ec, ref = run_both(_tables(opt), _features(pooling), _batches(4))
    assert [len(g.tables) for g in ec.groups] == [3, 1]  # t0-t2 share a group whatever their pooling
    assert_tables_equal(ec, ref)


@pytest.mark.parametrize("pooling", ["sum", "mean", "sqrtn"])
def test_weighted_pooling_equals_reference(pooling):
    ec, ref = run_both(_tables(OPTIMIZERS[2]), _features(pooling), _batches(4, weighted=True))
    assert_tables_equal(ec, ref)


def test_tables_differing_in_init_seed_and_hyperparameters_share_a_group_and_equal_reference():
    tables = [
        TableConfig(name="t0", dim=D, optimizer={"type": "rowwise_adagrad", "lr": 0.1}, initializer={"scale": 0.01}),
        TableConfig(name="t1", dim=D, optimizer={"type": "rowwise_adagrad", "lr": 0.1}, seed=5),
        TableConfig(name="t2", dim=D, optimizer={"type": "rowwise_adagrad", "lr": 0.3}, initializer={"type": "normal"}),
        TableConfig(name="t3", dim=D + 1),
    ]
    ec, ref = run_both(tables, _features("sum"), _batches(4))
    # fresh rows of the mixed-scale init call equal each table's own init bit for bit
    fresh = EmbeddingCollection(tables, _features("sum"))
    sf = _batches(1, vocab=1000)[0]
    lk = fresh.plan(sf).fetch().groups[0]
    for j, t in enumerate(lk.group.tables):
        a, b = int(lk.starts[j]), int(lk.starts[j + 1])
        assert torch.equal(lk.records[a:b], t.new_records(lk.ids[a:b]))
    assert len(ec.groups[0].tables) == 3 and len(ec.groups[0].runs) == 2
    assert len(ec.groups[0].combos) == 2 and ec.groups[0].mixed_scale == [True, False]  # t0, t1: one uniform init call
    assert_tables_equal(ec, ref)


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=[o["type"] for o in OPTIMIZERS])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_fresh_rows_written_in_place_equal_each_tables_own_records(opt, dtype):
    """fetch writes the new rows of uniform initializers with a constant initial state in place
    (``_native.fresh_uniform``; numpy without the native core); every other combo goes through
    ``fresh_records``. Either way each row equals its table's ``new_records`` bit for bit: one
    scale, mixed scales, a normal initializer beside them, bf16 rounding, a half-filled buffer."""
    tables = [
        TableConfig(name="t0", dim=D, optimizer=opt, initializer={"scale": 0.01}, dtype=dtype),
        TableConfig(name="t1", dim=D, optimizer=opt, seed=5, dtype=dtype),
        TableConfig(name="t2", dim=D, optimizer=opt, initializer={"type": "normal"}, dtype=dtype),
    ]
    ec = EmbeddingCollection(tables, [FeatureConfig(name=k, table=f"t{i % 3}") for i, k in enumerate(KEYS)])
    g = ec.groups[0]
    fast = opt["type"] != "ftrl" and dtype != "fp16"
    assert [f is not None for f in g.fills] == [fast, False]  # t0 + t1 (uniform, two scales), t2 (normal)
    sf = _batches(1, vocab=30)[0]
    old = ec.plan(_batches(1, seed=3, vocab=12)[0]).fetch()  # some IDs stored first: fresh rows among found ones
    old.groups[0].reached = [True] * 3
    old.groups[0].grad = torch.zeros(old.groups[0].ids.numel(), D)
    old.groups[0].update(0)
    old.groups[0].write_back()
    lk = ec.plan(sf).fetch().groups[0]
    for j, t in enumerate(lk.group.tables):
        a, b = int(lk.starts[j]), int(lk.starts[j + 1])
        stored = t.tier.contains(lk.ids[a:b])
        new = torch.nonzero(~stored).squeeze(1) + a
        assert bool(stored.any()) and new.numel(), t.name
        assert torch.equal(lk.records[new], t.new_records(lk.ids[new])), t.name


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=[o["type"] for o in OPTIMIZERS])
def test_bf16_group_widened_on_read_and_packed_on_write_equals_decode_and_encode(opt, monkeypatch):
    """A bf16 group on host memory reads its rows widened to fp32 and writes them packed with
    stochastic rounding in the native pass itself (``read_bf16_segments`` /
    ``write_bf16_segments``): training, outputs and every stored bit equal the path that reads
    the packed words, decodes, encodes and writes them (the fused pass switched off)."""
    import ember.embedding.group as group_module

    tables = _tables(opt, dtype="bf16")
    features = _features("sum")
    batches = _batches(6, vocab=20)
    taken = {"read": 0, "write": 0}
    read, write = group_module.read_bf16_segments, group_module.write_bf16_segments

    def spy_read(*a):
        out = read(*a)
        taken["read"] += out is not None
        return out

    def spy_write(*a):
        out = write(*a)
        taken["write"] += out
        return out

    def train(fused: bool):
        monkeypatch.setattr(group_module, "read_bf16_segments", spy_read if fused else (lambda *a: None))
        monkeypatch.setattr(group_module, "write_bf16_segments", spy_write if fused else (lambda *a: False))
        ec = EmbeddingCollection(tables, features, seed=4)
        opt_ = SparseOptimizer(ec)
        proj = torch.linspace(-1, 1, D + 1)
        outs = []
        for sf in batches:
            out = ec(sf, ec.plan(sf).fetch())
            outs.append({k: v.detach().clone() for k, v in out.items()})
            _loss(out, proj, None).backward()
            opt_.step()
        return ec, outs

    fused, fused_outs = train(True)
    plain, plain_outs = train(False)
    assert taken["read"] >= len(batches) and taken["write"] >= len(batches)  # both groups, every step
    for a, b in zip(fused_outs, plain_outs):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in fused.tables:
        ids_a, rec_a = _sorted_items(fused.tables[name])
        ids_b, rec_b = _sorted_items(plain.tables[name])
        assert ids_a.numel() and torch.equal(ids_a, ids_b), name
        assert torch.equal(rec_a.view(torch.int32), rec_b.view(torch.int32)), name


@pytest.mark.parametrize("opt", OPTIMIZERS[1:3], ids=["adagrad", "rowwise"])
def test_min_count_and_ttl_in_one_group_equal_reference(opt):
    tables = [
        TableConfig(name="t0", dim=D, optimizer=opt, min_count=2),
        TableConfig(name="t1", dim=D, optimizer=opt),
        TableConfig(name="t2", dim=D, optimizer=opt, min_count=3),
        TableConfig(name="t3", dim=D + 1, optimizer=opt, ttl_steps=2),
    ]
    ec, ref = run_both(tables, _features("sum"), _batches(8, vocab=6))
    assert len(ec.groups[0].tables) == 3  # min_count tables stay with the plain one
    assert any(t.filtered_reads for t in ec.tables.values())
    assert_tables_equal(ec, ref)


def test_ttl_tables_equal_reference_across_expiry():
    tables = [TableConfig(name=f"t{i}", dim=D, ttl_steps=2 + i, optimizer=OPTIMIZERS[3]) for i in range(3)]
    tables.append(TableConfig(name="t3", dim=D + 1, ttl_steps=3))
    ec, ref = run_both(tables, _features("mean"), _batches(9, vocab=30))
    assert sum(t.expired_rows for t in ec.tables.values()) > 0
    assert_tables_equal(ec, ref)


def test_a_table_whose_features_miss_the_loss_is_not_updated():
    # Adam moves rows even with a zero gradient: stepping t1 (unused) would change it
    ec, ref = run_both(_tables(OPTIMIZERS[3]), _features("sum"), _batches(3), use={"a", "c", "e"})
    assert ec.tables["t1"].step == 0 and len(ec.tables["t1"]) == 0
    assert_tables_equal(ec, ref)


@pytest.mark.parametrize("layout", ["cache", "disk"])
def test_tier_layouts_equal_reference(layout, tmp_path):
    def storage(name):
        if layout == "cache":
            return {"device_rows": 5, "device": "cpu", "admit_after": 1}
        return {"host_rows": 6, "disk_path": str(tmp_path / name), "disk_rows": 64}

    def tables(tag):
        return [TableConfig(name=f"t{i}", dim=D, optimizer=OPTIMIZERS[1], storage=storage(f"{tag}{i}")) for i in range(3)] + [
            TableConfig(name="t3", dim=D + 1, storage=storage(f"{tag}3"))
        ]

    feats = _features("sum")
    ec, ref = EmbeddingCollection(tables("g"), feats), ReferenceCollection(tables("r"), feats)
    opt, proj = SparseOptimizer(ec), torch.linspace(-1, 1, D + 1)
    for sf in _batches(6, vocab=20):
        out, ref_out = ec(sf), ref.forward(sf)
        for k in out:
            torch.testing.assert_close(out[k], ref_out[k], rtol=1e-5, atol=1e-6)
        _loss(out, proj, None).backward()
        _loss(ref_out, proj, None).backward()
        opt.step()
        ref.step()
    tier = ec.tables["t0"].tier
    if layout == "cache":  # the group's tables share one device cache (ember.tiers.group_cache)
        assert isinstance(tier, GroupCacheView) and tier.cache is ec.tables["t1"].tier.cache
        assert tier.arena_rows > 0 and len(tier.slow) > 0  # rows really live in both tiers
    else:
        assert len(tier.fast) > 0 and len(tier.slow) > 0
    assert_tables_equal(ec, ref)


def test_a_split_into_groups_is_logged_once_with_the_reason(caplog):
    with caplog.at_level(logging.INFO, logger="ember.embedding"):
        EmbeddingCollection(_tables(OPTIMIZERS[0]), _features("sum"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "2 table groups" in lines[0] and "differs in dim, record width" in lines[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ember.embedding"):
        EmbeddingCollection(_tables(OPTIMIZERS[0])[:3], _features("sum")[:4])
    assert not caplog.records  # one group: nothing to report


def test_seeds_are_derived_per_table_and_from_the_run_seed():
    feats = [FeatureConfig(name="a", table="x"), FeatureConfig(name="b", table="y")]
    sf = SparseFeatures(["a", "b"], torch.tensor([7, 7]), torch.tensor([1, 1]))
    with torch.no_grad():
        out0 = EmbeddingCollection([TableConfig(name="x", dim=D), TableConfig(name="y", dim=D)], feats, seed=0).eval()(sf)
        out1 = EmbeddingCollection([TableConfig(name="x", dim=D), TableConfig(name="y", dim=D)], feats, seed=1).eval()(sf)
        fixed = EmbeddingCollection([TableConfig(name="x", dim=D, seed=3), TableConfig(name="y", dim=D, seed=3)], feats, seed=9).eval()(sf)
    assert not torch.equal(out0["a"], out0["b"])  # same ID, different tables: different rows
    assert not torch.equal(out0["a"], out1["a"])  # the run seed changes every init
    assert torch.equal(fixed["a"], fixed["b"])  # an explicit seed is kept as given


SCHEDULED = [
    {"type": "sgd", "lr": 0.2, "schedule": {"warmup_steps": 3, "decay": "cosine", "decay_steps": 4}},
    {"type": "rowwise_adagrad", "lr": 0.1, "schedule": {"warmup_steps": 2, "decay": "step", "decay_steps": 2, "gamma": 0.5}},
    {"type": "adam", "lr": 0.01, "schedule": {"decay": "linear", "decay_steps": 5, "final_ratio": 0.2}},
]


@pytest.mark.parametrize("opt", SCHEDULED, ids=[o["type"] for o in SCHEDULED])
def test_scheduled_optimizers_equal_reference_and_differ_from_unscheduled(opt):
    """Grouped tables with a schedule update exactly as the per-table reference, at the lr of
    each global step (and the schedule does change the result)."""
    ec, ref = run_both(_tables(opt), _features("sum"), _batches(7, vocab=4), use={"a", "d"})
    assert_tables_equal(ec, ref)
    plain = {k: v for k, v in opt.items() if k != "schedule"}
    ec_plain, _ = run_both(_tables(plain), _features("sum"), _batches(7, vocab=4), use={"a", "d"})
    a, b = _sorted_items(ec.groups[0].tables[0]), _sorted_items(ec_plain.groups[0].tables[0])
    assert torch.equal(a[0], b[0]) and not torch.allclose(a[1], b[1])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("use", [None, {"a", "c", "e"}], ids=["all-reached", "t1-unreached"])
def test_one_pass_update_equals_update_then_write_back(dtype, use, monkeypatch):
    """``GroupLookup.apply`` runs row-wise Adagrad inside the native write (one pass over the
    batch's records) when every table reached the loss: outputs, stored rows (every bit, bf16
    rounding included), table steps and the lookup's records equal ``update`` then
    ``write_back``, with an lr and eps per table and an lr schedule; a table that missed the
    loss sends the batch through the two phases."""
    import ember.embedding.group as group_module
    from ember import _native

    sched = {"type": "rowwise_adagrad", "lr": 0.2, "schedule": {"warmup_steps": 3}}
    tables = [TableConfig(name="t0", dim=D, optimizer={"type": "rowwise_adagrad", "lr": 0.1}, dtype=dtype),
              TableConfig(name="t1", dim=D, optimizer={"type": "rowwise_adagrad", "lr": 0.3, "eps": 1e-4}, dtype=dtype),
              TableConfig(name="t2", dim=D, optimizer=sched, dtype=dtype),
              TableConfig(name="t3", dim=D + 1, optimizer={"type": "rowwise_adagrad", "lr": 0.1}, dtype=dtype)]
    batches = _batches(6, vocab=20)
    fused_writes = []
    write_rows = _native.write_rows

    def spy(tables_, *a, adagrad=None, **k):  # (tables in the call, one pass?)
        fused_writes.append((len(tables_), adagrad is not None))
        return write_rows(tables_, *a, adagrad=adagrad, **k)

    monkeypatch.setattr(_native, "write_rows", spy)

    def train(one_pass: bool):
        if not one_pass:
            monkeypatch.setattr(group_module.GroupLookup, "_fused_hyper", lambda self, step: None)
        ec = EmbeddingCollection(tables, _features("sum"), seed=2)
        opt = SparseOptimizer(ec)
        proj = torch.linspace(-1, 1, D + 1)
        outs, records = [], []
        for sf in batches:
            lk = ec.plan(sf).fetch()
            out = ec(sf, lk)
            outs.append({k: v.detach().clone() for k, v in out.items()})
            _loss(out, proj, use).backward()
            opt.step()
            records.append([g.records.clone() for g in lk.groups])
        return ec, outs, records

    fast, fast_outs, fast_rec = train(True)
    took = list(fused_writes)
    slow, slow_outs, slow_rec = train(False)
    assert any(one for _, one in fused_writes[len(took):]) is False  # the reference: two passes throughout
    assert ((3, True) in took) == (use is None)  # t1 unreached: the group of t0-t2 in two passes
    assert (1, True) in took  # t3's group (reached) in one pass either way
    for a, b in zip(fast_outs, slow_outs):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for a, b in zip(fast_rec, slow_rec):
        assert all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b))
    for name in fast.tables:
        assert fast.tables[name].step == slow.tables[name].step
        ids_a, rec_a = _sorted_items(fast.tables[name])
        ids_b, rec_b = _sorted_items(slow.tables[name])
        assert torch.equal(ids_a, ids_b), name
        assert torch.equal(rec_a.view(torch.int32), rec_b.view(torch.int32)), name


def test_two_passes_are_said_once_with_the_reason(caplog):
    """A group whose optimizer the one-pass update does not serve says so once, then trains."""
    from ember import once

    once.forget("group.fused_update")
    with caplog.at_level(logging.INFO, logger="ember.embedding"):
        ec = EmbeddingCollection(_tables(OPTIMIZERS[3]), _features("sum"))
        opt, proj = SparseOptimizer(ec), torch.linspace(-1, 1, D + 1)
        for sf in _batches(3):
            _loss(ec(sf), proj, None).backward()
            opt.step()
    lines = [r.getMessage() for r in caplog.records if "two passes" in r.getMessage()]
    assert len(lines) == 1 and "not row-wise Adagrad" in lines[0]


@pytest.mark.parametrize("case", ["unreached", "min_count"])
def test_the_one_pass_update_not_taken_for_a_step_is_said_with_the_reason(caplog, case):
    """Row-wise Adagrad on host rows takes the one-pass update, except in a step where a table's
    features did not reach the loss or bf16 rows below min_count are held back: those steps take
    the two passes, said once with the reason (they were taken silently)."""
    from ember import once

    once.forget("group.fused_update")
    kw = {"min_count": 2, "dtype": "bf16"} if case == "min_count" else {}  # (fp32 rows take one pass: test_min_count_group.py)
    with caplog.at_level(logging.INFO, logger="ember.embedding"):
        ec = EmbeddingCollection(_tables(OPTIMIZERS[2], **kw), _features("sum"))
        opt, proj = SparseOptimizer(ec), torch.linspace(-1, 1, D + 1)
        use = {k for k, f in zip(KEYS, _features("sum")) if f.table_name != "t1"} if case == "unreached" else None
        for sf in _batches(3):
            _loss(ec(sf), proj, use).backward()
            opt.step()
    lines = [r.getMessage() for r in caplog.records if "two passes" in r.getMessage()]
    why = "did not reach the loss" if case == "unreached" else "below min_count are held back"
    assert len(lines) == 1 and why in lines[0], lines
