"""The single import site of ember's compiled core, with a pure numpy/torch fallback per kernel.

``import ember`` never needs the extension: each kernel below runs natively when
``ember._ember_native`` was built (``pip install -e .`` with a C compiler) and otherwise falls
back to numpy or torch with the same results. ``require()`` raises an ImportError naming the
missing part and the fix, for callers that want the native path or nothing.

Example:
    >>> import numpy as np
    >>> uniq, inverse, counts = unique_segments(np.array([5, 3, 5, 7, 7]), np.array([0, 3, 5]))
    >>> uniq.tolist(), inverse.tolist(), counts.tolist()
    ([5, 3, 7], [0, 1, 0, 2, 2], [2, 1])
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Callable, Sequence, TypeVar

import numpy as np
import torch

__all__ = [
    "chunks", "index_add_features", "index_add_rows", "is_available", "require", "rowwise_adagrad_", "run_chunks",
    "unique_segments",
]

try:
    from ember import _ember_native as _core  # type: ignore[attr-defined]  # optional extension
except ImportError as _e:  # built without a compiler, or not built yet
    _core = None
    _import_error: ImportError | None = _e
else:
    _import_error = None


def is_available() -> bool:
    """True when the compiled core was built and imports."""
    return _core is not None


def require() -> ModuleType:
    """The compiled core, or an ImportError that says how to build it."""
    if _core is None:
        raise ImportError(
            "ember native core (ember._ember_native) is not available "
            f"({_import_error}); reinstall with a C compiler present: pip install -e ."
        )
    return _core


# ---- running a kernel on several threads ---------------------------------------------------
# The kernels release the GIL, so independent parts of one call (tables, segments, row ranges)
# run on as many threads as torch may use (torch.get_num_threads(): the user's CPU budget).

MIN_PARALLEL_ROWS = 16384  # below this a hand-off to another thread (~30-50 us) does not pay
_pool: tuple[int, int, ThreadPoolExecutor] | None = None  # (pid, workers, pool)
T = TypeVar("T")


def chunks(weights: Sequence[int] | np.ndarray, cuts: Sequence[bool] | None = None, min_rows: int | None = None) -> list[tuple[int, int]]:
    """Split items ``0..len(weights)`` into contiguous [lo, hi) ranges of about equal total weight,
    one per thread torch may use (one range when the total is below ``min_rows``, default
    ``MIN_PARALLEL_ROWS``).

    ``cuts[i]`` False forbids a range boundary before item i (items that must stay together).
    """
    w = np.asarray(weights, dtype=np.int64)
    n, total = w.size, int(w.sum())
    least = MIN_PARALLEL_ROWS if min_rows is None else min_rows
    k = min(torch.get_num_threads(), n, max(1, total // max(least, 1)))
    if k <= 1:
        return [(0, n)]
    ends = np.cumsum(w)
    bounds = [0]
    for j in range(1, k):
        i = int(np.searchsorted(ends, total * j / k)) + 1  # first item after the j-th share
        while cuts is not None and i < n and not cuts[i]:
            i += 1
        if bounds[-1] < i < n:
            bounds.append(i)
    bounds.append(n)
    return list(zip(bounds[:-1], bounds[1:]))


def run_chunks(fn: Callable[[int, int], T], parts: list[tuple[int, int]]) -> list[T]:
    """``[fn(lo, hi) for lo, hi in parts]``, the first on this thread, the others on a pool."""
    if len(parts) == 1:
        return [fn(*parts[0])]
    global _pool
    workers = max(1, torch.get_num_threads() - 1)
    if _pool is None or _pool[0] != os.getpid() or _pool[1] != workers:  # a forked child needs its own
        _pool = (os.getpid(), workers, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ember-kernel"))
    futures = [_pool[2].submit(fn, lo, hi) for lo, hi in parts[1:]]
    first = fn(*parts[0])
    return [first] + [f.result() for f in futures]


def unique_segments(
    ids: np.ndarray, bounds: np.ndarray, native: bool | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Deduplicate each segment ``ids[bounds[j]:bounds[j+1]]`` on its own.

    Returns ``(uniq, inverse, counts)``: the unique IDs of every segment one after another
    (first-occurrence order within a segment), the index of each ID in ``uniq`` (already
    shifted by the uniques of earlier segments), and the number of uniques per segment.

    Args:
        ids: int64 [N].
        bounds: int64 [S+1], non-decreasing, from 0 to N.
        native: force (True) or avoid (False) the compiled kernel; None picks it when built.
    """
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    bounds = np.ascontiguousarray(bounds, dtype=np.int64)
    if (native is None and _core is not None) or native:
        core = require()
        uniq = np.empty_like(ids)
        inverse = np.empty_like(ids)
        counts = np.empty(bounds.size - 1, dtype=np.int64)

        def part(lo: int, hi: int) -> int:  # segments lo..hi-1, numbered from their first value
            a, b = int(bounds[lo]), int(bounds[hi])
            return core.unique_segments(ids[a:b], bounds[lo : hi + 1] - a, uniq[a:b], inverse[a:b], counts[lo:hi])

        parts = chunks(np.diff(bounds))
        totals = run_chunks(part, parts)
        if len(parts) == 1:
            return uniq[: totals[0]], inverse, counts
        pieces, shift = [], 0  # each part's uniques were written from its first value: close the gaps
        for (lo, hi), total in zip(parts, totals):
            a, b = int(bounds[lo]), int(bounds[hi])
            pieces.append(uniq[a : a + total])
            if shift:
                inverse[a:b] += shift
            shift += total
        return np.concatenate(pieces), inverse, counts
    return _unique_segments_fallback(ids, bounds)


