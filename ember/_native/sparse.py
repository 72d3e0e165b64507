"""Sparse gradients and the optimizer (``ember.embedding.pooling``, ``ember.embedding.group``,
``ember.optim``): per-row gradient sums and row-wise Adagrad."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ember import _native


def _row_view(t: torch.Tensor) -> tuple[np.ndarray, int] | None:
    """A [n, d] CPU float32 tensor with unit column stride as (flat numpy view over its rows, row
    stride), for kernels that take row-strided buffers; None when it is not one."""
    if t.dim() != 2:
        return None
    views = _row_views([t], (t.shape[0], t.shape[1]))
    return None if views is None else views[0]


def _row_views(ts: Sequence[torch.Tensor | None], shape: tuple[int, int]) -> list[tuple[np.ndarray, int] | None] | None:
    """``_row_view`` of each tensor of ``shape`` [n, d] (None stays None), or None when one is not
    such a view: a CPU float32 tensor with unit column stride, its rows ``stride`` >= d apart.
    Tensors of one storage (a model's stacked gradient unbound per feature) share one numpy view
    of it, sliced per tensor: a few attribute reads each instead of a strided copy of the tensor
    object and its numpy view (~270 -> ~80 us for 26 features)."""
    n, d = shape
    out: list[tuple[np.ndarray, int] | None] = []
    base, ptr = None, None
    for t in ts:
        if t is None:
            out.append(None)
            continue
        strides = t.stride()
        if (t.shape != shape or t.dtype is not torch.float32 or not t.is_cpu or t.requires_grad
                or (n and d > 1 and strides[1] != 1)):
            return None
        stride = strides[0] if n > 1 else d
        if n > 1 and stride < d:
            return None
        storage = t.untyped_storage()
        if storage.data_ptr() != ptr:
            ptr = storage.data_ptr()
            base = torch.empty(0, dtype=torch.float32).set_(storage).numpy()
        off, size = t.storage_offset(), (n - 1) * stride + d if n else 0
        view = base[off : off + size]  # type: ignore[index]
        if view.size < size:  # (a view past its storage's end: not one a model hands back)
            return None
        out.append((view, stride))
    return out


def rowwise_adagrad_(rows: torch.Tensor, state: torch.Tensor, grads: torch.Tensor, lr: float, eps: float) -> bool:
    """Row-wise Adagrad on rows [n, D], state [n, 1], grads [n, D] in place:
    ``G += mean_j(g_j^2)``; ``w -= lr * g / (sqrt(G) + eps)``.

    The compiled kernel (CPU float32 tensors with unit column stride, e.g. the weight and
    accumulator views of one records buffer; on several threads when large) makes one pass per
    row instead of six over the batch; same formula, the mean of squares summed in double (may
    round apart from torch's by an ulp; the squares of tiny gradients would be float denormals,
    ~20x slower on x86). Other tensors, or no core: the torch ops, ``_rowwise_adagrad_py``.

    Returns True: the update is always done (the bool stays for callers written when False
    meant "not done, run the torch ops yourself").
    """
    views = None
    if _native._core is not None and rows.shape == grads.shape and state.shape == (rows.shape[0], 1) and rows.shape[1] > 0:
        views = [_row_view(t) for t in (rows, state, grads)]
    if views is None or any(v is None for v in views):
        _rowwise_adagrad_py(rows, state, grads, lr, eps)
        return True
    (r, rs), (s, ss), (g, gs) = views  # type: ignore[misc]
    n = rows.shape[0]
    if n:  # (row ranges on several threads when there are many)
        _native._core.rowwise_adagrad(r, s, g, n, rows.shape[1], rs, ss, gs, lr, eps, _native.part_count(n))
    return True


def _rowwise_adagrad_py(rows: torch.Tensor, state: torch.Tensor, grads: torch.Tensor, lr: float, eps: float) -> None:
    state.add_(grads.square().mean(dim=1, keepdim=True))
    rows.addcdiv_(grads, state.sqrt().add_(eps), value=-lr)


def take_rows(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``src.index_select(0, index)`` (a new [k, d] tensor): the single-hot pooling's forward.
    For a CPU float32 [n, d] ``src`` with unit column stride (contiguous, or row-strided such as
    the weights ``records[:, :dim]`` of a group's records, read in place) and int64 ``index``,
    rows copied by the native core (``gather_rows``: bounds checked, the GIL released) in row
    ranges on torch's threads; torch's CPU ``index_select`` of short rows is ~1.5x slower, ~2x
    from a row-strided view. Else, and without the core, ``_take_rows_py``."""
    view = _row_view(src.detach()) if _native._core is not None else None
    if view is None or index.dim() != 1 or index.dtype is not torch.int64 or not index.is_cpu or not index.is_contiguous():
        return _take_rows_py(src, index)
    out = torch.empty(index.numel(), src.shape[1])
    (s, r), i = view, index.numpy()
    _native._core.gather_rows(s, i, out.numpy(), src.shape[1], r, _native.part_count(i.size))  # type: ignore[union-attr]
    return out


def _take_rows_py(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return src.index_select(0, index)


def index_add_rows(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``out.index_add_(0, index, src)`` (rows of ``src`` summed into ``out``), in place; returns ``out``.

    On CPU float32 the compiled loop is 2-3x faster than torch's for narrow rows (embedding
    gradients, D = 8-64) and gives the same sums in the same order; elsewhere (or without the
    core) torch's, ``_index_add_rows_py``. ``src`` may be row-strided
    (``src.stride() == (S, 1)``, S >= D): no copy to a contiguous tensor.
    """
    view = _row_view(src) if _out_ok(out, index) and src.shape == (index.numel(), out.shape[1]) else None
    if view is None:
        return _index_add_rows_py(out, index, src)
    _native._core.index_add_rows(out.numpy(), index.numpy(), view[0], out.shape[1], view[1])  # type: ignore[union-attr]
    return out


def _index_add_rows_py(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    return out.index_add_(0, index, src)


def index_add_features(
    out: torch.Tensor, index: torch.Tensor, srcs: list[torch.Tensor | None], owner: Sequence[int] | None = None
) -> torch.Tensor:
    """``out.index_add_(0, index[f*B:(f+1)*B], srcs[f])`` for every feature f whose src is not
    None (each [B, D]), in place; returns ``out``.

    ``owner[f]`` (non-decreasing) names the rows of ``out`` feature f may write, e.g. its table in
    a group: features of different owners write different rows, so the native loop may run
    them on several threads; without it, one thread.

    The compiled loop goes feature by feature, each in batch order (the order of the torch
    reference, so results are bit-identical), reading row-strided slices of one [B, F', D]
    gradient in place (no stacked copy; their rows are prefetched, a stride of ~2 KB defeats
    the hardware's prefetcher). Tensors it does not take, or no core: feature by feature with
    torch, ``_index_add_features_py``.
    """
    b = index.numel() // max(len(srcs), 1)
    views = None
    if _out_ok(out, index) and index.numel() == b * len(srcs):
        views = _row_views(srcs, (b, out.shape[1]))
    if views is None:
        return _index_add_features_py(out, index, srcs)
    strides = np.array([out.shape[1] if v is None else v[1] for v in views], dtype=np.int64)
    flat = [None if v is None else v[0] for v in views]
    parts = None  # features of one owner in one part: the rows they write are theirs
    if owner is not None:
        parts = _native.part_bounds(np.full(len(srcs), b), [True] + [owner[f] != owner[f - 1] for f in range(1, len(srcs))])
    _native._core.index_add_features(out.numpy(), index.numpy(), flat, strides, b, out.shape[1], parts)  # type: ignore[union-attr]
    return out


def _index_add_features_py(out: torch.Tensor, index: torch.Tensor, srcs: list[torch.Tensor | None]) -> torch.Tensor:
    """Torch's: one scatter-add of the features' gradients stacked (a fixed few operations on a
    GPU whatever the number of features; CPU sums in the same order as feature by feature)."""
    b = index.numel() // max(len(srcs), 1)
    live = [f for f, s in enumerate(srcs) if s is not None]
    if not live:
        return out
    if len(live) == len(srcs):
        return out.index_add_(0, index, torch.cat(srcs) if len(srcs) > 1 else srcs[0])  # type: ignore[arg-type]
    idx = torch.cat([index[f * b : (f + 1) * b] for f in live])
    return out.index_add_(0, idx, torch.cat([srcs[f] for f in live]))  # type: ignore[misc]


def _out_ok(out: torch.Tensor, index: torch.Tensor) -> bool:
    """Whether the native scatter-adds can write ``out`` [U, D] at int64 ``index``."""
    return (
        _native._core is not None and out.device.type == "cpu" and out.dtype == torch.float32 and out.dim() == 2
        and out.is_contiguous() and out.shape[1] > 0 and not out.requires_grad
        and index.dtype == torch.int64 and index.is_contiguous() and index.device.type == "cpu"
    )
