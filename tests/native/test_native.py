"""The compiled core against its pure fallbacks: same results over random operations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import _native
from ember.tiers.key_index import KeyIndex

native = pytest.mark.skipif(not _native.is_available(), reason="ember native core not built")


def test_import_works_and_require_names_the_fix():
    if _native.is_available():
        assert _native.require() is not None
    else:
        with pytest.raises(ImportError, match="pip install -e"):
            _native.require()


@native
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_key_index_native_matches_numpy_over_random_ops(seed):
    rng = np.random.default_rng(seed)
    fast, slow = KeyIndex(16, native=True), KeyIndex(16, native=False)
    pool = rng.integers(-(2**63), 2**63 - 1, size=5000)
    pool[:3] = [0, -1, 2**63 - 1]
    next_slot = 0
    for step in range(80):
        batch = rng.choice(pool, size=rng.integers(0, 900))  # duplicates allowed in lookups
        got = fast.lookup(batch)
        np.testing.assert_array_equal(got, slow.lookup(batch))
        new = np.unique(batch[got < 0])
        slots = np.arange(next_slot, next_slot + new.size, dtype=np.int32)
        next_slot += new.size
        fast.insert(new, slots)
        slow.insert(new, slots)
        if step % 4 == 3 and len(fast):
            keys, _ = slow.items()
            victims = np.concatenate([rng.choice(keys, size=min(300, keys.size), replace=False), pool[-5:]])
            np.testing.assert_array_equal(fast.remove(victims), slow.remove(victims))
        assert len(fast) == len(slow)
    assert dict(zip(*[a.tolist() for a in fast.items()])) == dict(zip(*[a.tolist() for a in slow.items()]))


@native
def test_tables_are_interchangeable_between_implementations():
    rng = np.random.default_rng(5)
    ids = np.unique(rng.integers(-(2**40), 2**40, size=3000))
    a = KeyIndex(16, native=True)
    a.insert(ids[:2000], np.arange(2000, dtype=np.int32))
    a.remove(ids[:500])
    b = KeyIndex(16, native=False)  # read and extend the native-written arrays with numpy
    b._alloc(a._keys.size)
    b._keys[:], b._slots[:], b._used, b._size = a._keys, a._slots, a._used, a._size
    np.testing.assert_array_equal(b.lookup(ids), a.lookup(ids))
    b.insert(ids[2000:], np.arange(2000, 3000, dtype=np.int32))
    a.insert(ids[2000:], np.arange(2000, 3000, dtype=np.int32))
    np.testing.assert_array_equal(b.lookup(ids), a.lookup(ids))


@pytest.mark.parametrize("use_native", [False, pytest.param(True, marks=native)])
def test_unique_segments_matches_per_segment_unique(use_native):
    rng = np.random.default_rng(3)
    for _ in range(20):
        sizes = rng.integers(0, 300, size=rng.integers(1, 6))
        ids = rng.integers(-50, 50, size=int(sizes.sum())) * (2**50)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        uniq, inverse, counts = _native.unique_segments(ids, bounds, native=use_native)
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
def test_uniform_init_native_matches_numpy_bit_for_bit(seed, stream, dim):
    from ember.embedding import init
    from ember.mix import mix64

    ids = np.random.default_rng(seed).integers(-(2**63), 2**63 - 1, size=3000)
    key = mix64(np.array([seed * 2 + stream], dtype=np.uint64))
    np.testing.assert_array_equal(init._uniform01(ids, dim, seed, stream), init._uniform01_fallback(ids, dim, key))


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


@pytest.mark.skipif(not _native.is_available(), reason="native core not built")
@pytest.mark.parametrize("dim", [1, 16, 33])
def test_index_add_rows_native_equals_torch_index_add(dim):
    g = torch.Generator().manual_seed(dim)
    index = torch.randint(0, 50, (5000,), generator=g)  # many repeats of each row
    src = torch.randn(5000, dim, generator=g)
    base = torch.randn(50, dim, generator=g)
    got = _native.index_add_rows(base.clone(), index, src)
    assert torch.equal(got, base.clone().index_add_(0, index, src))  # same sums, same order
    wide = torch.randn(5000, 3, dim, generator=g)  # a row-strided view: one feature of [B, F, D]
    got = _native.index_add_rows(base.clone(), index, wide[:, 1])
    assert torch.equal(got, base.clone().index_add_(0, index, wide[:, 1].contiguous()))
    with pytest.raises(IndexError, match="out of range"):
        _native.index_add_rows(base.clone(), torch.tensor([50]), torch.ones(1, dim))


@pytest.mark.parametrize("native", [True, False])
def test_index_add_features_equals_feature_by_feature_index_add(native, monkeypatch):
    """Row-strided slices of one [B, F', D] gradient (as a model's stack hands them back), some
    features without a gradient (None), indices shared across features (a shared table)."""
    if native and not _native.is_available():
        pytest.skip("native core not built")
    if not native:
        monkeypatch.setattr(_native, "_core", None)
    g = torch.Generator().manual_seed(3)
    b, f, d, u = 300, 5, 16, 120
    grad = torch.randn(b, f + 1, d, generator=g)
    srcs = [grad[:, i + 1] for i in range(f)]
    srcs[2] = None
    index = torch.randint(0, u, (f * b,), generator=g)
    base = torch.randn(u, d, generator=g)
    want = base.clone()
    for i, s in enumerate(srcs):
        if s is not None:
            want.index_add_(0, index[i * b : (i + 1) * b], s.contiguous())
    got = _native.index_add_features(base.clone(), index, srcs)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # sums in another order: may round apart
    if native:
        with pytest.raises(IndexError, match="out of range"):
            _native.index_add_features(base.clone(), torch.full((f * b,), u), srcs)


@native
def test_rowwise_adagrad_native_equals_torch_ops_on_a_records_buffer():
    """The one-pass kernel on [weights | accumulator] views of one buffer == the torch ops."""
    from ember.optim import RowWiseAdagrad

    g = torch.Generator().manual_seed(8)
    rec = torch.rand(500, 17, generator=g)
    grads = torch.randn(500, 16, generator=g)
    opt = RowWiseAdagrad(lr=0.05, eps=1e-8)
    got = rec.clone()
    assert _native.rowwise_adagrad_(got[:, :16], got[:, 16:], grads, opt.lr, opt.eps)
    want = rec.clone()
    want[:, 16:].add_(grads.square().mean(dim=1, keepdim=True))
    want[:, :16].addcdiv_(grads, want[:, 16:].sqrt().add_(opt.eps), value=-opt.lr)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)  # the mean's sum order may differ by an ulp
    assert not _native.rowwise_adagrad_(got[:, :16].double(), got[:, 16:].double(), grads.double(), 0.1, 0.0)  # not taken


def test_chunks_balance_weight_and_respect_cuts(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert _native.chunks([5, 5, 5, 5, 5, 5], min_rows=1) == [(0, 2), (2, 4), (4, 6)]
    assert _native.chunks([5] * 6, min_rows=100) == [(0, 6)]  # too little work to hand off
    parts = _native.chunks([4] * 6, cuts=[True, False, False, True, False, False], min_rows=1)
    assert parts == [(0, 3), (3, 6)]  # items 0-2 and 3-5 must stay together
    assert _native.run_chunks(lambda lo, hi: (lo, hi), parts) == parts


@native
def test_kernels_split_over_threads_equal_one_thread(monkeypatch):
    """Each kernel run in parts on several threads gives exactly the one-thread result."""
    from ember.tiers import HostTier

    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, 400, (6000,), generator=g).numpy()
    bounds = np.array([0, 1000, 1000, 2500, 4000, 6000])
    results = {}
    for least in (1, 10**12):  # parts on a pool / everything on this thread
        monkeypatch.setattr(_native, "MIN_PARALLEL_ROWS", least)
        uniq, inverse, counts = _native.unique_segments(ids, bounds)
        grad = torch.randn(300, 6, 4, generator=g) if least == 1 else results[1]["grad"]
        index = torch.randint(0, 50, (5 * 300,), generator=g) if least == 1 else results[1]["index"]
        owner = [0, 0, 1, 2, 2]  # table of each feature: rows 10 * owner .. are that table's
        index = (index % 10) + 10 * torch.tensor(owner).repeat_interleave(300)
        out = _native.index_add_features(torch.zeros(50, 4), index, [grad[:, f + 1] for f in range(5)], owner)
        rec = torch.rand(5000, 5, generator=torch.Generator().manual_seed(1))
        _native.rowwise_adagrad_(rec[:, :4], rec[:, 4:], torch.ones(5000, 4) * 0.1, 0.05, 1e-8)
        tiers = [HostTier(3) for _ in range(4)]
        parts = [torch.arange(k * 1000, k * 1000 + 900 + k) for k in range(4)]
        HostTier.put_many(tiers, parts, torch.arange(sum(p.numel() for p in parts) * 3, dtype=torch.float32).view(-1, 3))
        read = torch.zeros(sum(p.numel() for p in parts), 3)
        found = HostTier.get_into_many(tiers, parts, read)
        results[least] = {"unique": (uniq, inverse, counts), "out": out, "rec": rec, "read": read, "found": found,
                          "grad": grad, "index": index}
    a, b = results[1], results[10**12]
    for x, y in zip(a["unique"], b["unique"]):
        np.testing.assert_array_equal(x, y)
    for k in ("out", "rec", "read", "found"):
        assert torch.equal(a[k], b[k]), k
