"""Rows: featurized samples as numpy arrays, cheap to concatenate, shuffle and cut into batches.

Sparse features are kept per feature as ``(values, offsets, weights)`` so that taking a random
subset of rows is a few vectorised gathers; :meth:`Rows.to_batch` builds the key-major
:class:`~ember.batch.SparseFeatures` at the very end.

Example:
    >>> r = Rows(np.zeros((3, 1), np.float32), np.array([[1], [0], [1]], np.float32), ["a"],
    ...          [np.array([5, 6, 7])], [np.array([0, 2, 2, 3])], [None])
    >>> r.take(np.array([2, 0])).values[0].tolist(), r.slice(1, 3).offsets[0].tolist()
    ([7, 5, 6], [0, 0, 1])
    >>> r.to_batch().sparse.lengths.tolist()
    [2, 0, 1]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ember.batch import Batch, SparseFeatures

__all__ = ["Rows"]


def _take_jagged(offsets: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Element indices and new offsets for rows ``idx`` of a jagged array."""
    starts = offsets[idx]
    lens = offsets[idx + 1] - starts
    new_off = np.zeros(idx.size + 1, dtype=np.int64)
    np.cumsum(lens, out=new_off[1:])
    elems = np.repeat(starts - new_off[:-1], lens) + np.arange(int(new_off[-1]), dtype=np.int64)
    return elems, new_off


@dataclass
class Rows:
    """``dense`` float32 [n, Dd], ``labels`` float32 [n, T]; per sparse key: ``values`` int64,
    ``offsets`` int64 [n + 1] (starting at 0), ``weights`` float32 or None; ``teacher`` float32
    [n, T] (a teacher's scores) or None; ``key_columns``: raw columns carried along, name -> [n]
    values (``Batch.keys``), or None."""

    dense: np.ndarray
    labels: np.ndarray
    keys: Sequence[str]
    values: list[np.ndarray]
    offsets: list[np.ndarray]
    weights: list[np.ndarray | None]
    teacher: np.ndarray | None = None
    key_columns: dict[str, np.ndarray] | None = None
    packed: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def nbytes(self) -> int:
        n = self.dense.nbytes + self.labels.nbytes + (self.teacher.nbytes if self.teacher is not None else 0)
        n += sum(v.nbytes + o.nbytes for v, o in zip(self.values, self.offsets))
        return n + sum(w.nbytes for w in self.weights if w is not None)

    def take(self, idx: np.ndarray) -> "Rows":
        """Rows ``idx`` (any order, repeats allowed)."""
        idx = np.asarray(idx, dtype=np.int64)
        vals, offs, ws = [], [], []
        for v, o, w in zip(self.values, self.offsets, self.weights):
            elems, new_off = _take_jagged(o, idx)
            vals.append(v[elems])
            offs.append(new_off)
            ws.append(None if w is None else w[elems])
        teacher = self.teacher[idx] if self.teacher is not None else None
        kc = None if self.key_columns is None else {k: v[idx] for k, v in self.key_columns.items()}
        return Rows(self.dense[idx], self.labels[idx], self.keys, vals, offs, ws, teacher, kc)

    def slice(self, start: int, stop: int) -> "Rows":
        """Rows ``start:stop`` (views where possible)."""
        stop = min(stop, len(self))
        vals, offs, ws = [], [], []
        for v, o, w in zip(self.values, self.offsets, self.weights):
            a, b = int(o[start]), int(o[stop])
            vals.append(v[a:b])
            offs.append(o[start : stop + 1] - a)
            ws.append(None if w is None else w[a:b])
        teacher = self.teacher[start:stop] if self.teacher is not None else None
        kc = None if self.key_columns is None else {k: v[start:stop] for k, v in self.key_columns.items()}
        return Rows(self.dense[start:stop], self.labels[start:stop], self.keys, vals, offs, ws, teacher, kc)

    @staticmethod
    def concat(parts: Sequence["Rows"]) -> "Rows":
        """Rows of ``parts`` one after another (all with the same keys)."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        vals, offs, ws = [], [], []
        for k in range(len(first.keys)):
            vals.append(np.concatenate([p.values[k] for p in parts]))
            ends = np.cumsum([0] + [int(p.offsets[k][-1]) for p in parts[:-1]])
            offs.append(np.concatenate([first.offsets[k][:1]] + [p.offsets[k][1:] + e for p, e in zip(parts, ends)]))
            if all(p.weights[k] is None for p in parts):
                ws.append(None)
            else:
                ws.append(np.concatenate([
                    p.weights[k] if p.weights[k] is not None else np.ones(p.values[k].size, np.float32)
                    for p in parts
                ]))
        dense = np.concatenate([p.dense for p in parts])
        labels = np.concatenate([p.labels for p in parts])
        teacher = np.concatenate([p.teacher for p in parts]) if first.teacher is not None else None
        kc = None if first.key_columns is None else \
            {k: np.concatenate([p.key_columns[k] for p in parts]) for k in first.key_columns}  # type: ignore[index]  # same layout
        return Rows(dense, labels, first.keys, vals, offs, ws, teacher, kc)

    def to_batch(self) -> Batch:
        """The :class:`~ember.batch.Batch` of these rows (may share memory: Rows are never mutated)."""
        n = len(self.dense)
        weights = None
        if self.packed is not None and all(w is None for w in self.weights):
            values, lengths = self.packed
        else:
            values = np.concatenate(self.values) if self.values else np.zeros(0, np.int64)
            # every feature's offsets hold n + 1 entries: one diff over them all
            lengths = np.diff(np.stack(self.offsets), axis=1).reshape(-1) if self.offsets else np.zeros(0, np.int64)
        assert lengths.size == n * len(self.offsets)
        if any(w is not None for w in self.weights):
            weights = torch.from_numpy(np.concatenate([
                w if w is not None else np.ones(v.size, np.float32) for v, w in zip(self.values, self.weights)
            ]).astype(np.float32, copy=False))
        sparse = SparseFeatures(
            list(self.keys),
            torch.from_numpy(values.astype(np.int64, copy=False)),
            torch.from_numpy(lengths.astype(np.int64, copy=False)),
            weights,
        )
        dense = torch.from_numpy(np.ascontiguousarray(self.dense, dtype=np.float32))
        labels = torch.from_numpy(np.ascontiguousarray(self.labels, dtype=np.float32))
        teacher = torch.from_numpy(np.ascontiguousarray(self.teacher, dtype=np.float32)) if self.teacher is not None else None
        return Batch(dense, sparse, labels, teacher, keys=self.key_columns)
