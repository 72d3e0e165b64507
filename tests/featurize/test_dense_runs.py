"""The dense features' two-pass transform (``dense_runs``: ``_native.dense_prepare`` with
numpy's log1p from a table, then ``dense_finish``) gives bit for bit what ``dense_transform``
and a float32 cast give, and the native passes equal their numpy fallbacks: counts inside and
past the table, negatives, fractions, NaN, infinities, -0.0 (declined: numpy's path), clip
bounds, standardize, every mode, and lengths around the 4-value SIMD steps."""

from __future__ import annotations

import numpy as np
import pytest

from ember import _native
from ember._native.dense import LOG1P_TABLE, log1p_table
from ember.featurize.transforms import dense_runs, dense_transform

native = pytest.mark.skipif(not _native.is_available(), reason="needs the native core")


def _values(rng: np.random.Generator, shape: tuple[int, int], neg_zero: bool = False) -> np.ndarray:
    counts = np.floor(rng.pareto(0.8, shape) * 3)  # mostly in the table, some far past it
    pick = rng.random(shape)
    x = np.where(pick < 0.08, 0.0 - counts, counts)  # (0.0 - 0.0 is +0.0)
    x = np.where((pick > 0.08) & (pick < 0.12), rng.normal(0, 50, shape), x)  # fractions
    x = np.where((pick > 0.12) & (pick < 0.16), np.nan, x)
    x = np.where((pick > 0.16) & (pick < 0.17), rng.choice([np.inf, -np.inf, LOG1P_TABLE - 1.0, LOG1P_TABLE,
                                                            LOG1P_TABLE + 0.5, 2.0**40, -(2.0**31)], shape), x)
    if neg_zero:
        x.flat[int(rng.integers(x.size))] = -0.0
    return x


def _reference(raw: np.ndarray, runs: list[tuple]) -> np.ndarray:
    raw = raw.copy()
    for a, b, fill, clip, log1p, standardize, sign_log1p in runs:
        for j in range(a, b):  # one feature at a time, as the column-by-column featurizer does
            raw[j] = dense_transform(raw[j], fill, log1p, clip, standardize, sign_log1p)
    return np.ascontiguousarray(raw.T, dtype=np.float32)


def _runs(rng: np.random.Generator, rows: int) -> list[tuple]:
    cuts = sorted({0, rows, *rng.integers(1, max(rows, 2), 2).tolist()} - {rows + 1})
    cuts = [c for c in cuts if c <= rows]
    runs = []
    for a, b in zip(cuts, cuts[1:]):
        mode = int(rng.integers(3))
        clip = [None, (0.0, 1000.0), (-5.0, None), (None, 7.5), (-3.0, 3.0)][int(rng.integers(5))]
        standardize = (float(rng.normal()), float(rng.uniform(0.5, 3))) if rng.random() < 0.5 else None
        runs.append((a, b, float(rng.choice([0.0, 1.0, -2.0])), clip, mode == 1, standardize, mode == 2))
    return runs


@pytest.mark.parametrize("seed", range(16))
def test_dense_runs_equal_dense_transform_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    rows, n = int(rng.integers(1, 14)), int(rng.integers(0, 70))
    raw = _values(rng, (rows, n), neg_zero=seed % 4 == 3)
    runs = _runs(rng, rows)
    want = _reference(raw, runs)
    got, declined = dense_runs(raw.copy(), runs)
    assert got.dtype == np.float32 and got.shape == (n, rows) and got.flags.c_contiguous
    assert got.tobytes() == want.tobytes()
    if seed % 4 != 3:
        assert declined == []