def _unique_segments_fallback(ids: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def _row_view(t: torch.Tensor) -> tuple[np.ndarray, int] | None:
    """A [n, d] CPU float32 tensor with unit column stride as (flat numpy view over its rows, row
    stride), for kernels that take row-strided buffers; None when it is not one."""
    if t.device.type != "cpu" or t.dtype != torch.float32 or t.dim() != 2 or t.requires_grad:
        return None
    n, d = t.shape
    if n and d and t.stride(1) != 1 and d > 1:
        return None
    stride = t.stride(0) if n > 1 else d
    if n > 1 and stride < d:
        return None
    return t.as_strided(((n - 1) * stride + d if n else 0,), (1,)).numpy(), stride


def rowwise_adagrad_(rows: torch.Tensor, state: torch.Tensor, grads: torch.Tensor, lr: float, eps: float) -> bool:
    """Row-wise Adagrad on rows [n, D], state [n, 1], grads [n, D] in place, natively; returns
    False (nothing done) without the core or for tensors it does not take (the caller then
    runs the torch ops). One pass per row instead of six over the batch; same formula, the
    mean of squares summed in double (may round apart from torch's by an ulp; the squares of
    tiny gradients would be float denormals, ~20x slower on x86)."""
    if _core is None or rows.shape != grads.shape or state.shape != (rows.shape[0], 1) or rows.shape[1] == 0:
        return False
    views = [_row_view(t) for t in (rows, state, grads)]
    if any(v is None for v in views):
        return False
    (r, rs), (s, ss), (g, gs) = views  # type: ignore[misc]
    d = rows.shape[1]

    def part(lo: int, hi: int) -> None:  # rows lo..hi-1
        _core.rowwise_adagrad(  # type: ignore[union-attr]
            r[lo * rs : (hi - 1) * rs + d], s[lo * ss : (hi - 1) * ss + 1], g[lo * gs : (hi - 1) * gs + d],
            hi - lo, d, rs, ss, gs, lr, eps,
        )

    if rows.shape[0]:
        run_chunks(part, chunks(np.full(rows.shape[0], 1)))
    return True


def index_add_rows(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``out.index_add_(0, index, src)`` (rows of ``src`` summed into ``out``), in place; returns ``out``.

    On CPU float32 the compiled loop is 2-3x faster than torch's for narrow rows (embedding
    gradients, D = 8-64) and gives the same sums in the same order; elsewhere torch's. ``src``
    may be row-strided (``src.stride() == (S, 1)``, S >= D): no copy to a contiguous tensor.
    """
    view = _row_view(src) if _out_ok(out, index) and src.shape == (index.numel(), out.shape[1]) else None
    if view is None:
        return out.index_add_(0, index, src)
    _core.index_add_rows(out.numpy(), index.numpy(), view[0], out.shape[1], view[1])  # type: ignore[union-attr]
    return out


def index_add_features(
    out: torch.Tensor, index: torch.Tensor, srcs: list[torch.Tensor | None], owner: Sequence[int] | None = None
) -> torch.Tensor:
    """``out.index_add_(0, index[f*B:(f+1)*B], srcs[f])`` for every feature f whose src is not
    None (each [B, D]), in place; returns ``out``.

    ``owner[f]`` (non-decreasing) names the rows of ``out`` feature f may write, e.g. its table in
    a group: features of different owners write different rows, so the native loop may run
    them on several threads; without it, one thread.

    The compiled loop runs over tiles of batch rows, each tile feature by feature, so F
    row-strided slices of one [B, F', D] gradient are read once with no stacked copy. Rows of a
    table shared by several features may sum in another order than feature by feature (may
    round apart), the same order on every run.
    """
    b = index.numel() // max(len(srcs), 1)
    views = []
    if _out_ok(out, index) and index.numel() == b * len(srcs):
        views = [None if s is None else _row_view(s) if s.shape == (b, out.shape[1]) else None for s in srcs]
    if not views or any(v is None and s is not None for v, s in zip(views, srcs)):
        for f, s in enumerate(srcs):
            if s is not None:
                out.index_add_(0, index[f * b : (f + 1) * b], s)
        return out
    strides = np.array([out.shape[1] if v is None else v[1] for v in views], dtype=np.int64)
    flat = [None if v is None else v[0] for v in views]
    out_np, index_np = out.numpy(), index.numpy()

    def part(lo: int, hi: int) -> None:  # features lo..hi-1
        _core.index_add_features(out_np, index_np[lo * b : hi * b], flat[lo:hi], strides[lo:hi], b, out.shape[1])  # type: ignore[union-attr]

    if owner is None:
        part(0, len(srcs))
    else:
        cuts = [True] + [owner[f] != owner[f - 1] for f in range(1, len(srcs))]
        run_chunks(part, chunks(np.full(len(srcs), b), cuts))
    return out


def _out_ok(out: torch.Tensor, index: torch.Tensor) -> bool:
    """Whether the native scatter-adds can write ``out`` [U, D] at int64 ``index``."""
    return (
        _core is not None and out.device.type == "cpu" and out.dtype == torch.float32 and out.dim() == 2
        and out.is_contiguous() and out.shape[1] > 0 and not out.requires_grad
        and index.dtype == torch.int64 and index.is_contiguous() and index.device.type == "cpu"
    )


def read_rows(tables, ids, bounds, out, out_slot, clocks, out_hits, r) -> None:  # temporary shim
    core = require()

    def part(lo: int, hi: int) -> None:
        a, b = bounds[lo], bounds[hi]
        core.lookup_rows_many(tables[lo:hi], ids[a:b], bounds[lo : hi + 1] - a, out[a:b], out_slot[a:b],
                              clocks[lo:hi], out_hits[lo:hi], r)

    run_chunks(part, chunks(np.diff(bounds)))


def write_rows(tables, ids, bounds, slot, records, next, clocks, used, r) -> None:  # temporary shim
    core = require()

    def part(lo: int, hi: int) -> None:
        a, b = bounds[lo], bounds[hi]
        core.store_rows_many(tables[lo:hi], ids[a:b], bounds[lo : hi + 1] - a, slot[a:b], records[a:b],
                             next[lo:hi], clocks[lo:hi], used[lo:hi], r)

    run_chunks(part, chunks(np.diff(bounds)))
