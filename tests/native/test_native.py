"""The compiled core against its pure fallbacks: same results over random operations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import _native

native = pytest.mark.skipif(not _native.is_available(), reason="ember native core not available (not built, or EMBER_NATIVE=0)")


def test_import_works_and_require_names_the_fix():
    if _native.is_available():
        assert _native.require() is not None
    else:
        with pytest.raises(ImportError, match="EMBER_NATIVE=0" if _native._DISABLED else "pip install -e"):
            _native.require()


def _table(cap: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(cap, dtype=np.int64), np.full(cap, -1, dtype=np.int32)


def _probe_all(table: tuple[np.ndarray, np.ndarray], ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """probe and _probe_py on one table: the same buckets, slots and count, or the test fails."""
    got = []
    for fn in (_native.probe, _native._probe_py):
        bucket, slot = np.full(ids.size, 7, dtype=np.int64), np.full(ids.size, 7, dtype=np.int32)
        got.append((bucket, slot, fn(*table, ids, bucket, slot)))
    (b1, s1, n1), (b2, s2, n2) = got
    np.testing.assert_array_equal(b1, b2)
    np.testing.assert_array_equal(s1, s2)
    assert n1 == n2 == int(np.count_nonzero(s1 >= 0))
    return b1, s1, n1


@native
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_probe_and_place_match_their_fallbacks_over_random_ops(seed):
    """One table takes random inserts and deletes. Each insert runs through place and _place_py
    on two copies: the same empty buckets used, the same buckets taken, the same ID -> slot map
    (IDs of one insert may swap buckets); the table goes on as one or the other, so it is written
    by both. probe and _probe_py give the same buckets and slots on it, those of a dict."""
    rng = np.random.default_rng(seed)
    table = _table(1 << 13)
    pool = rng.integers(-(2**63), 2**63 - 1, size=5000)
    pool[:3] = [0, -1, 2**63 - 1]
    ref: dict[int, int] = {}
    next_slot = 0
    for step in range(60):
        batch = rng.choice(pool, size=rng.integers(0, 900))  # duplicates allowed in lookups
        _, slot, _ = _probe_all(table, batch)
        np.testing.assert_array_equal(slot, [ref.get(int(k), -1) for k in batch])
        new = np.unique(batch[slot < 0])
        slots = np.arange(next_slot, next_slot + new.size, dtype=np.int32)
        next_slot += new.size
        a, b = [tuple(x.copy() for x in table) for _ in range(2)]
        assert _native.place(*a, new, slots) == _native._place_py(*b, new, slots)  # the same empty buckets used
        np.testing.assert_array_equal(np.minimum(a[1], -1), np.minimum(b[1], -1))  # the same buckets taken
        ref.update(zip(new.tolist(), slots.tolist()))
        for t in (a, b):
            live = t[1] >= 0
            assert dict(zip(t[0][live].tolist(), t[1][live].tolist())) == ref
        table = (a, b)[step % 2]
        if step % 4 == 3 and ref:
            victims = np.concatenate([rng.choice(np.array(list(ref), dtype=np.int64), size=min(300, len(ref)), replace=False), pool[-5:]])
            bucket, _, _ = _probe_all(table, victims)
            table[1][bucket[bucket >= 0]] = -2
            for v in victims.tolist():
                ref.pop(v, None)
    assert (table[1] == -2).any() and len(ref) > 1000


def test_place_into_a_full_table_raises():
    for fn in (_native.place, _native._place_py) if _native.is_available() else (_native._place_py,):
        keys, slots = _table(16)
        fn(keys, slots, np.arange(16, dtype=np.int64), np.arange(16, dtype=np.int32))
        with pytest.raises(RuntimeError, match="full"):
            fn(keys, slots, np.array([99], dtype=np.int64), np.array([16], dtype=np.int32))


@pytest.mark.parametrize("seed", [0, 1])
def test_rehash_moves_every_live_entry_as_place_of_the_items_does(seed):
    """A table with deleted buckets rehashed into one 2x and 4x larger: native and fallback take
    the same buckets (the live entries only, in bucket order), use as many empty ones, and map
    every live ID to its slot; deleted IDs are gone."""
    rng = np.random.default_rng(seed)
    keys, slots = _table(1 << 10)
    ids = np.unique(rng.integers(-(2**63), 2**63 - 1, size=700))
    _native._place_py(keys, slots, ids, np.arange(ids.size, dtype=np.int32))
    gone = rng.choice(ids, size=100, replace=False)
    bucket = np.empty(gone.size, np.int64)
    _native._probe_py(keys, slots, gone, bucket, np.empty(gone.size, np.int32))
    slots[bucket] = -2
    live = slots >= 0
    want = dict(zip(keys[live].tolist(), slots[live].tolist()))
    for cap in (1 << 11, 1 << 12):
        fns = (_native.rehash, _native._rehash_py) if _native.is_available() else (_native._rehash_py,)
        tables = []
        for fn in fns:
            t = _table(cap)
            assert fn(*t, keys, slots) == len(want)  # every one into an empty bucket
            tables.append(t)
        for t in tables:
            got = t[1] >= 0
            assert dict(zip(t[0][got].tolist(), t[1][got].tolist())) == want
            _, found, n = _probe_all(t, gone)
            assert n == 0
        ref = _table(cap)  # place of the items, in bucket order: the same buckets
        _native.place(*ref, keys[live], slots[live]) if _native.is_available() else _native._place_py(*ref, keys[live], slots[live])
        for t in tables:
            np.testing.assert_array_equal(np.minimum(t[1], -1), np.minimum(ref[1], -1))
    with pytest.raises(RuntimeError, match="full"):
        fns[0](*_table(16), keys, slots)


def _tags(rng: np.random.Generator, n: int, free: float) -> np.ndarray:
    """A tag array: ~``free`` of the slots empty, some deleted, few distinct tags (collisions)."""
    t = rng.integers(2, 40, size=n).astype(np.uint16)
    t[rng.random(n) < free] = 0
    t[rng.random(n) < 0.1] = 1
    return t


@native
@pytest.mark.parametrize("n_slots,free", [(5000, 0.2), (5000, 0.02), (7, 0.0), (3, 0.4)])
def test_tag_find_matches_its_fallback(n_slots, free):
    rng = np.random.default_rng(n_slots)
    tags = _tags(rng, n_slots, free)
    pos = rng.integers(0, n_slots, size=3000)
    want = rng.integers(2, 45, size=3000).astype(np.uint16)  # some tags nowhere in the array
    got, ref = np.full(3000, 7, dtype=np.int64), np.full(3000, 7, dtype=np.int64)
    _native.tag_find(tags, pos, want, got)
    _native._tag_find_py(tags, pos, want, ref)
    np.testing.assert_array_equal(got, ref)
    assert (got >= 0).any() and (free == 0 or (got < 0).any())
    hit = got >= 0
    assert (tags[got[hit]] == want[hit]).all()
    for fn in (_native.tag_find, _native._tag_find_py):
        with pytest.raises(ValueError, match="out of range"):
            fn(tags, np.array([n_slots]), np.array([2], dtype=np.uint16), np.empty(1, dtype=np.int64))


@native
@pytest.mark.parametrize("n_slots,claims", [(5000, 2500), (64, 60), (5, 3)])
def test_tag_claim_matches_its_fallback(n_slots, claims):
    """The same free slots end up taken and the same empty ones used; each ID's slot carries its
    tag and lies at the end of a run of taken slots from its start (so a probe finds it)."""
    rng = np.random.default_rng(claims)
    tags = _tags(rng, n_slots, 0.6)
    free = int(np.count_nonzero(tags <= 1))
    claims = min(claims, free)
    pos = rng.integers(0, n_slots, size=claims)
    tag = rng.integers(2, 40, size=claims).astype(np.uint16)
    after, outs, used = [], [], []
    for fn in (_native.tag_claim, _native._tag_claim_py):
        t, out = tags.copy(), np.full(claims, -7, dtype=np.int64)
        used.append(fn(t, pos, tag, out))
        after.append(t)
        outs.append(out)
    assert used[0] == used[1] == int(np.count_nonzero((tags == 0) & (after[0] > 1)))
    np.testing.assert_array_equal(after[0] > 1, after[1] > 1)
    for t, out in zip(after, outs):
        assert np.unique(out).size == claims and (t[out] == tag).all() and (tags[out] <= 1).all()
        for p, o in zip(pos.tolist(), out.tolist()):
            run = np.arange(p, p + (o - p) % n_slots) % n_slots
            assert (t[run] > 1).all()
    for fn in (_native.tag_claim, _native._tag_claim_py):
        full = np.full(n_slots, 5, dtype=np.uint16)
        with pytest.raises(RuntimeError, match="full"):
            fn(full, np.array([0]), np.array([3], dtype=np.uint16), np.empty(1, dtype=np.int64))


@pytest.mark.parametrize("bounds", [[0, 5], [0, 2, 1, 3], [1, 3], []])
def test_unique_segments_refuses_bounds_outside_the_ids_before_the_loop_reads(bounds):
    with pytest.raises(ValueError, match=r"bounds must rise from 0 to len\(ids\)=3"):
        _native.unique_segments(np.array([4, 5, 4], np.int64), np.array(bounds, np.int64))


@pytest.mark.parametrize("impl", ["wrapper", "fallback"])
def test_unique_segments_matches_per_segment_unique(impl):
    fn = _native.unique_segments if impl == "wrapper" else _native._unique_segments_py
    rng = np.random.default_rng(3)
    for _ in range(20):
        sizes = rng.integers(0, 300, size=rng.integers(1, 6))
        ids = rng.integers(-50, 50, size=int(sizes.sum())) * (2**50)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        uniq, inverse, counts = fn(ids, bounds)
        start = 0
        for j in range(sizes.size):
            seg = ids[bounds[j] : bounds[j + 1]]
            u = uniq[start : start + counts[j]]
            _, first = np.unique(seg, return_index=True)
            np.testing.assert_array_equal(u, seg[np.sort(first)])  # first-occurrence order
            np.testing.assert_array_equal(uniq[inverse[bounds[j] : bounds[j + 1]]], seg)
            assert inverse[bounds[j] : bounds[j + 1]].min(initial=start) >= start
            start += counts[j]
        assert start == uniq.size


@native
@pytest.mark.parametrize("seed,stream,dim", [(0, 0, 16), (3, 1, 5), (11, 2, 1), (2, 0, 0)])
def test_uniform01_native_matches_its_fallback_bit_for_bit(seed, stream, dim):
    from ember.embedding import init
    from ember.mix import mix64

    ids = np.random.default_rng(seed).integers(-(2**63), 2**63 - 1, size=3000)
    key = mix64(np.array([seed * 2 + stream], dtype=np.uint64))
    per_row = mix64(np.arange(3000, dtype=np.uint64))
    for keys, mul, add in ((key, 1.0, 0.0), (key, 0.5, -0.25), (per_row, 1.0, 0.0), (per_row, 0.125, -0.0625)):
        got, ref = np.full((3000, dim), 7.0, dtype=np.float32), np.full((3000, dim), 7.0, dtype=np.float32)
        _native.uniform01(ids, keys, dim, got, mul, add)
        _native._uniform01_py(ids, keys, dim, ref, mul, add)
        np.testing.assert_array_equal(got, ref)
    u = init._uniform01(ids, dim, seed, stream)
    ref = np.empty_like(u)
    _native._uniform01_py(ids, key, dim, ref)
    np.testing.assert_array_equal(u, ref)
    assert u.size == 0 or (0 <= u.min() and u.max() < 1)


def test_per_row_seeds_equal_each_tables_own_init():
    """One init call over the new rows of several tables (a seed per row) gives each table's rows."""
    from ember.embedding.init import InitializerConfig, init_rows

    ids = torch.from_numpy(np.random.default_rng(4).integers(-(2**63), 2**63 - 1, size=900))
    seeds = np.repeat(np.array([0, 7, 3]), [300, 500, 100])
    for cfg in (InitializerConfig(), InitializerConfig(type="normal", std=0.3)):
        together = init_rows(ids, 8, cfg, seeds)
        apart = torch.cat([init_rows(ids[a:b], 8, cfg, s) for a, b, s in [(0, 300, 0), (300, 800, 7), (800, 900, 3)]])
        assert torch.equal(together, apart)
        assert not torch.equal(together[:300], init_rows(ids[:300], 8, cfg, 7))  # the seed matters


