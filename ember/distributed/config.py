"""The ``distributed:`` config section: how a torchrun launch trains on several processes.

Nothing here turns distribution on: a run is distributed when torchrun (or any launcher that
sets ``RANK``/``WORLD_SIZE``) starts it with ``WORLD_SIZE > 1``. One process without torchrun
ignores this section and runs exactly as before. What a distributed run refuses is checked in
one place, ``ember.train.distributed.check_distributed`` (it needs the whole run config).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ember.config_base import ConfigModel

__all__ = ["DistributedConfig", "ShardingKind"]

ShardingKind = Literal["row_wise", "table_wise"]


class DistributedConfig(ConfigModel):
    """Process group and embedding sharding of a multi-process run.

    ``sharding`` is the planner's policy: ``auto`` lets its cost model choose per table
    (``ember.distributed.planner``), ``row_wise`` / ``table_wise`` force one kind for every
    table; ``tables`` forces a kind per table name and wins over both.
    """

    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """`auto` (NCCL when the model runs on CUDA, else gloo), `gloo`, `nccl`; an unavailable backend is an error."""
    sharding: Literal["auto", "row_wise", "table_wise"] = "auto"
    """The planner's policy: `auto` (its cost model picks per table), `row_wise` or `table_wise` for every table."""
    tables: dict[str, ShardingKind] = {}
    """Per-table sharding kind, wins over `sharding`, e.g. `{user_id: row_wise, country: table_wise}`."""
    table_wise_max_rows: int = Field(100_000, ge=0)
    """``auto``: a table whose estimated rows are at most this many lives whole on one rank."""
    placement: Literal["tables", "towers", "embedding_ranks"] = "tables"
    """``towers`` (a ``dmt`` model): each tower's tables and tower module live on one node's
    ranks; only its compressed outputs (and their gradients) and the IDs routed to it cross
    nodes (``ember.distributed.towers``). ``embedding_ranks``: the last
    ``distributed.embedding_ranks`` ranks hold every table (placed among themselves by
    ``sharding``) and run only the embedding phases; the others run the dense model on their
    slices of each global batch (``ember.distributed.embedding_ranks``). ``tables``: every
    table placed by ``sharding`` over every rank."""
    embedding_ranks: int = Field(0, ge=0)
    """With ``placement: embedding_ranks``: how many ranks (the last ones) hold the tables; at
    least 1 and fewer than the world size. Ignored by the other placements."""
    exchange_chunk_bytes: int | None = Field(None, ge=0)
    """A large all-to-all (rows, gradients) goes in pieces of at most this many bytes between any
    two ranks, so no rank's sends run far ahead of its peers' into the network's queues (where
    the next small exchange would wait behind them) and both directions of a link carry data at
    once (``ember.distributed.exchange``). None: 256 KiB with gloo, off with NCCL; 0: off."""
    timeout_s: float = Field(300.0, gt=0)
    """How long a collective (all-to-all, all-reduce, barrier) waits for the other ranks, and the rendezvous for
    every rank to join (then a ConfigError naming the address)."""
    heartbeat_timeout_s: float = Field(15.0, gt=0, le=50)
    """A rank whose heartbeat (one a second, in the rendezvous store) has not moved for this long
    is lost: the others stop, naming it (``ember.distributed.watchdog``)."""
