"""Dense features' transform in two native passes (``dense_prepare``, ``dense_finish``), with
their numpy fallbacks: the featurizer's one-pass path for runs of like dense features, bit for
bit what ``ember.featurize.transforms.dense_transform`` and a float32 cast give.

log1p is the one step not written out natively: numpy's log1p differs from the C library's in
the last bit for some inputs (SIMD builds use their own), so the native pass looks it up in a
table of numpy's own results for the integers below ``LOG1P_TABLE`` (counts, Criteo's dense
features) and leaves every other value to numpy.
"""

from __future__ import annotations

import numpy as np

from ember import _native

LOG1P_TABLE = 4096
"""Integers 0..LOG1P_TABLE-1 take log1p from a table (32 KB: stays in cache)."""

_table: np.ndarray | None = None


def log1p_table() -> np.ndarray:
    """numpy's log1p of 0, 1, ..., ``LOG1P_TABLE - 1`` (float64), made once."""
    global _table
    if _table is None:
        _table = np.log1p(np.arange(LOG1P_TABLE, dtype=np.float64))
    return _table


def dense_prepare(x: np.ndarray, fill: float, lo: float, hi: float, mode: int, rest: np.ndarray) -> int:
    """One run of dense rows ``x`` (float64, C-contiguous, changed in place) through fill
    (NaN -> ``fill``), clip to ``[lo, hi]`` and, for ``mode`` 1, ``log1p(max(x, 0))``, for
    ``mode`` 2, ``sign(x) * log1p(|x|)``; ``mode`` 0: no log. log1p is done for the integers of
    the table (``log1p_table``); the other values are left after clip (and ``max(x, 0)``) with
    their flat positions in ``rest[:k]`` for numpy's log1p, and ``k`` returned. Returns -1 with
    ``x`` untouched when a value is -0.0 after fill and clip (numpy's ``maximum`` and ``sign``
    of a signed zero are not pinned down: the caller's numpy path decides). ``fill``, ``lo``,
    ``hi`` must not be NaN (refused), nor ``lo`` / ``hi`` -0.0 (a tie with +0.0 that numpy's
    ``maximum`` decides: the caller keeps such runs on ``dense_transform``)."""
    if x.dtype != np.float64 or not x.flags.c_contiguous or rest.dtype != np.int64 or rest.size < x.size \
            or mode not in (0, 1, 2) or np.isnan([fill, lo, hi]).any():
        raise ValueError("dense_prepare: x float64 (C-contiguous), rest int64 of x's size or more, mode 0, 1 or 2, "
                         "fill / lo / hi not NaN")
    if _native._core is None:
        return _dense_prepare_py(x, fill, lo, hi, mode, rest)
    return int(_native._core.dense_prepare(x, fill, lo, hi, mode, log1p_table(), rest))


def _dense_prepare_py(x: np.ndarray, fill: float, lo: float, hi: float, mode: int, rest: np.ndarray) -> int:
    flat = x.reshape(-1)
    a = np.where(np.isnan(flat), fill, flat)
    a = np.where(a < lo, lo, np.where(a > hi, hi, a))
    if ((a == 0) & np.signbit(a)).any():
        return -1
    if mode == 0:
        flat[:] = a
        return 0
    if mode == 1:
        a = np.where(a < 0, 0.0, a)
    m = np.abs(a)
    table = log1p_table()
    done = (m < table.size) & (m == np.floor(m))
    looked = table[m[done].astype(np.int64)]
    flat[:] = a
    flat[done] = np.where(a[done] < 0, -looked, looked)
    left = np.flatnonzero(~done)
    rest[: left.size] = left
    return int(left.size)


def dense_finish(x: np.ndarray, scaled: np.ndarray, means: np.ndarray, stds: np.ndarray, out: np.ndarray) -> None:
    """The dense rows ``x`` (float64 [R, n], C-contiguous) into ``out`` (float32 [n, R]), row
    ``r`` standardized first where ``scaled[r]`` (``(x - means[r]) / stds[r]``)."""
    rows = x.shape[0] if x.ndim == 2 else -1
    if x.dtype != np.float64 or x.ndim != 2 or not x.flags.c_contiguous or scaled.dtype != np.uint8 \
            or scaled.shape != (rows,) or means.dtype != np.float64 or means.shape != (rows,) \
            or stds.dtype != np.float64 or stds.shape != (rows,) or out.dtype != np.float32 \
            or out.shape != (x.shape[1], rows) or not out.flags.c_contiguous:
        raise ValueError("dense_finish: x float64 [R, n], scaled uint8 [R], means and stds float64 [R], out float32 [n, R]")
    if _native._core is None:
        return _dense_finish_py(x, scaled, means, stds, out)
    _native._core.dense_finish(x, scaled, means, stds, out)


def _dense_finish_py(x: np.ndarray, scaled: np.ndarray, means: np.ndarray, stds: np.ndarray, out: np.ndarray) -> None:
    for r in range(x.shape[0]):
        out[:, r] = (x[r] - means[r]) / stds[r] if scaled[r] else x[r]