@native
@pytest.mark.parametrize("dim", [1, 16, 33])
def test_index_add_rows_native_equals_torch_index_add(dim):
    g = torch.Generator().manual_seed(dim)
    index = torch.randint(0, 50, (5000,), generator=g)  # many repeats of each row
    src = torch.randn(5000, dim, generator=g)
    base = torch.randn(50, dim, generator=g)
    got = _native.index_add_rows(base.clone(), index, src)
    assert torch.equal(got, _native._index_add_rows_py(base.clone(), index, src))  # same sums, same order
    wide = torch.randn(5000, 3, dim, generator=g)  # a row-strided view: one feature of [B, F, D]
    got = _native.index_add_rows(base.clone(), index, wide[:, 1])
    assert torch.equal(got, _native._index_add_rows_py(base.clone(), index, wide[:, 1].contiguous()))
    with pytest.raises(IndexError, match="out of range"):
        _native.index_add_rows(base.clone(), torch.tensor([50]), torch.ones(1, dim))
    assert torch.equal(_native.index_add_rows(base.double(), index, src.double()), base.double().index_add_(0, index, src.double()))


@native
@pytest.mark.parametrize("dim", [1, 16, 33])
def test_take_rows_equals_index_select(dim, monkeypatch):
    """The single-hot pooling's gather, on one thread and in row ranges on two, against torch's
    index_select; other layouts (a strided source, float64, a tensor that requires grad) too."""
    g = torch.Generator().manual_seed(dim)
    src = torch.randn(300, dim, generator=g)
    index = torch.randint(0, 300, (40_000,), generator=g)
    want = src.index_select(0, index)
    assert torch.equal(_native.take_rows(src, index), want)
    monkeypatch.setattr(_native, "MIN_PART_ROWS", 1000)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert _native.part_count(index.numel()) == 3 or not _native.native_parts()  # really split
    assert torch.equal(_native.take_rows(src, index), want)
    leaf = src.clone().requires_grad_()
    assert torch.equal(_native.take_rows(leaf, index), want)
    wide = torch.randn(300, 2 * dim, generator=g)[:, ::2]
    assert torch.equal(_native.take_rows(wide, index), wide.index_select(0, index))
    assert torch.equal(_native.take_rows(src.double(), index), want.double())
    assert _native.take_rows(src, index[:0]).shape == (0, dim)
    with pytest.raises(IndexError, match="out of range"):
        _native.take_rows(src, torch.tensor([300]))


