"""An export's embedding tables in numpy: sorted IDs, weights, and the rows of IDs without one.

An ID the table holds reads its exported weights (bf16 / fp16 ones widened exactly); an ID
without a row reads what ember's eval and Predictor give it: its deterministic initial row
(uniform or normal, seeded by the table's seed and the ID, rounded to the table's dtype), or
the all-zero row in a table with ``min_count`` > 1 (IDs admission held back). A TTL table's row
last seen more than ``ttl_steps`` before the export's step reads as absent.

Example:
    >>> init_rows(np.array([5, 9]), 4, {"type": "uniform"}, seed=0).shape
    (2, 4)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ember.portable.hashing import GOLDEN, mix64
from ember.portable.normal import NUMPY_OPS, box_muller

__all__ = ["Table", "init_rows", "pool", "round_nearest", "widen"]


def _uniform01(ids: np.ndarray, dim: int, seed: int, stream: int, mul: float = 1.0, add: float = 0.0) -> np.ndarray:
    """Counter-based uniforms in [0, 1) per (ID, column), then ``u * mul + add`` in float32:
    ``u = (mix64(mix64(id ^ key) + (c + 1) * GOLDEN) >> 40) * 2**-24``,
    ``key = mix64(seed * 2 + stream)``."""
    key = mix64(np.array([seed], dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(stream))
    base = mix64(np.ascontiguousarray(ids, dtype=np.int64).view(np.uint64) ^ key)
    cols = np.arange(1, dim + 1, dtype=np.uint64) * GOLDEN
    bits = mix64(base[:, None] + cols[None, :])
    u = (bits >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))
    if not (mul == 1.0 and add == 0.0):
        u *= np.float32(mul)
        u += np.float32(add)
    return u


def init_rows(ids: np.ndarray, dim: int, initializer: Mapping[str, Any], seed: int) -> np.ndarray:
    """Initial rows float32 [N, dim] of ``ids``, as a table with ``initializer`` (the manifest's:
    ``type`` uniform / normal / zeros, ``scale``, ``std``) and ``seed`` creates them."""
    n = int(np.asarray(ids).size)
    kind = initializer.get("type", "uniform")
    if kind == "zeros" or n == 0:
        return np.zeros((n, dim), dtype=np.float32)
    if kind == "uniform":
        scale = initializer.get("scale")
        scale = float(scale) if scale is not None else 1.0 / float(np.sqrt(dim))
        return _uniform01(ids, dim, seed, 0, float(np.float32(2 * scale)), -float(np.float32(scale)))
    if kind != "normal":
        raise ValueError(f"initializer type {kind!r} is not one this runtime knows (uniform, normal, zeros); "
                         "export the model again with this version of ember")
    std = initializer.get("std")
    std = float(std) if std is not None else 1.0 / float(np.sqrt(dim))
    return box_muller(_uniform01(ids, dim, seed, 1), _uniform01(ids, dim, seed, 2), NUMPY_OPS) * np.float32(std)


def widen(bits: np.ndarray, dtype: str) -> np.ndarray:
    """16-bit patterns (int16) of ``dtype`` ("bf16" / "fp16") as their exact float32 values."""
    if dtype == "bf16":
        return (bits.astype(np.int16).view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return bits.astype(np.int16).view(np.float16).astype(np.float32)


_FP16_MAX = 65504.0


def round_nearest(w: np.ndarray, dtype: str) -> np.ndarray:
    """float32 ``w`` rounded to the nearest ``dtype`` value (ties to even), as float32: what a
    fresh row of a bf16 / fp16 table holds."""
    if dtype == "fp32":
        return w
    if dtype == "fp16":
        finite = np.isfinite(w)
        return np.where(finite, np.clip(w, -_FP16_MAX, _FP16_MAX), w).astype(np.float16).astype(np.float32)
    bits = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32).astype(np.int64)
    sign, mag = bits & 0x80000000, bits & 0x7FFFFFFF
    out = (sign | ((mag + 0x7FFF + ((mag >> 16) & 1)) & 0x7FFF0000)) >> 16
    out = np.where(mag > 0x7F800000, (sign >> 16) | 0x7FC0, out)
    return widen(out.astype(np.uint16).view(np.int16), "bf16")


class Table:
    """One exported table: ``rows(ids)`` -> float32 [N, dim] (see the module docstring)."""

    def __init__(self, root: Path, meta: Mapping[str, Any]) -> None:
        self.name: str = meta["name"]
        self.dim: int = int(meta["dim"])
        self.seed: int = int(meta["seed"])
        self.initializer: Mapping[str, Any] = meta.get("initializer") or {}
        self.min_count: int = int(meta.get("min_count", 1))
        self.dtype: str = meta.get("dtype", "fp32")
        self.ttl: int | None = meta.get("ttl_steps")
        self.step: int = int(meta.get("step", 0))
        n = int(meta["rows"])
        base = root / "tables" / self.name
        self.ids = np.fromfile(f"{base}.ids", dtype="<i8") if n else np.empty(0, np.int64)
        if self.dtype == "fp32":
            w = np.fromfile(f"{base}.weights", dtype="<f4") if n else np.empty(0, np.float32)
        else:
            w = widen(np.fromfile(f"{base}.weights", dtype="<i2"), self.dtype) if n else np.empty(0, np.float32)
        self.weights = w.astype(np.float32, copy=False).reshape(n, self.dim)
        self.seen = (np.fromfile(f"{base}.seen", dtype="<f4") if n else np.empty(0, np.float32)) if self.ttl else None
        for what, arr in (("ids", self.ids), ("weights", self.weights), ("seen", self.seen)):
            if arr is not None and arr.shape[0] != n:
                raise ValueError(f"export {root}: tables/{self.name}.{what} holds {arr.shape[0]} rows, the manifest "
                                 f"says {n}; export the model again")

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows float32 [N, dim] of ``ids`` (int64 [N])."""
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((ids.size, self.dim), dtype=np.float32)
        if self.ids.size:
            pos = np.minimum(np.searchsorted(self.ids, ids), self.ids.size - 1)
            found = self.ids[pos] == ids
            if self.seen is not None and found.any():
                found[found] = self.step - self.seen[pos[found]] <= self.ttl
        else:
            pos, found = np.zeros(ids.size, np.int64), np.zeros(ids.size, bool)
        out[found] = self.weights[pos[found]]
        absent = ~found
        if absent.any():
            if self.min_count > 1:  # IDs below min_count never got a row: eval reads the shared zero row
                out[absent] = 0.0
            else:
                out[absent] = round_nearest(init_rows(ids[absent], self.dim, self.initializer, self.seed), self.dtype)
        return out


