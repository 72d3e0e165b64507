"""The all-to-all exchanges of a sharded lookup: IDs to their owners, rows back, gradients
to the owners. Only ``torch.distributed`` collectives; every rank calls them in the same order.

Each exchange of variable-length data first swaps its split sizes (one small all-to-all of
counts), then the payload with ``all_to_all_single``. A large payload goes in pieces
(``chunk_bytes``, ``distributed.exchange_chunk_bytes``): a rank that enters an all-to-all
first would otherwise write its whole payload into the network's queues at once, and the
exchanges after it (small ones: the next batch's split sizes) wait behind those bytes on the
link while the other direction idles; in pieces, no rank sends more than one piece ahead of its
peers and both directions of a link carry data together. Bytes that leave or reach this rank
(its own share, which never crosses, is not counted) are summed per kind of traffic (``KINDS``:
split counts, IDs, rows, gradients, the dense all-reduce, the tower exchanges) and per
direction, and separately the part that crosses nodes, until ``take_stats``.
"""

from __future__ import annotations

import copy
import math
import threading
from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["Exchange", "KINDS"]

KINDS = ("counts", "ids", "rows", "grads", "dense", "tower_ids", "tower_out", "tower_grads", "eval")
"""Kinds of traffic counted: ``counts`` the split sizes swapped before each payload; ``ids`` the
IDs sent to their owners; ``rows`` the weights returned; ``grads`` the embedding gradients sent
to the owners; ``dense`` the DDP all-reduce payload (bytes of the gradient buckets this rank
hands to the all-reduce); ``tower_*`` the tower placement's exchanges
(``ember.distributed.towers``); ``eval`` every all-to-all of evaluation (IDs and rows). Not
counted: ``any``'s all-reduce of a few flags per table group and step."""