@native
@pytest.mark.parametrize("dim", [1, 16, 33])
def test_take_rows_gathers_a_records_weights_in_place(dim, monkeypatch):
    """A group's weights are the first ``dim`` columns of its records [U, width]: row-strided.
    The core gathers them in place (torch's fallback is not called), the same rows as
    index_select, also for a view that starts inside the buffer and ends at its last float."""
    from ember._native import sparse

    def fallback(src, index):
        raise AssertionError("take_rows fell back to torch for a row-strided float32 view")

    g = torch.Generator().manual_seed(dim)
    records = torch.randn(300, dim + 3, generator=g)
    index = torch.randint(0, 300, (5_000,), generator=g)
    monkeypatch.setattr(sparse, "_take_rows_py", fallback)
    weights = records[:, :dim].detach().requires_grad_()  # as pooling hands it: a leaf view
    assert torch.equal(_native.take_rows(weights, index), records[:, :dim].index_select(0, index))
    tail = records[7:, 3:]  # starts inside a row, ends with the buffer
    inside = index[index < 293]
    assert torch.equal(_native.take_rows(tail, inside), tail.index_select(0, inside))
    with pytest.raises(IndexError, match="out of range"):
        _native.take_rows(tail, torch.tensor([293]))


@native
def test_single_hot_pooling_takes_the_core(monkeypatch):
    """A group's single-hot features pool through the core's gather from the records in place
    (it once fell back to torch without a word: ``Tensor.to`` makes no contiguous copy on the
    same device), and the pooled rows are the stored ones."""
    from ember._native import sparse
    from ember.batch import SparseFeatures
    from ember.embedding import EmbeddingCollection, FeatureConfig, TableConfig

    def fallback(src, index):
        raise AssertionError("single-hot pooling fell back to torch's index_select")

    ec = EmbeddingCollection([TableConfig(name="t", dim=8), TableConfig(name="u", dim=8)],
                             [FeatureConfig(name="a", table="t"), FeatureConfig(name="b", table="u")])
    sf = SparseFeatures(["a", "b"], torch.tensor([5, 9, 5, 1, 1, 2]), torch.ones(6, dtype=torch.int64))
    want = ec(sf)  # rows made and read back (fresh rows are a pure function of the ID)
    monkeypatch.setattr(sparse, "_take_rows_py", fallback)
    got = ec(sf)
    assert torch.equal(got["a"], want["a"]) and torch.equal(got["b"], want["b"])


