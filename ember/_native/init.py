"""Row initialisers (``ember.embedding.init``): uniform and normal rows from (ID, key), fresh
rows written into a batch's records."""

from __future__ import annotations

import numpy as np

from ember import _native
from ember._native.arrow import _GOLDEN
from ember._native.bf16 import _bf16_round_py, _bf16_widen_py
from ember._native.rows import _rows_of
from ember.mix import mix64
from ember.portable.normal import NUMPY_OPS, box_muller


def uniform01(ids: np.ndarray, keys: np.ndarray, dim: int, out: np.ndarray, mul: float | np.ndarray = 1.0,
              add: float | np.ndarray = 0.0) -> None:
    """``out[i, c] = u * mul_i + add_i`` (float32 ops, in that order; out float32 [n, dim]) with the
    counter-based uniform ``u = (mix64(mix64(ids[i] ^ key_i) + (c + 1) * GOLDEN) >> 40) * 2**-24``
    in [0, 1); ``key_i`` = ``keys[0]`` or ``keys[i]`` (uint64 [1 or n]: one key per row lets the
    tables of a group initialise their new rows in one call); ``mul``/``add``: numbers, or
    float32 [n] (a scale per row: tables of different init scales in one call). Runs on several
    threads (row ranges) when the call is large enough."""
    core = _native._core
    if core is None:
        return _uniform01_py(ids, keys, dim, out, mul, add)
    n = ids.size
    rows = _rows_of(out, n, dim, "out")
    if isinstance(mul, np.ndarray):
        mul = np.ascontiguousarray(mul, dtype=np.float32)
        add = np.ascontiguousarray(add, dtype=np.float32)
    core.uniform01(ids, keys, dim, rows, mul, add, _native.part_count(n))


def _uniform01_py(ids: np.ndarray, keys: np.ndarray, dim: int, out: np.ndarray, mul: float | np.ndarray = 1.0,
                  add: float | np.ndarray = 0.0) -> None:
    ids = np.asarray(ids, dtype=np.int64)
    keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
    n = ids.size
    if dim < 0 or out.size != n * dim or keys.size not in (1, n):
        raise ValueError("ember native uniform01: keys uint64 [1 or len(ids)], out float32 [len(ids), dim]")
    base = mix64(ids.view(np.uint64) ^ keys)
    cols = np.arange(1, dim + 1, dtype=np.uint64) * _GOLDEN
    bits = mix64(base[:, None] + cols[None, :])
    u = (bits >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))
    if isinstance(mul, np.ndarray):
        u *= np.asarray(mul, dtype=np.float32).reshape(n, 1)
        u += np.asarray(add, dtype=np.float32).reshape(n, 1)
    elif not (mul == 1.0 and add == 0.0):
        u *= np.float32(mul)
        u += np.float32(add)
    _rows_of(out, n, dim, "out")[...] = u


def normal01(ids: np.ndarray, keys1: np.ndarray, keys2: np.ndarray, dim: int, out: np.ndarray, std: float) -> None:
    """``out[i, c] = box_muller(u1, u2) * std`` (float32; out float32 [n, dim]) with ``u1``, ``u2``
    the ``uniform01`` draws of (``ids[i]``, c) under ``keys1`` and ``keys2`` (uint64 [1 or n]): a
    normal initialiser's rows, the same bits on every CPU (``ember.portable.normal``, the
    reference). Runs on several threads (row ranges) when the call is large enough."""
    core = _native._core
    if core is None:
        return _normal01_py(ids, keys1, keys2, dim, out, std)
    n = ids.size
    rows = _rows_of(out, n, dim, "out")
    core.normal01(ids, keys1, keys2, dim, rows, float(std), _native.part_count(n))


def _normal01_py(ids: np.ndarray, keys1: np.ndarray, keys2: np.ndarray, dim: int, out: np.ndarray, std: float) -> None:
    n = np.asarray(ids).size
    u1 = np.empty((n, dim), dtype=np.float32)
    u2 = np.empty((n, dim), dtype=np.float32)
    _uniform01_py(ids, keys1, dim, u1)
    _uniform01_py(ids, keys2, dim, u2)
    _rows_of(out, n, dim, "out")[...] = box_muller(u1, u2, NUMPY_OPS) * np.float32(std)


def fresh_uniform(ids: np.ndarray, keys: np.ndarray, at: np.ndarray, out: np.ndarray, dim: int,
                  mul: float | np.ndarray, add: float | np.ndarray, fill: np.ndarray, bf16: bool) -> None:
    """New rows of a uniform initialiser written in place: ``out[at[i], :dim]`` = ``uniform01``'s
    row i (``u * mul_i + add_i``), rounded to the nearest bf16 when ``bf16`` (ties to even: the
    bits of ``ember.embedding.codec._bf16_bits``), and ``out[at[i], dim:] = fill`` (an
    optimizer's constant initial state, float32 [width - dim]). ``out``: float32 [rows, width],
    C-contiguous; ``at``: distinct rows. Runs on several threads (ranges of ``at``) when the call
    is large enough."""
    core = _native._core
    if core is None:
        return _fresh_uniform_py(ids, keys, at, out, dim, mul, add, fill, bf16)
    if out.ndim != 2 or not out.flags.c_contiguous or out.dtype != np.float32:
        raise ValueError("ember native fresh_uniform: out must be a C-contiguous float32 [rows, width] array")
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    at = np.ascontiguousarray(at, dtype=np.int64)
    fill = np.ascontiguousarray(fill, dtype=np.float32)
    per_row = isinstance(mul, np.ndarray)
    if per_row:
        mul = np.ascontiguousarray(mul, dtype=np.float32)
        add = np.ascontiguousarray(add, dtype=np.float32)
    core.fresh_uniform(ids, keys, at, out, out.shape[1], dim, mul, add, fill, bool(bf16), _native.part_count(ids.size))


def _fresh_uniform_py(ids: np.ndarray, keys: np.ndarray, at: np.ndarray, out: np.ndarray, dim: int,
                      mul: float | np.ndarray, add: float | np.ndarray, fill: np.ndarray, bf16: bool) -> None:
    n = np.asarray(ids).size
    if out.ndim != 2 or out.dtype != np.float32 or np.asarray(fill).size != out.shape[1] - dim or np.asarray(at).size != n:
        raise ValueError("ember native fresh_uniform: out float32 [rows, width], at [len(ids)], fill [width - dim]")
    at = np.asarray(at, dtype=np.int64)
    if n and (int(at.min()) < 0 or int(at.max()) >= out.shape[0]):
        raise IndexError("ember native fresh_uniform: a position lies outside out")
    w = np.empty((n, dim), dtype=np.float32)
    _uniform01_py(ids, keys, dim, w, mul, add)
    if bf16:  # round to nearest even (codec._bf16_bits)
        b = w.view(np.uint32)
        w = _bf16_widen_py(_bf16_round_py(b, np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))))
    out[at, :dim] = w
    out[at, dim:] = np.asarray(fill, dtype=np.float32)
