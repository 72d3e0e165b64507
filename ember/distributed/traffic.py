"""A model of a distributed step's communication: bytes per rank from the batch and the tables,
and step time from those bytes and a network's bandwidth and latency (docs/distributed.md, "Communication
model"). ``bench/bench_distributed.py`` and ``tests/distributed/test_traffic.py`` check its byte
predictions against what ``Exchange`` measured.

Per step and rank, with N ranks, a table t of dim ``d_t`` whose unique IDs in this rank's slice
of the batch number ``U_t`` (at most ``B/N x`` IDs per sample, fewer after dedupe), and a group
(tables exchanged together) of ``T_g`` tables:

- ``counts = sum_g (8 (T_g + 1) + 4 d_g ceil(T_g / d_g)) (N-1)`` (split sizes swapped before each
  group's IDs with the rank's largest send, which sets the pieces of the large all-to-alls, and the reached flags riding after each destination's gradients: a block of
  rows of the group's width d_g, which tables reached the loss on this rank);
- ``ids = 8 sum_t U_t (N-1)/N`` (an ID is owned elsewhere with probability (N-1)/N, row-wise by
  hash; table-wise the same on average over ranks);
- ``rows = grads = 4 sum_t d_t U_t (N-1)/N`` (float32 weights back, float32 gradients out);
- ``dense = 2 (N-1)/N x 4 P`` for P dense parameters (a ring all-reduce, per rank).

Sent equals received on average over ranks. With N = G x M ranks (G GPUs per node, M nodes)
and owners spread evenly, the share of a rank's all-to-all bytes to other ranks that crosses
nodes is ``(N-G)/(N-1)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["TableLoad", "predict_bytes", "cross_node_fraction", "Network", "predict_step_time"]

ID_BYTES = 8  # int64 IDs
VALUE_BYTES = 4  # float32 rows and gradients


@dataclass(frozen=True)
class TableLoad:
    """One table's load on one rank per step: ``unique`` IDs of its slice (after dedupe) and ``dim``."""

    unique: float
    dim: int


def predict_bytes(groups: Sequence[Sequence[TableLoad]], world_size: int, dense_params: int = 0) -> dict[str, float]:
    """Bytes one rank sends per step, by kind (``counts``, ``ids``, ``rows``, ``grads``,
    ``dense``, and ``total``), averaged over ranks (module docstring).

    Args:
        groups: the tables, grouped as they are exchanged (one all-to-all per group and phase).
        world_size: ranks N.
        dense_params: parameters of the dense model (its DDP all-reduce).

    Example:
        >>> b = predict_bytes([[TableLoad(100, 16), TableLoad(50, 16)]], 2, dense_params=1000)
        >>> b["ids"], b["rows"], b["counts"], b["dense"]
        (600.0, 4800.0, 88.0, 4000.0)
    """
    n = world_size
    away = (n - 1) / n
    tables = [t for g in groups for t in g]
    flags = [VALUE_BYTES * g[0].dim * -(-len(g) // g[0].dim) if g else 0 for g in groups]
    out = {
        "counts": float(sum((ID_BYTES * (len(g) + 1) + f) * (n - 1) for g, f in zip(groups, flags))),
        "ids": ID_BYTES * sum(t.unique for t in tables) * away,
        "rows": VALUE_BYTES * sum(t.unique * t.dim for t in tables) * away,
    }
    out["grads"] = out["rows"]
    out["dense"] = 2 * away * VALUE_BYTES * dense_params
    out["total"] = sum(out.values())
    return out


def cross_node_fraction(world_size: int, ranks_per_node: int) -> float:
    """The share of a rank's all-to-all bytes to other ranks that goes to other nodes."""
    if world_size <= 1:
        return 0.0
    return (world_size - ranks_per_node) / (world_size - 1)


@dataclass(frozen=True)
class Network:
    """Per-GPU bandwidths (bytes/s) inside a node (NVLink) and between nodes (its share of the
    node's NICs), and the latency of one collective (s)."""

    intra_bw: float = 150e9
    inter_bw: float = 25e9
    latency_s: float = 30e-6


def predict_step_time(bytes_per_rank: dict[str, float], world_size: int, ranks_per_node: int, net: Network,
                      collectives: int, compute_s: float = 0.0) -> dict[str, float]:
    """Step time (s) of one rank: compute, plus each all-to-all byte at the bandwidth of the link
    it takes (the cross-node share at ``inter_bw``, the rest at ``intra_bw``), plus the dense
    all-reduce at the slowest link it spans, plus ``collectives`` x latency. Nothing overlaps
    (an upper bound: DDP overlaps its all-reduce with backward, a pipeline overlaps the
    exchanges with compute).

    ``bytes_per_rank`` is ``predict_bytes``' result (or measured figures with the same keys);
    ``collectives``: all-to-alls and all-reduces per step (4 per table group: counts, IDs, rows,
    gradients; plus DDP's buckets).
    """
    a2a = sum(bytes_per_rank[k] for k in ("counts", "ids", "rows", "grads"))
    cross = cross_node_fraction(world_size, ranks_per_node)
    t_a2a = a2a * cross / net.inter_bw + a2a * (1 - cross) / net.intra_bw
    multi_node = world_size > ranks_per_node
    t_dense = bytes_per_rank.get("dense", 0.0) / (net.inter_bw if multi_node else net.intra_bw)
    t_lat = collectives * net.latency_s
    return {"compute": compute_s, "all_to_all": t_a2a, "all_reduce": t_dense, "latency": t_lat,
            "total": compute_s + t_a2a + t_dense + t_lat}
