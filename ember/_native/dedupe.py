"""Deduplication of a lookup's IDs per table (``ember.embedding.group``)."""

from __future__ import annotations

import numpy as np
import torch

from ember import _native


def unique_segments(ids: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Deduplicate each segment ``ids[bounds[j]:bounds[j+1]]`` on its own.

    Returns ``(uniq, inverse, counts)``: the unique IDs of every segment one after another
    (first-occurrence order within a segment), the index of each ID in ``uniq`` (already
    shifted by the uniques of earlier segments), and the number of uniques per segment.
    Runs on several threads (runs of whole segments) when the call is large enough.

    Args:
        ids: int64 [N].
        bounds: int64 [S+1], non-decreasing, from 0 to N.
    """
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    bounds = np.ascontiguousarray(bounds, dtype=np.int64)
    if bounds.size == 0 or bounds[0] != 0 or bounds[-1] != ids.size or (np.diff(bounds) < 0).any():
        raise ValueError(f"unique_segments: bounds must rise from 0 to len(ids)={ids.size}, got "
                         f"{bounds[:3].tolist()}...{bounds[-3:].tolist()}")  # (the C loop reads within them)
    core = _native._core
    if core is None:
        return _unique_segments_py(ids, bounds)
    uniq = np.empty_like(ids)
    inverse = np.empty_like(ids)
    counts = np.empty(bounds.size - 1, dtype=np.int64)

    total = core.unique_segments(ids, bounds, uniq, inverse, counts, _native.part_bounds(np.diff(bounds)))
    return uniq[:total], inverse, counts


def _unique_segments_py(ids: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    bounds = np.ascontiguousarray(bounds, dtype=np.int64)
    uniqs, inverses, counts = [], [], []
    total = 0
    for j in range(bounds.size - 1):
        seg = torch.from_numpy(ids[bounds[j] : bounds[j + 1]])
        u, inv = torch.unique(seg, sorted=True, return_inverse=True)
        # first-occurrence order, as the native kernel: rank the sorted uniques by first position
        first = torch.full((u.numel(),), seg.numel(), dtype=torch.int64).scatter_reduce_(
            0, inv, torch.arange(seg.numel()), reduce="amin"
        )
        order = torch.argsort(first)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel())
        uniqs.append(u[order].numpy())
        inverses.append((rank[inv] + total).numpy())
        counts.append(u.numel())
        total += u.numel()
    cat = lambda parts: np.concatenate(parts) if parts else np.empty(0, np.int64)  # noqa: E731
    return cat(uniqs), cat(inverses), np.asarray(counts, dtype=np.int64)