def test_a_negative_zero_declines_its_run_only():
    raw = np.array([[1.0, -0.0, 3.0], [4.0, 5.0, 6000.0]])
    runs = [(0, 1, 0.0, None, True, None, False), (1, 2, 0.0, None, True, None, False)]
    got, declined = dense_runs(raw.copy(), runs)
    assert declined == [0]
    assert got.tobytes() == _reference(raw, runs).tobytes()
    # a -0.0 clip bound or a NaN fill decline too (numpy's ties and NaNs decide there)
    for run in [(0, 2, 0.0, (-0.0, None), False, None, False), (0, 2, float("nan"), None, True, None, False)]:
        got, declined = dense_runs(raw.copy(), [run])
        assert declined == [0] and got.tobytes() == _reference(raw, [run]).tobytes()


def test_the_table_holds_numpys_log1p():
    t = log1p_table()
    k = np.arange(LOG1P_TABLE, dtype=np.float64)
    assert t.tobytes() == np.log1p(k).tobytes()
    assert t.tobytes() == np.array([np.log1p(np.array([v]))[0] for v in k[::-1]])[::-1].tobytes()  # one at a time too


@native
@pytest.mark.parametrize("seed", range(12))
def test_native_dense_prepare_equals_its_fallback(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.choice([0, 1, 3, 4, 5, 7, 8, 9, 63, 64, 65, 257]))
    x = _values(rng, (1, n), neg_zero=seed % 5 == 4)
    fill = float(rng.choice([0.0, -1.0, 2.5]))
    lo, hi = [(-np.inf, np.inf), (0.0, 1e6), (-4.0, 4.0), (1.5, np.inf)][seed % 4]
    for mode in (0, 1, 2):
        outs = []
        for fn in (_native.dense_prepare, _native._dense_prepare_py):
            v, rest = x.copy(), np.full(max(n, 1), -7, np.int64)
            k = fn(v, fill, lo, hi, mode, rest)
            outs.append((k, v, rest[: max(k, 0)]))
        (k1, v1, r1), (k2, v2, r2) = outs
        assert k1 == k2
        assert v1.tobytes() == v2.tobytes()  # a decline leaves x as it was, in both
        assert r1.tolist() == r2.tolist()
        if seed % 5 == 4:
            assert k1 == -1 and v1.tobytes() == x.tobytes()


@native
def test_native_dense_prepare_fills_a_nan_with_negative_zero_only_by_declining():
    x = np.array([[1.0, np.nan, 2.0, 3.0, 4.0]])
    rest = np.empty(5, np.int64)
    for fn in (_native.dense_prepare, _native._dense_prepare_py):
        v = x.copy()
        assert fn(v, -0.0, -np.inf, np.inf, 1, rest) == -1 and np.array_equal(v, x, equal_nan=True)
        v = x[:, [0, 2, 3, 4]].copy()  # no NaN: -0.0 never lands
        assert fn(v, -0.0, -np.inf, np.inf, 1, rest) == 0


@native
@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 200])
def test_native_dense_finish_equals_its_fallback(n):
    rng = np.random.default_rng(n)
    rows = 5
    x = _values(rng, (rows, n))
    scaled = np.array([1, 0, 1, 0, 0], np.uint8)
    means, stds = rng.normal(size=rows), rng.uniform(0.5, 2, rows)
    outs = []
    for fn in (_native.dense_finish, _native._dense_finish_py):
        out = np.full((n, rows), 9.0, np.float32)
        fn(x, scaled, means, stds, out)
        outs.append(out)
    assert outs[0].tobytes() == outs[1].tobytes()
    want = np.where(scaled[:, None] == 1, (x - means[:, None]) / stds[:, None], x).T.astype(np.float32)
    assert outs[0].tobytes() == want.tobytes()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="dense_prepare"):
        _native.dense_prepare(np.zeros((2, 3), np.float32), 0.0, -np.inf, np.inf, 1, np.empty(6, np.int64))
    with pytest.raises(ValueError, match="dense_prepare"):
        _native.dense_prepare(np.zeros((2, 3)), 0.0, -np.inf, np.inf, 1, np.empty(5, np.int64))
    with pytest.raises(ValueError, match="dense_finish"):
        _native.dense_finish(np.zeros((2, 3)), np.zeros(2, np.uint8), np.zeros(2), np.ones(2), np.empty((2, 3), np.float32))
