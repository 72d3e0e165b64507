"""The hot rows' gather and scatter as one masked kernel each (Triton, on a GPU).

``HotRows`` reads each record of a step from device memory where it is hot and from pinned host
memory elsewhere. With tensor operations that takes a gather from each (every operation keeps a
fixed shape, so a hot record's host-side read goes to the scratch row instead) and a select: a
hot record still costs a read across PCIe, of the scratch row, and its write-back a write
there. A masked load or store touches no memory, so a kernel that reads (or writes) each record
where it lives moves only the cold records over PCIe: one launch for the gather, one for the
scatter, inside the step's CUDA graph like any other.

Used on a CUDA device when Triton is importable (it ships with PyTorch's CUDA builds) and
``EMBER_TRITON`` is not ``0``; the tensor operations are the reference (and what a CPU runs).
Records are moved as 32-bit words, bit for bit. A kernel that cannot be built or launched is
said once, with the reason, and the tensor operations run from then on.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch import Tensor

__all__ = ["usable", "gather", "scatter", "disable"]

log = logging.getLogger("ember.tiers")

try:  # (PyTorch's CUDA wheels bring Triton; a CPU build has none: the tensor operations run)
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001  (an import of a mismatched build can fail in many ways)
    triton = None
    tl = None

_off: str | None = None  # why the kernels are not used (set once, said once)

if triton is not None:
    @triton.jit
    def _locate(rows, slot, n, width, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
        # this program's block of a call: positions r, their record numbers and arena slots, the
        # hot mask, the columns and the mask of real cells
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        r_ok = r < n
        rec = tl.load(rows + r, mask=r_ok, other=0).to(tl.int64)
        s = tl.load(slot + rec, mask=r_ok, other=-1).to(tl.int64)
        c = tl.arange(0, BLOCK_W)
        return r.to(tl.int64), rec, s, s >= 0, c, r_ok[:, None] & (c < width)[None, :]

    @triton.jit
    def _gather_kernel(host, arena, rows, slot, out, n, width,
                       BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
        r, rec, s, hot, c, m = _locate(rows, slot, n, width, BLOCK_R, BLOCK_W)
        far = tl.load(host + rec[:, None] * width + c[None, :], mask=m & ~hot[:, None], other=0)
        near = tl.load(arena + s[:, None] * width + c[None, :], mask=m & hot[:, None], other=0)
        tl.store(out + r[:, None] * width + c[None, :], tl.where(hot[:, None], near, far), mask=m)

    @triton.jit
    def _scatter_kernel(host, arena, rows, slot, src, n, width,
                        BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
        r, rec, s, hot, c, m = _locate(rows, slot, n, width, BLOCK_R, BLOCK_W)
        v = tl.load(src + r[:, None] * width + c[None, :], mask=m, other=0)
        tl.store(host + rec[:, None] * width + c[None, :], v, mask=m & ~hot[:, None])
        tl.store(arena + s[:, None] * width + c[None, :], v, mask=m & hot[:, None])


def usable(device: torch.device) -> bool:
    """Whether the kernels serve a step on ``device`` (CUDA, Triton importable, not turned off);
    the first time they cannot on a GPU, the reason is said once."""
    global _off
    if device.type != "cuda":
        return False
    if _off is None and triton is None:
        _off = "Triton is not importable here (it ships with PyTorch's CUDA builds)"
        log.info("storage.index: device: hot rows read and written by tensor operations: %s; a hot row's host-side "
                 "read and write go to the scratch row", _off)
    if _off is None and os.environ.get("EMBER_TRITON", "1") == "0":
        _off = "EMBER_TRITON=0"
        log.info("storage.index: device: hot rows read and written by tensor operations (EMBER_TRITON=0)")
    return _off is None


def disable(reason: str) -> None:
    """Stop using the kernels (a build or launch failed), said once."""
    global _off
    if _off is None:
        _off = reason
        log.warning("storage.index: device: the hot rows' kernels failed (%s); their tensor operations run from here "
                    "on (the same results; a hot row's host-side read and write go to the scratch row)", reason)


def _blocks(width: int) -> tuple[int, int]:
    bw = 1 << max(0, (width - 1).bit_length())
    return max(1, 1024 // bw), bw


def _words(t: Tensor) -> Tensor:
    """``t`` as 32-bit integer words (bit for bit, whatever the float values)."""
    return t.view(torch.int32)


def _launch(kernel: Any, n: int, width: int, *args: Any) -> None:
    br, bw = _blocks(width)
    kernel[(triton.cdiv(n, br),)](*args, n, width, BLOCK_R=br, BLOCK_W=bw)


def gather(host_rows: Tensor, arena: Tensor, rows: Tensor, slot: Tensor) -> Tensor:
    """Records [N, width] of record numbers ``rows``: ``arena[slot[r]]`` where ``slot[r] >= 0``,
    else ``host_rows[r]``; each read only where it is taken."""
    n, width = rows.numel(), host_rows.shape[1]
    out = torch.empty(n, width, dtype=host_rows.dtype, device=arena.device)
    if n:
        _launch(_gather_kernel, n, width, _words(host_rows), _words(arena), rows, slot, _words(out))
    return out


def scatter(host_rows: Tensor, arena: Tensor, rows: Tensor, slot: Tensor, records: Tensor) -> None:
    """Write ``records`` [N, width] to ``arena[slot[r]]`` where ``slot[r] >= 0``, else to
    ``host_rows[r]``; each written only where it lives."""
    n, width = rows.numel(), host_rows.shape[1]
    if n:
        _launch(_scatter_kernel, n, width, _words(host_rows), _words(arena), rows, slot,
                _words(records.contiguous()))
