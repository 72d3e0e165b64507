"""The rows of several tiers in one buffer: how a table group reads and writes its tables.

A group's buffer holds its tables' rows back to back (segments). When every tier is a memory
tier the C core can serve, one native pass reads (or writes) all segments; otherwise each
tier serves its own segment through the ``Tier`` protocol, the tiers side by side on the
kernels' threads (a disk tier waits on page faults while the other tables read and write). A
lone table is a group of one.
"""

from __future__ import annotations

from functools import partial
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from ember import _native
from ember.tiers.base import Tier
from ember.tiers.host import HostTier, _check_rows

__all__ = ["read_segments", "write_segments", "remove_segments", "read_bf16_segments", "write_bf16_segments"]


def read_segments(tiers: Sequence[Tier], ids: Sequence[Tensor], out: Tensor) -> Tensor:
    """``tiers[j].get_into(ids[j], segment j of out)`` for every j; returns the found mask [N]. In
    one native pass when every tier is a memory tier the C core serves, else the tiers side by
    side on the kernels' threads (``run_each``)."""
    sizes = [i.numel() for i in ids]
    _check_rows(tiers, sizes, out, "out")
    if len(tiers) > 1 and _reads_natively(tiers, out):
        return HostTier.read_native(tiers, ids, out)  # type: ignore[arg-type]
    if len(tiers) == 1:
        return tiers[0].get_into(ids[0], out)
    # each tier serves its own segment, the tiers side by side on the kernels' threads (a disk
    # tier's read waits on page faults while the others read)
    reads = [partial(t.get_into, i, rows) for t, i, rows in zip(tiers, ids, out.split(sizes))]
    return torch.cat(_native.run_each(reads))


def write_segments(tiers: Sequence[Tier], ids: Sequence[Tensor], records: Tensor) -> None:
    """``tiers[j].put(ids[j], segment j of records)`` for every j, in one native pass when it can,
    else the tiers side by side on the kernels' threads (``run_each``)."""
    sizes = [i.numel() for i in ids]
    _check_rows(tiers, sizes, records, "records")
    if len(tiers) > 1 and HostTier.write_segments_native(tiers, ids, records):
        return
    _native.run_each([partial(t.put, i, rows) for t, i, rows in zip(tiers, ids, records.split(sizes))])


def remove_segments(tiers: Sequence[Tier], ids: Sequence[Tensor]) -> None:
    """``tiers[j].remove(ids[j])`` for every j (each segment's IDs unique), in one native pass
    over the indexes when every tier is a HostTier, else the tiers side by side (``run_each``)."""
    if all(isinstance(t, HostTier) for t in tiers):
        HostTier.remove_native(tiers, ids)  # type: ignore[arg-type]
        return
    _native.run_each([partial(t.remove, i) for t, i in zip(tiers, ids) if i.numel()])


def read_bf16_segments(tiers: Sequence[Tier], ids: Sequence[Tensor], out: Tensor, dim: int) -> Tensor | None:
    """A bf16 group's read straight into its fp32 records ``out`` [N, width] (``dim`` weights,
    widened from the tiers' packed rows on the way: no packed copy of the batch, no decode pass)
    when every tier is a HostTier the C core reads into ``out``: the found mask [N]; else None,
    nothing read (``read_segments`` of the words and the codec's decode then)."""
    if tiers and _reads_natively(tiers, out):
        return HostTier.read_native(tiers, ids, out, bf16_dim=dim)  # type: ignore[arg-type]
    return None


def _reads_natively(tiers: Sequence[Tier], out: Tensor) -> bool:
    """Whether every tier is a HostTier the C core reads straight into ``out``."""
    return HostTier.native_buffer(out) and HostTier.native_tiers(tiers)


def write_bf16_segments(tiers: Sequence[Tier], ids: Sequence[Tensor], records: Tensor, dim: int,
                        seeds: np.ndarray, steps: np.ndarray, adagrad: tuple[np.ndarray, np.ndarray] | None = None) -> bool:
    """A bf16 group's write of its fp32 records [N, width], packed on the way with tier j's
    stochastic rounding (``seeds[j]``, ``steps[j]``: the bits ``RowCodec.encode`` gives, with no
    packed copy of the batch), when every tier is a HostTier the C core writes (True); else
    nothing written (False: the caller encodes and ``write_segments``). ``adagrad``: the
    records' row-wise Adagrad step first, in the same pass (``HostTier.write_native``)."""
    return bool(tiers) and HostTier.write_segments_native(tiers, ids, records, (dim, seeds, steps), adagrad)
