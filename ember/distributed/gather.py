"""Every rank's table shards gathered on rank 0, for a checkpoint keyed by (table, ID).

A checkpoint of a distributed run is the same files as one process's: each table's IDs and
records, whatever rank held them, so any world size can resume it (each rank keeps the IDs it
owns: ``ShardedCollection.owned``). In this first step rank 0 gathers the rows in memory and
writes them; per-rank shard files with a manifest written last come later.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from ember.distributed.process_group import DistributedRun
from ember.embedding.collection import EmbeddingCollection
from ember.embedding.config import TableConfig

__all__ = ["GatheredTable", "GatheredCollection", "gather_tables"]


class GatheredTable:
    """One table's rows from every rank, read like an ``EmbeddingTable`` by the checkpoint writer
    (``items_with_seen``, ``admission_state``, ``step``, ``flush``)."""

    def __init__(self, config: TableConfig, step: int, parts: Sequence[tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor]]) -> None:
        self.config, self.name, self.dim, self.step = config, config.name, config.dim, step
        self.ids = torch.cat([p[0] for p in parts])
        self.records = torch.cat([p[1] for p in parts])
        seen = [p[2] for p in parts]
        self.seen = torch.cat(seen) if all(s is not None for s in seen) else None  # type: ignore[arg-type]
        self.pending = (torch.cat([p[3] for p in parts]), torch.cat([p[4] for p in parts]))
        if self.ids.unique().numel() != self.ids.numel():
            raise RuntimeError(f"table '{self.name}': two ranks hold the same ID; the sharding plans of the ranks differ")

    def __len__(self) -> int:
        return self.ids.numel()

    def flush(self) -> None:
        """Nothing to flush: the rows are in memory."""

    def admission_state(self) -> tuple[Tensor, Tensor]:
        return self.pending

    def items_with_seen(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[Tensor, Tensor, Tensor | None]]:
        for s in range(0, self.ids.numel(), chunk_rows):
            yield (self.ids[s : s + chunk_rows], self.records[s : s + chunk_rows],
                   None if self.seen is None else self.seen[s : s + chunk_rows])


class GatheredCollection:
    """The ``tables`` of one collection, gathered (what the checkpoint writer iterates)."""

    def __init__(self, tables: dict[str, GatheredTable]) -> None:
        self.tables = tables


def _shard_of(table: Any) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor]:
    """(ids, records, last-seen or None, pending IDs, their counts) of this rank's shard."""
    table.flush()
    items = list(table.items_with_seen())
    width = table.config.record_dim
    ids = torch.cat([i for i, _, _ in items]) if items else torch.empty(0, dtype=torch.int64)
    rec = torch.cat([r for _, r, _ in items]) if items else torch.empty(0, width)
    seen = torch.cat([s for _, _, s in items]) if items and table.config.ttl_steps else (
        torch.empty(0) if table.config.ttl_steps else None)
    return (ids, rec.cpu(), None if seen is None else seen.cpu(), *table.admission_state())


def gather_tables(collections: Sequence[EmbeddingCollection], run: DistributedRun) -> list[GatheredCollection] | None:
    """Every rank's shard of every table, on rank 0 (None on the other ranks). Every rank calls it."""
    mine = [{name: (_shard_of(t), t.step) for name, t in ec.tables.items()} for ec in collections]
    every = run.gather_to_lead(mine)
    if every is None:
        return None
    out = []
    for c, ec in enumerate(collections):
        out.append(GatheredCollection({
            name: GatheredTable(t.config, t.step, [rank[c][name][0] for rank in every]) for name, t in ec.tables.items()
        }))
    return out
