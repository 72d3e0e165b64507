"""Sharded embeddings: each rank's collection holds only the rows it owns; a lookup routes its
IDs to their owners and back.

A ``ShardedGroupLookup`` is a ``GroupLookup`` whose phases put all-to-alls where the engine's
design leaves room for them:

- plan (unchanged): dedupe this rank's slice of the batch per table;
- fetch: IDs to their owners (counts, then IDs); each owner dedupes what every rank sent
  (``GroupLookup.of_ids`` on its own tables) and fetches through its own tier stack (admission,
  TTL and fresh rows included); the weights come back;
- pool (unchanged) and backward: one gradient per unique ID of this rank;
- update: the gradients go to the owners, which sum them over ranks per unique ID and run the
  table's sparse optimizer once per ID;
- write back: the owner stores its rows.

Every rank calls every collective of every group in the same order, also when it has no ID
to send: fetches (counts, IDs, rows) on the ``exchange``'s process group, updates (gradients,
with the reached flags riding along) on ``updates``', each issued in batch order by one thread (the pipeline's
fetch and update stages). Under ``pipeline.embedding_staleness`` k > 0 the two threads overlap
(the fetch of batch t + k with the update of batch t), as in one process (Persia's hybrid
training: stale reads, bounded by k; no gradient lost). The owner's tiers are touched under
``ShardContext.tiers`` only, never held across a collective: a rank whose fetch waits in an
all-to-all never blocks its own update, which another rank's fetch may be waiting on. Before
an update the owner re-reads the rows written since its fetch (``refresh``), so every
gradient lands on the current row.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from ember.batch.sparse import SparseFeatures
from ember.distributed.exchange import Exchange
from ember.distributed.sharding import ShardingPlan
from ember.embedding.collection import EmbeddingCollection, Lookup
from ember.embedding.config import FeatureConfig, TableConfig
from ember.embedding.group import GroupLookup, TableGroup

__all__ = ["ShardContext", "ShardedGroupLookup", "ShardedCollection"]


@dataclass
class ShardContext:
    """What a sharded lookup needs: the placement, this rank, the exchange of fetches and that
    of updates (another process group; None: the fetches'), and the lock of this rank's tiers
    (its fetches and updates may run on two threads)."""

    plan: ShardingPlan
    rank: int
    exchange: Exchange
    updates: Exchange | None = None
    tiers: threading.Lock = field(default_factory=threading.Lock)

    @property
    def world_size(self) -> int:
        return self.plan.world_size


@dataclass
class _Route:
    """How one lookup's unique IDs travel (both directions use the same splits)."""

    order: np.ndarray  # this rank's unique IDs in send order (by owner rank, then table)
    send_splits: list[int]  # IDs sent to each rank
    recv_splits: list[int]  # IDs received from each rank
    to_owner_row: Tensor  # for each received ID (source rank order): its row in the owner lookup
    peak: int = 0  # the most IDs any rank sends any other in this lookup (every rank knows it)


def _grads_and_reached(ex: Exchange, grad: Tensor, route: "_Route", reached: Sequence[bool]) -> tuple[Tensor, list[bool]]:
    """The gradients to their owners in one all-to-all, each rank's reached flags riding along
    (a block of rows after the gradients for each destination: 1.0 where its features reached
    the loss), so no second collective per step waits on a slow link for a few flags. Returns
    the gradients received (source after source, as ``route.recv_splits``) and, per table,
    whether it reached the loss on any rank (the OR of every rank's flags)."""
    n, dim, t = len(route.send_splits), grad.shape[1], len(reached)
    fr = -(-t // dim) if t else 0  # rows of flags per destination
    flags = grad.new_zeros(fr * dim)
    flags[:t] = torch.tensor([float(r) for r in reached], dtype=grad.dtype)
    block = flags.view(fr, dim)
    parts = grad.split(route.send_splits)
    payload = torch.cat([x for p in parts for x in (p, block)]) if n else grad
    got = ex.all_to_all(payload, [s + fr for s in route.send_splits], [s + fr for s in route.recv_splits], "grads",
                        tail=(fr, "counts"), peak=route.peak + fr)  # the flags are control data, as the split sizes
    chunks = got.split([s + fr for s in route.recv_splits])
    grads = torch.cat([c[: c.shape[0] - fr] for c in chunks]) if chunks else got
    anywhere = torch.stack([c[c.shape[0] - fr :].reshape(-1)[:t] for c in chunks]).amax(0) if chunks else flags[:t]
    return grads, [bool(v) for v in (anywhere > 0.5).tolist()]


class ShardedGroupLookup(GroupLookup):
    """One batch's lookup in a table group whose rows are sharded over ranks (module docstring).

    ``owner`` is this rank's lookup, as owner, of the IDs every rank sent it; its ``records``
    hold the full records, this lookup's ``records`` only the weights [U, dim] that pool reads.
    """

    def __init__(self, group: TableGroup, sparse: SparseFeatures, train: bool, shard: ShardContext) -> None:
        super().__init__(group, sparse, train)
        self.shard = shard
        self.owner: GroupLookup | None = None
        self.route: _Route | None = None

    def fetch(self) -> "ShardedGroupLookup":
        """IDs to their owners (counts, then IDs), the owner's lookup of everything it got
        (deduped over ranks, fetched from its tiers), the weights back into ``records``
        [U, dim] in this lookup's ID order. Writes ``records``, ``owner``, ``route``."""
        g, ex = self.group, self.shard.exchange
        n, t = self.shard.world_size, len(g.tables)
        ids = self.ids.numpy()
        dest = np.empty(ids.size, dtype=np.int64)
        for j, table in enumerate(g.tables):
            a, b = int(self.starts[j]), int(self.starts[j + 1])
            dest[a:b] = self.shard.plan.owners(table.name, ids[a:b])
        order = np.argsort(dest, kind="stable")  # ids are table after table: now (owner, table)
        counts = np.zeros((n, t + 1), dtype=np.int64)
        np.add.at(counts, (dest, self.table_of), 1)
        # the last column, to every rank: the most IDs this rank sends any other, so that every
        # rank knows the exchange's peak (and cuts its large all-to-alls into the same pieces)
        sends = counts[:, :t].sum(1)
        counts[:, t] = max((int(c) for r, c in enumerate(sends) if r != self.shard.rank), default=0)
        kinds = ("counts", "ids", "rows") if self.train else ("eval", "eval", "eval")
        recv_counts = ex.counts(torch.from_numpy(counts), kinds[0]).numpy()
        peak = int(recv_counts[:, t].max())  # (this rank's own row is its own peak)
        counts, recv_counts = counts[:, :t], recv_counts[:, :t]
        send_splits, recv_splits = counts.sum(1).tolist(), recv_counts.sum(1).tolist()
        got = ex.all_to_all(torch.from_numpy(ids[order]), send_splits, recv_splits, kinds[1], peak=peak)
        # received: source after source, each table after table; the owner lookup wants tables
        got_table = np.repeat(np.tile(np.arange(t), n), recv_counts.reshape(-1))
        by_table = np.argsort(got_table, kind="stable")
        owner = GroupLookup.of_ids(g, list(got[torch.from_numpy(by_table)].split(recv_counts.sum(0).tolist())), self.train)
        with self.shard.tiers:
            owner.fetch()  # this rank's tiers: admission, TTL and fresh rows as in one process
        to_row = torch.empty(got.numel(), dtype=torch.int64)
        to_row[torch.from_numpy(by_table)] = owner.inverse
        assert owner.records is not None
        rows = owner.records[:, : g.dim].index_select(0, to_row.to(owner.records.device))
        back = ex.all_to_all(rows, recv_splits, send_splits, kinds[2], peak=peak)
        rec = back.new_empty(ids.size, g.dim)
        rec.index_copy_(0, torch.from_numpy(order).to(rec.device), back)
        self.records, self.owner = rec, owner
        self.route = _Route(order, send_splits, recv_splits, to_row, peak)
        return self

    def update(self, step: int | None = None) -> None:
        """Send this rank's gradients to the owners; the owner sums them over ranks per unique
        ID and steps each table that reached the loss on any rank (``step``: the global step lr
        schedules read). A lookup whose backward never reached it here (a slice of no rows)
        sends zeros: its rows took no part."""
        owner = self._owner_gradient()
        with self.shard.tiers:  # the last collective is behind: the rows are this rank's alone
            owner.update(step)
        self.updated = owner.updated

    def apply(self, step: int | None = None) -> None:
        """``update`` then ``write_back``: the gradients' exchange, then the owner's ``apply``
        (row-wise Adagrad inside the write when it can) under the shard's tier lock."""
        owner = self._owner_gradient()
        with self.shard.tiers:
            owner.apply(step)
        self.updated = owner.updated
        self.written = owner.written

    def _owner_gradient(self) -> GroupLookup:
        """The exchange of ``update``: the owner lookup with the gradient summed over ranks per
        unique ID and the tables reached on any rank (collectives; no tier touched)."""
        if self.owner is None or self.route is None:
            raise RuntimeError("ShardedGroupLookup.update before fetch")
        owner, route = self.owner, self.route
        ex = self.shard.updates or self.shard.exchange
        assert owner.records is not None and self.records is not None
        mine = self.grad if self.grad is not None else self.records.new_zeros(self.ids.numel(), self.group.dim)
        grad = mine.index_select(0, torch.from_numpy(route.order).to(mine.device))
        got, reached = _grads_and_reached(ex, grad, route, self.reached)
        summed = torch.zeros(owner.ids.numel(), self.group.dim, dtype=got.dtype, device=owner.records.device)
        summed.index_add_(0, route.to_owner_row.to(summed.device), got.to(summed.device))
        owner.backward(summed)
        owner.reached = reached
        return owner

    def write_back(self) -> None:
        """The owner stores the rows it updated."""
        if self.owner is None:
            raise RuntimeError("ShardedGroupLookup.write_back before fetch")
        with self.shard.tiers:
            self.owner.write_back()
        self.written = self.owner.written  # what ``keys(written)`` names to later refreshes: the owner's rows

    def refresh(self, writes: Sequence[np.ndarray]) -> int:
        """Under staleness k > 0, before ``update``: the owner re-reads the rows of its lookup
        that later write-backs stored after its fetch (``writes``: the owner's written keys, as
        ``GroupLookup.refresh``), so each rank's gradient lands on the current row. Local: no
        collective."""
        if self.owner is None:
            raise RuntimeError("ShardedGroupLookup.refresh before fetch")
        with self.shard.tiers:
            return self.owner.refresh(writes)


class ShardedCollection(EmbeddingCollection):
    """An ``EmbeddingCollection`` holding this rank's shard of every table; its lookups are
    ``ShardedGroupLookup``s. Checkpointing, stats and TTL sweeps see the shard only.

    Args:
        tables: every table (each rank builds every table; its tiers hold only owned rows).
        features: the sparse features.
        seed: the run's seed (table seeds and fresh rows are as in one process).
        shard: placement, rank and exchange.
    """

    def __init__(self, tables: Sequence[TableConfig], features: Sequence[FeatureConfig], seed: int,
                 shard: ShardContext) -> None:
        super().__init__(tables, features, seed)
        missing = sorted(set(self.tables) - set(shard.plan.tables))
        if missing:
            raise ValueError(f"ShardedCollection: the sharding plan does not place tables {missing}")
        self.shard = shard

    def plan(self, sparse: SparseFeatures, train: bool | None = None) -> Lookup:
        """Phase 1 for every group (see ``EmbeddingCollection.plan``), as sharded lookups."""
        if train is None:
            train = self.training and torch.is_grad_enabled()
        return Lookup([ShardedGroupLookup(g, sparse, train, self.shard) for g in self.groups], self.features)

    def take_gradients(self) -> tuple[list[GroupLookup], int]:
        """Every training lookup of the last forward, in group order, whether or not backward
        reached it on this rank (a slice with no rows, or no row of a table, gets no gradient
        here, and its owner still waits for this rank's part): every rank then exchanges the
        same groups' gradients in the same order."""
        opened = list(self._open)
        _, waiting = super().take_gradients()
        return opened, waiting

    def owned(self, table: str, ids: Tensor) -> Tensor:
        """Mask: which ``ids`` of ``table`` this rank owns (e.g. rows to keep from a checkpoint)."""
        return torch.from_numpy(self.shard.plan.owned(table, ids.numpy(), self.shard.rank))