@pytest.mark.parametrize("impl", ["wrapper", "fallback"])
def test_index_add_features_equals_feature_by_feature_index_add(impl):
    """Row-strided slices of one [B, F', D] gradient (as a model's stack hands them back), some
    features without a gradient (None), indices shared across features (a shared table), values
    over 16 orders of magnitude (another summation order would round apart): bit for bit."""
    fn = _native.index_add_features if impl == "wrapper" else _native._index_add_features_py
    g = torch.Generator().manual_seed(3)
    b, f, d, u = 300, 5, 16, 120
    grad = torch.randn(b, f + 1, d, generator=g) * torch.logspace(-8, 8, b).view(b, 1, 1)
    srcs = [grad[:, i + 1] for i in range(f)]
    srcs[2] = None
    index = torch.randint(0, u, (f * b,), generator=g)
    base = torch.randn(u, d, generator=g)
    want = base.clone()
    for i, s in enumerate(srcs):
        if s is not None:
            want.index_add_(0, index[i * b : (i + 1) * b], s.contiguous())
    got = fn(base.clone(), index, srcs)
    assert torch.equal(got, want)  # the same order: feature by feature, each in batch order
    if impl == "wrapper" and _native.is_available():
        with pytest.raises(IndexError, match="out of range"):
            fn(base.clone(), torch.full((f * b,), u), srcs)


