"""Dedicated embedding ranks (``distributed.placement: embedding_ranks``; issue 23 item 3):
E ranks hold every table and run only the embedding phases, the other D = N - E ranks run the
dense model (NorthStar's first multi-GPU mode; Persia's embedding workers beside its NN
workers).

The embedding ranks are the last E ranks (rank 0, which writes the run's files and the dense
model into checkpoints, is a dense rank). The tables are placed among the embedding ranks
alone, by the same planner as ``placement: tables`` with a world of E (``on_ranks``): row-wise
tables hash over the E ranks, table-wise ones sit on one of them. Each global batch is cut into
D slices for the dense ranks; an embedding rank's slice has no rows.

Every rank runs the same training loop, so every collective (the fetch and update all-to-alls,
the stop agreement, checkpoints, eval, metrics) is called by every rank in the same order:

- a dense rank plans and fetches its slice's unique IDs (IDs to the owning embedding rank, rows
  back), runs the dense model, and sends its gradients to the owners; its dense gradients are
  summed over the dense ranks only (DDP on a process group of the dense ranks);
- an embedding rank sends no ID and receives every dense rank's, answers them from its tiers,
  receives their gradients, sums them per unique ID and runs the sparse optimizer and the
  write-back; it never runs the dense model (``Components.embedding_rank``).

With ``pipeline.embedding_staleness`` k > 0 the fetch of batch t + k runs beside the update of
batch t as in ``placement: tables``: the embedding ranks answer fetches up to k batches ahead
of the dense ranks' updates.
"""

from __future__ import annotations

from ember.distributed.sharding import ShardingPlan, TableSharding
from ember.errors import ConfigError

__all__ = ["embedding_rank_ids", "on_ranks", "describe_ranks"]


def embedding_rank_ids(world_size: int, count: int) -> tuple[int, ...]:
    """The embedding ranks of a run of ``world_size`` ranks: the last ``count``.

    Example:
        >>> embedding_rank_ids(3, 1)
        (2,)
    """
    if not 1 <= count < world_size:
        raise ConfigError(f"distributed.embedding_ranks must be at least 1 and fewer than the world size {world_size} "
                          f"(some ranks must run the dense model); got {count}")
    return tuple(range(world_size - count, world_size))


def on_ranks(plan: ShardingPlan, ranks: tuple[int, ...], world_size: int) -> ShardingPlan:
    """``plan`` (made for a world of ``len(ranks)``) moved onto ``ranks`` of ``world_size``:
    planned rank i becomes ``ranks[i]``; a row-wise table hashes over ``ranks`` only.

    Example:
        >>> plan = ShardingPlan(2, {"t": TableSharding("t", "row_wise"), "s": TableSharding("s", "table_wise", 1)})
        >>> moved = on_ranks(plan, (2, 3), 4)
        >>> moved.spec("s").rank, moved.spec("t").ranks
        (3, (2, 3))
    """
    if plan.world_size != len(ranks):
        raise ValueError(f"on_ranks: a plan over {plan.world_size} ranks cannot move onto {len(ranks)} ranks")
    specs = {}
    for name, t in plan.tables.items():
        if t.kind == "table_wise":
            assert t.rank is not None
            specs[name] = TableSharding(name, "table_wise", ranks[t.rank], t.rows, t.record_bytes)
        else:
            over = ranks if t.ranks is None else tuple(ranks[r] for r in t.ranks)
            specs[name] = TableSharding(name, "row_wise", rows=t.rows, record_bytes=t.record_bytes, ranks=over)
    return ShardingPlan(world_size, specs)


def describe_ranks(world_size: int, count: int) -> str:
    """The line under a sharding plan naming the embedding and the dense ranks.

    Example:
        >>> describe_ranks(4, 1)
        '  embedding ranks (tables only, no dense model): 3; dense ranks (the model on batch_size / 3 rows each): 0-2'
    """
    emb, dense = embedding_rank_ids(world_size, count), world_size - count

    def span(a: int, b: int) -> str:
        return str(a) if a == b else f"{a}-{b}"

    return (f"  embedding ranks (tables only, no dense model): {span(emb[0], emb[-1])}; "
            f"dense ranks (the model on batch_size / {dense} rows each): {span(0, dense - 1)}")