def pool(rows: np.ndarray, inverse: np.ndarray, offsets: np.ndarray, weights: np.ndarray | None,
         pooling: str) -> np.ndarray:
    """One feature's bags pooled to float32 [B, D], as ember's ``pool_feature``: ``rows`` [U, D]
    at ``inverse`` [N], bag b = elements ``offsets[b]:offsets[b+1]``; ``sum`` / ``mean`` /
    ``sqrtn``, weighted (``Σw·e``, ``/ max(Σ|w|, 1e-6)``, ``/ max(√Σw², 1e-6)``) with ``weights``."""
    b = offsets.size - 1
    counts = np.diff(offsets)
    seg = np.repeat(np.arange(b, dtype=np.int64), counts)
    e = rows[inverse]
    if weights is not None:
        e = e * weights.astype(np.float32)[:, None]
    bag = np.zeros((b, rows.shape[1]), dtype=np.float32)
    np.add.at(bag, seg, e)
    if pooling == "sum":
        return bag
    if weights is None:
        if pooling == "mean":
            return bag / np.maximum(counts, 1).astype(np.float32)[:, None]
        return bag / np.maximum(np.sqrt(counts.astype(np.float32)), np.float32(1.0))[:, None]
    w = weights.astype(np.float32)
    norm = np.zeros(b, dtype=np.float32)
    if pooling == "mean":
        np.add.at(norm, seg, np.abs(w))
        norm = np.maximum(norm, np.float32(1e-6))
    else:
        np.add.at(norm, seg, w * w)
        norm = np.sqrt(np.maximum(norm, np.float32(1e-12)))
    return bag / norm[:, None]