def test_index_add_features_takes_gradients_of_several_storages_and_refuses_others():
    """Features' gradients from different tensors (slices of two stacked gradients, a separate
    one, one starting past its storage's start) are read where they lie, bit for bit as feature by
    feature; float64 gradients, or single-row features, give the same sums on the torch path."""
    g = torch.Generator().manual_seed(5)
    b, d, u = 200, 8, 90
    one, two = torch.randn(b, 3, d, generator=g), torch.randn(b, 4, d, generator=g)
    own = torch.randn(b + 1, d, generator=g)[1:]  # a storage offset of d
    srcs = [one[:, 1], two[:, 0], own, one[:, 2], None, two[:, 3]]
    index = torch.randint(0, u, (len(srcs) * b,), generator=g)
    base = torch.randn(u, d, generator=g)

    def by_feature(out: torch.Tensor, idx: torch.Tensor, grads: list) -> torch.Tensor:
        n = idx.numel() // len(grads)
        for i, src in enumerate(grads):
            if src is not None:
                out.index_add_(0, idx[i * n : (i + 1) * n], src.contiguous())
        return out

    assert torch.equal(_native.index_add_features(base.clone(), index, srcs), by_feature(base.clone(), index, srcs))
    wide = [None if x is None else x.double() for x in srcs]
    assert torch.equal(_native.index_add_features(base.double(), index, wide), by_feature(base.double(), index, wide))
    single = [torch.randn(1, d, generator=g), torch.ones(1, 1).expand(1, d), torch.randn(1, d, generator=g)]  # (an expanded one: a sum's gradient)
    idx = torch.randint(0, u, (3,), generator=g)
    assert torch.equal(_native.index_add_features(base.clone(), idx, single), by_feature(base.clone(), idx, single))


def test_rowwise_adagrad_equals_torch_ops_on_a_records_buffer():
    """The one-pass kernel on [weights | accumulator] views of one buffer == the torch ops; tensors
    it does not take (float64) get the torch ops too."""
    from ember.optim import RowWiseAdagrad

    g = torch.Generator().manual_seed(8)
    rec = torch.rand(500, 17, generator=g)
    grads = torch.randn(500, 16, generator=g)
    opt = RowWiseAdagrad(lr=0.05, eps=1e-8)
    got = rec.clone()
    assert _native.rowwise_adagrad_(got[:, :16], got[:, 16:], grads, opt.lr, opt.eps)
    want = rec.clone()
    _native._rowwise_adagrad_py(want[:, :16], want[:, 16:], grads, opt.lr, opt.eps)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)  # the mean's sum order may differ by an ulp
    twice = want.clone()
    twice[:, 16:].add_(grads.square().mean(dim=1, keepdim=True))  # the optimizer's formula, spelt out
    twice[:, :16].addcdiv_(grads, twice[:, 16:].sqrt().add_(opt.eps), value=-opt.lr)
    d = want.double()
    assert _native.rowwise_adagrad_(d[:, :16], d[:, 16:], grads.double(), opt.lr, opt.eps)  # the torch ops
    torch.testing.assert_close(d.float(), twice, rtol=1e-6, atol=1e-7)


