"""The all-to-all exchanges of a sharded lookup: IDs to their owners, rows back, gradients
to the owners. Only ``torch.distributed`` collectives; every rank calls them in the same order.

Each exchange of variable-length data first swaps its split sizes (one small all-to-all of
counts), then the payload with ``all_to_all_single``. Bytes that leave or reach this rank
(its own share, which never crosses, is not counted) are summed until ``take_stats``.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["Exchange"]


class Exchange:
    """All-to-all over ``group`` (None: the default group) with tensors staged on ``device``
    (CPU for gloo, this rank's GPU for NCCL); results come back on the payload's device.

    Args:
        rank: this process's rank in ``group``.
        world_size: ranks in ``group``.
        device: where collectives take their tensors.
        group: the process group (a dedicated one keeps embedding traffic apart from DDP's).
    """

    def __init__(self, rank: int, world_size: int, device: torch.device, group: dist.ProcessGroup | None = None) -> None:
        self.rank, self.world_size, self.device, self.group = rank, world_size, device, group
        self.bytes_sent = 0
        self.bytes_received = 0
        self.calls = 0

    def counts(self, send: Tensor) -> Tensor:
        """``send`` [N, k] int64 (row r: counts for rank r) -> [N, k] (row s: what rank s sends here)."""
        if send.shape[0] != self.world_size:
            raise ValueError(f"Exchange.counts: expected {self.world_size} rows, got {send.shape[0]}")
        k = send.shape[1]
        out = self.all_to_all(send.to(torch.int64).reshape(-1), [k] * self.world_size, [k] * self.world_size)
        return out.reshape(self.world_size, k)

    def all_to_all(self, payload: Tensor, send_splits: Sequence[int], recv_splits: Sequence[int]) -> Tensor:
        """Rows ``payload[send offsets of r]`` go to rank r; returns the rows every rank sent here,
        source rank after source rank ([sum(recv_splits), *payload.shape[1:]])."""
        send_splits, recv_splits = [int(s) for s in send_splits], [int(s) for s in recv_splits]
        if sum(send_splits) != payload.shape[0]:
            raise ValueError(f"Exchange.all_to_all: splits sum to {sum(send_splits)}, payload has {payload.shape[0]} rows")
        home = payload.device
        src = payload.to(self.device).contiguous()
        out = src.new_empty((sum(recv_splits), *payload.shape[1:]))
        dist.all_to_all_single(out, src, recv_splits, send_splits, group=self.group)
        row = math.prod(payload.shape[1:]) * src.element_size()
        self.bytes_sent += row * (sum(send_splits) - send_splits[self.rank])
        self.bytes_received += row * (sum(recv_splits) - recv_splits[self.rank])
        self.calls += 1
        return out.to(home)

    def any(self, flags: Sequence[bool]) -> list[bool]:
        """Elementwise OR of ``flags`` over ranks (e.g. which tables reached the loss anywhere)."""
        t = torch.tensor([int(f) for f in flags], dtype=torch.int32, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return [bool(v) for v in t.cpu().tolist()]

    def take_stats(self) -> dict[str, float]:
        """Bytes sent and received and all-to-all calls since the last call (then reset)."""
        out = {"dist.bytes_sent": float(self.bytes_sent), "dist.bytes_received": float(self.bytes_received),
               "dist.all_to_all_calls": float(self.calls)}
        self.bytes_sent = self.bytes_received = self.calls = 0
        return out