class Exchange:
    """All-to-all over ``group`` (None: the default group) with tensors staged on ``device``
    (CPU for gloo, this rank's GPU for NCCL); results come back on the payload's device.

    Args:
        rank: this process's rank in ``group``.
        world_size: ranks in ``group``.
        device: where collectives take their tensors.
        group: the process group (a dedicated one keeps embedding traffic apart from DDP's).
        nodes: the node of each rank (bytes to or from another node are also counted as
            crossing nodes); None: one node.
        chunk_bytes: an all-to-all told its ``peak`` goes in pieces of at most this many bytes
            between two ranks (the module docstring); 0: in one piece.
    """

    def __init__(self, rank: int, world_size: int, device: torch.device, group: dist.ProcessGroup | None = None,
                 nodes: Sequence[int] | None = None, chunk_bytes: int = 0) -> None:
        self.rank, self.world_size, self.device, self.group = rank, world_size, device, group
        self.chunk_bytes = chunk_bytes
        self.nodes = list(nodes) if nodes is not None else [0] * world_size
        if len(self.nodes) != world_size:
            raise ValueError(f"Exchange: {len(self.nodes)} node numbers for {world_size} ranks")
        # per kind: [sent, received, sent to other nodes, received from other nodes]; shared
        # with the exchanges ``on_group`` makes, which count from other threads
        self.traffic: dict[str, list[int]] = {k: [0, 0, 0, 0] for k in KINDS}
        self._calls = [0]
        self._lock = threading.Lock()

    def on_group(self, group: dist.ProcessGroup) -> "Exchange":
        """This exchange over another process group (the same ranks) with the same counters:
        the collectives of each group come in one order on every rank however the threads that
        issue them interleave (e.g. the fetches of a stage thread, the updates of another)."""
        other = copy.copy(self)
        other.group = group
        return other

    @property
    def calls(self) -> int:
        """All-to-all calls since the last ``take_stats`` (every group sharing the counters)."""
        return self._calls[0]

    def _zero(self) -> None:
        with self._lock:
            for v in self.traffic.values():
                v[:] = [0, 0, 0, 0]
            self._calls[0] = 0

    @property
    def bytes_sent(self) -> int:
        """All-to-all bytes sent to other ranks since the last ``take_stats`` (every kind but ``dense``)."""
        return sum(v[0] for k, v in self.traffic.items() if k != "dense")

    @property
    def bytes_received(self) -> int:
        return sum(v[1] for k, v in self.traffic.items() if k != "dense")

    def note(self, kind: str, sent: int, received: int, sent_cross: int = 0, received_cross: int = 0) -> None:
        """Count bytes of ``kind`` (one of ``KINDS``) that left and reached this rank."""
        with self._lock:
            t = self.traffic[kind]
            t[0] += sent
            t[1] += received
            t[2] += sent_cross
            t[3] += received_cross

    def _note_splits(self, kind: str, row: int, send_splits: Sequence[int], recv_splits: Sequence[int]) -> None:
        """Count an all-to-all's rows of ``row`` bytes, those to and from other ranks (and nodes)."""
        me = self.nodes[self.rank]
        away = [r for r in range(self.world_size) if self.nodes[r] != me]
        self.note(kind, row * (sum(send_splits) - send_splits[self.rank]), row * (sum(recv_splits) - recv_splits[self.rank]),
                  row * sum(send_splits[r] for r in away), row * sum(recv_splits[r] for r in away))

    def counts(self, send: Tensor, kind: str = "counts") -> Tensor:
        """``send`` [N, k] int64 (row r: counts for rank r) -> [N, k] (row s: what rank s sends here)."""
        if send.shape[0] != self.world_size:
            raise ValueError(f"Exchange.counts: expected {self.world_size} rows, got {send.shape[0]}")
        k = send.shape[1]
        out = self.all_to_all(send.to(torch.int64).reshape(-1), [k] * self.world_size, [k] * self.world_size, kind)
        return out.reshape(self.world_size, k)

    def all_to_all(self, payload: Tensor, send_splits: Sequence[int], recv_splits: Sequence[int],
                   kind: str = "rows", tail: tuple[int, str] | None = None, peak: int | None = None) -> Tensor:
        """Rows ``payload[send offsets of r]`` go to rank r; returns the rows every rank sent here,
        source rank after source rank ([sum(recv_splits), *payload.shape[1:]]). ``kind`` (one of
        ``KINDS``) is the counter its bytes go to; ``tail = (k, kind2)``: the last k rows of every
        rank's block are control data riding along, counted under ``kind2``. ``peak``: the most
        rows any rank sends any other in this exchange, the same number on every rank (then it
        goes in pieces of at most ``chunk_bytes``, the same pieces everywhere); None: in one."""
        send_splits, recv_splits = [int(s) for s in send_splits], [int(s) for s in recv_splits]
        if sum(send_splits) != payload.shape[0]:
            raise ValueError(f"Exchange.all_to_all: splits sum to {sum(send_splits)}, payload has {payload.shape[0]} rows")
        if kind not in self.traffic:
            raise ValueError(f"Exchange.all_to_all: unknown kind '{kind}'; kinds are {KINDS}")
        home = payload.device
        src = payload.to(self.device).contiguous()
        out = src.new_empty((sum(recv_splits), *payload.shape[1:]))
        row = math.prod(payload.shape[1:]) * src.element_size()
        pieces = self.pieces(peak, row)
        if pieces > 1:
            self._in_pieces(out, src, send_splits, recv_splits, pieces)
        else:
            dist.all_to_all_single(out, src, recv_splits, send_splits, group=self.group)
        k, tail_kind = tail if tail is not None else (0, kind)
        self._note_splits(kind, row, [s - k for s in send_splits], [s - k for s in recv_splits])
        if k:
            self._note_splits(tail_kind, row, [k] * self.world_size, [k] * self.world_size)
        with self._lock:
            self._calls[0] += pieces  # the collectives issued
        return out.to(home)

    def pieces(self, peak: int | None, row_bytes: int) -> int:
        """How many all-to-alls carry an exchange whose largest transfer between two ranks is
        ``peak`` rows of ``row_bytes``: 1 without a ``peak`` or ``chunk_bytes``."""
        if not peak or self.chunk_bytes <= 0:
            return 1
        return max(1, min(peak, -(-peak * row_bytes // self.chunk_bytes)))

    def _in_pieces(self, out: Tensor, src: Tensor, send_splits: list[int], recv_splits: list[int], pieces: int) -> None:
        """``all_to_all_single(out, src, ...)`` as ``pieces`` all-to-alls: piece i carries rows
        [n i / pieces, n (i + 1) / pieces) of each rank's block of n rows, both ways."""
        s_off, r_off = _offsets(send_splits), _offsets(recv_splits)
        for i in range(pieces):
            sends = [(a + n * i // pieces, a + n * (i + 1) // pieces) for a, n in zip(s_off, send_splits)]
            recvs = [(a + n * i // pieces, a + n * (i + 1) // pieces) for a, n in zip(r_off, recv_splits)]
            part = torch.cat([src[a:b] for a, b in sends])
            got = src.new_empty((sum(b - a for a, b in recvs), *src.shape[1:]))
            dist.all_to_all_single(got, part, [b - a for a, b in recvs], [b - a for a, b in sends], group=self.group)
            at = 0
            for a, b in recvs:
                out[a:b] = got[at : at + b - a]
                at += b - a

    def take_stats(self, steps: int = 1) -> dict[str, float]:
        """Traffic since the last call (then reset), for the metrics record. Every rank calls it
        at the same step (it gathers every rank's counters).

        Keys: ``dist.bytes_sent`` / ``dist.bytes_received`` / ``dist.all_to_all_calls``: this
        rank's all-to-all totals since the last call; per kind (``KINDS`` but ``eval``), per
        training step (totals / ``steps``) and averaged over ranks:
        ``dist.<kind>.sent_per_step`` / ``received_per_step``, plus ``dist.sent_per_step`` (every
        kind), ``dist.sent_per_step_max`` (the busiest rank's), ``dist.cross_node.sent_per_step``
        / ``received_per_step`` (the part to or from other nodes); ``dist.eval.sent``: the
        all-to-all bytes of the evaluations in the interval (every rank's mean).
        """
        out = {"dist.bytes_sent": float(self.bytes_sent), "dist.bytes_received": float(self.bytes_received),
               "dist.all_to_all_calls": float(self.calls)}
        with self._lock:
            counted = [v for k in KINDS for v in self.traffic[k]]
        mine = torch.tensor(counted, dtype=torch.float64, device=self.device)
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(every, mine, group=self.group)
        per_rank = torch.stack(every).cpu().view(self.world_size, len(KINDS), 4)  # [rank, kind, counter]
        steps = max(int(steps), 1)
        mean = per_rank.mean(0) / steps
        for i, k in enumerate(KINDS):
            if k == "eval":
                out["dist.eval.sent"] = float(per_rank[:, i, 0].mean())
                continue
            out[f"dist.{k}.sent_per_step"] = float(mean[i, 0])
            out[f"dist.{k}.received_per_step"] = float(mean[i, 1])
        train = [i for i, k in enumerate(KINDS) if k != "eval"]
        out["dist.sent_per_step"] = float(mean[train, 0].sum())
        out["dist.received_per_step"] = float(mean[train, 1].sum())
        out["dist.sent_per_step_max"] = float(per_rank[:, train, 0].sum(1).max() / steps)
        out["dist.cross_node.sent_per_step"] = float(mean[train, 2].sum())
        out["dist.cross_node.received_per_step"] = float(mean[train, 3].sum())
        self._zero()
        return out


def _offsets(splits: Sequence[int]) -> list[int]:
    out, at = [], 0
    for n in splits:
        out.append(at)
        at += n
    return out