@native
@pytest.mark.parametrize("dim", [1, 3, 7, 8, 9, 16, 17, 33, 64])
def test_rowwise_adagrad_sums_squares_in_its_documented_order(dim):
    """The kernel's update (the mean of squares in double over 8 partial sums, column c into sum
    c % 8, added as ((s0+s4)+(s2+s6))+((s1+s5)+(s3+s7)); then float32 as documented) spelt out
    in numpy: the same bits at every width around the partial sums' boundaries, for gradients
    from 1e-6 to 10 (write_rows' optimizer shares the arithmetic)."""
    g = torch.Generator().manual_seed(dim)
    rec = torch.rand(300, dim + 1, generator=g)
    grads = torch.randn(300, dim, generator=g) * torch.logspace(-6, 1, 300).unsqueeze(1)
    lr, eps = 0.05, 1e-8
    got = rec.clone()
    assert _native.rowwise_adagrad_(got[:, :dim], got[:, dim:], grads, lr, eps)
    g64 = grads.numpy().astype(np.float64)
    lanes = np.zeros((300, 8))
    for c in range(dim):
        lanes[:, c % 8] += g64[:, c] * g64[:, c]
    sq = ((lanes[:, 0] + lanes[:, 4]) + (lanes[:, 2] + lanes[:, 6])) + ((lanes[:, 1] + lanes[:, 5]) + (lanes[:, 3] + lanes[:, 7]))
    w, st = rec.numpy()[:, :dim].copy(), rec.numpy()[:, dim].copy()
    acc = (st + (sq * (1.0 / dim)).astype(np.float32)).astype(np.float32)
    denom = (np.sqrt(acc) + np.float32(eps)).astype(np.float32)
    w = (w + (np.float32(-lr) * grads.numpy()) / denom[:, None]).astype(np.float32)
    np.testing.assert_array_equal(got[:, dim].numpy(), acc)
    np.testing.assert_array_equal(got[:, :dim].numpy(), w)


def test_chunks_balance_weight_and_respect_cuts(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert _native.chunks([5, 5, 5, 5, 5, 5], min_rows=1) == [(0, 2), (2, 4), (4, 6)]
    assert _native.chunks([5] * 6, min_rows=100) == [(0, 6)]  # too little work to hand off
    parts = _native.chunks([4] * 6, cuts=[True, False, False, True, False, False], min_rows=1)
    assert parts == [(0, 3), (3, 6)]  # items 0-2 and 3-5 must stay together


@native
def test_kernels_split_over_threads_equal_one_thread(monkeypatch):
    """Each kernel run in parts on several threads gives exactly the one-thread result (read_rows
    and write_rows: tests/native/test_rows.py)."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, 400, (6000,), generator=g).numpy()
    bounds = np.array([0, 1000, 1000, 2500, 4000, 6000])
    grad = torch.randn(300, 6, 4, generator=g)
    owner = [0, 0, 1, 2, 2]  # table of each feature: rows 10 * owner .. are that table's
    index = (torch.randint(0, 50, (5 * 300,), generator=g) % 10) + 10 * torch.tensor(owner).repeat_interleave(300)
    results = {}
    for least in (1, 10**12):  # parts on OpenMP's threads / everything on this thread
        monkeypatch.setattr(_native, "MIN_PART_ROWS", least)
        uniq, inverse, counts = _native.unique_segments(ids, bounds)
        out = _native.index_add_features(torch.zeros(50, 4), index, [grad[:, f + 1] for f in range(5)], owner)
        rec = torch.rand(5000, 5, generator=torch.Generator().manual_seed(1))
        _native.rowwise_adagrad_(rec[:, :4], rec[:, 4:], torch.ones(5000, 4) * 0.1, 0.05, 1e-8)
        init = np.empty((40000, 3), dtype=np.float32)
        _native.uniform01(np.arange(40000), np.arange(40000, dtype=np.uint64), 3, init, 2.0, -1.0)
        results[least] = {"unique": (uniq, inverse, counts), "out": out, "rec": rec, "init": init}
    a, b = results[1], results[10**12]
    for k in ("out", "rec"):
        assert torch.equal(a[k], b[k]), k
    for x, y in zip(a["unique"], b["unique"]):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a["init"], b["init"])


@native
def test_uniform01_per_row_scales_equal_one_call_per_scale():
    rng = np.random.default_rng(4)
    ids = rng.integers(-(2**62), 2**62, size=3000)
    keys = rng.integers(0, 2**63, size=3000).astype(np.uint64)
    scale = rng.choice([0.05, 0.25, 1.0], size=3000)
    mul, add = (2 * scale).astype(np.float32), (-scale).astype(np.float32)
    got, ref = np.empty((3000, 8), np.float32), np.empty((3000, 8), np.float32)
    _native.uniform01(ids, keys, 8, got, mul, add)
    _native._uniform01_py(ids, keys, 8, ref, mul, add)
    for s in (0.05, 0.25, 1.0):
        rows = np.flatnonzero(scale == s)
        one = np.empty((rows.size, 8), np.float32)
        _native.uniform01(ids[rows], keys[rows], 8, one, float(np.float32(2 * s)), -float(np.float32(s)))
        np.testing.assert_array_equal(got[rows], one)  # bit for bit
    np.testing.assert_array_equal(got, ref)


@native
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("width,dim", [(11, 8), (7, 5), (17, 16)])
def test_fresh_uniform_native_matches_its_fallback_and_uniform01_bit_for_bit(bf16, width, dim):
    """New rows written in place: the kernel (on an AVX-512 CPU its vector build), its numpy
    fallback, and uniform01 + codec rounding (the reference) give the same bits, at scattered
    rows, for ordinary scales and for mul/add that make subnormal, infinite and NaN values (the
    rounding's special cases), whole vectors of columns and a remainder; other rows are left
    alone."""
    from ember.embedding.codec import _bf16_bits, _widen

    rng = np.random.default_rng(5)
    n = 3000
    ids = rng.integers(-(2**63), 2**63 - 1, size=n)
    keys = rng.integers(0, 2**63, size=n).astype(np.uint64)
    at = rng.permutation(2 * n)[:n]
    fill = np.array([0.5, -1.0, 3.0, 0.25][: width - dim], dtype=np.float32)
    scale = rng.choice([0.05, 0.25, 1.0], size=n)
    cases = [((2 * scale).astype(np.float32), (-scale).astype(np.float32)), (0.5, -0.25),
             (np.float32(3e-38), -np.float32(1e-38)), (3e38, 3e38), (np.inf, -np.inf)]
    for mul, add in cases:
        if not isinstance(mul, np.ndarray):
            mul, add = float(mul), float(add)
        got, ref = np.full((2 * n, width), 7.0, np.float32), np.full((2 * n, width), 7.0, np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            _native.fresh_uniform(ids, keys, at, got, dim, mul, add, fill, bf16)
            _native._fresh_uniform_py(ids, keys, at, ref, dim, mul, add, fill, bf16)
            w = np.empty((n, dim), np.float32)
            _native._uniform01_py(ids, keys, dim, w, mul, add)
        if bf16:
            w = _widen(_bf16_bits(torch.from_numpy(w), None).to(torch.int16), "bf16").numpy()
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
        np.testing.assert_array_equal(got[at, :dim].view(np.uint32), w.view(np.uint32))
        np.testing.assert_array_equal(got[at, dim:], np.broadcast_to(fill, (n, width - dim)))
        untouched = np.setdiff1d(np.arange(2 * n), at)
        assert (got[untouched] == 7.0).all()
    with pytest.raises(IndexError, match="outside"):
        _native.fresh_uniform(ids[:1], keys[:1], np.array([2 * n]), got, dim, 1.0, 0.0, fill, bf16)


def _csv_text_cases() -> list[bytes]:
    """Blocks of CSV-like text with and without each hazard, runs of digits of 19 and 20 at every
    alignment (the kernel reads 8 bytes a step), and random bytes."""
    rng = np.random.default_rng(7)
    cases = [b"", b"1", b"a,b\n", b"0x1f\n", b"X", b"nan(1)\n", b"9" * 19, b"9" * 20, b"-" + b"9" * 19 + b"\n"]
    for pad in range(9):
        for run in (19, 20, 27):
            cases.append(b"a" * pad + b"1" * run + b",\n")
            cases.append(b"1,2\t" * pad + b"5" * run)
    for _ in range(200):
        n = int(rng.integers(1, 300))
        alphabet = np.frombuffer(b"0123456789,\t\n-.ab \"", dtype=np.uint8)
        cases.append(rng.choice(alphabet, size=n).tobytes())
        cases.append(rng.integers(0, 256, size=n, dtype=np.uint8).tobytes())
    return cases


@native
def test_csv_hazards_matches_its_fallback():
    for case in _csv_text_cases():
        assert _native.csv_hazards(case) == _native._csv_hazards_py(case), case


def test_csv_hazards_flags():
    for fn in (_native.csv_hazards, _native._csv_hazards_py):
        assert fn(b"1,22,-9223372036854775808,a\n") == 0  # 19 digits are the text path's own
        assert fn(b"1,0x1f\n") == _native.CSV_HEX
        assert fn(b"nan(1),2\n") == _native.CSV_PAREN
        assert fn(b"7," + b"0" * 20 + b"\n") == _native.CSV_LONG_DIGITS
        assert fn(b"X(" + b"1" * 25) == _native.CSV_HEX | _native.CSV_PAREN | _native.CSV_LONG_DIGITS


def test_run_each_runs_every_task_once_in_order_and_nests_without_waiting_on_itself(monkeypatch):
    """Tasks taken one at a time by this thread and the pool; results in the tasks' order; inside
    a task a kernel runs as one part and a nested ``run_each`` in line (it would wait on the pool
    it occupies); the first error raises after every started task has finished."""
    import threading
    import time

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # one pool thread: a nested wait would hang
    where: list[str] = []

    def task(k: int):
        def run():
            me = threading.current_thread().name
            where.append(me)
            time.sleep(0.004 * (1 + k % 3))  # uneven costs
            nested = _native.run_each([lambda: threading.current_thread().name] * 2)
            return k, nested == [me, me] and _native.part_count(10**6) == 1  # in line, on the task's own thread
        return run

    got = _native.run_each([task(k) for k in range(12)])
    assert got == [(k, True) for k in range(12)]
    assert len(where) == 12 and any(n.startswith("ember-kernel") for n in where)  # the pool took some
    assert any(not n.startswith("ember-kernel") for n in where)  # and this thread others
    done: list[int] = []

    def boom():
        raise KeyError("task 3")

    with pytest.raises(KeyError, match="task 3"):
        _native.run_each([lambda k=k: done.append(k) for k in range(3)] + [boom] + [lambda: done.append(9)] * 2)
    assert set(done) <= {0, 1, 2, 9} and {0, 1, 2} <= set(done)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert _native.run_each([lambda: threading.current_thread().name] * 3) == [threading.current_thread().name] * 3


def test_run_each_does_not_wait_for_a_busy_pool_once_its_tasks_are_done(monkeypatch):
    """Two callers at once (the pipeline's fetch and update threads): the second, finding the
    pool busy, runs its tasks itself and returns without waiting for the pool's other work."""
    import threading
    import time

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    release = threading.Event()
    first = threading.Thread(target=lambda: _native.run_each([lambda: release.wait(5)] * 2))
    first.start()
    time.sleep(0.1)  # the pool's one thread now holds a waiting task
    t0 = time.perf_counter()
    assert _native.run_each([lambda k=k: k for k in range(4)]) == [0, 1, 2, 3]
    took = time.perf_counter() - t0
    release.set()
    first.join()
    assert took < 1.0, took


def test_run_each_issues_gpu_work_of_the_pool_on_the_callers_stream(monkeypatch):
    """CUDA's current stream is per thread: a task on a pool thread runs under the caller's
    stream and device (a table's device cache stays ordered with the caller's work). Checked with
    a stand-in stream, since CI has no GPU."""
    import contextlib
    import threading

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    caller = type("Stream", (), {"device": "cuda:1"})()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: caller)
    active = threading.local()

    @contextlib.contextmanager
    def on_stream(s):
        active.stream = s
        yield
        active.stream = None

    monkeypatch.setattr(torch.cuda, "stream", on_stream)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    import time

    def task():
        time.sleep(0.005)  # long enough for the pool's thread to take some
        return threading.current_thread().name, getattr(active, "stream", None)

    seen = _native.run_each([task] * 24)
    pooled = [s for name, s in seen if name.startswith("ember-kernel")]
    assert pooled and all(s is caller for s in pooled)
