"""EmbeddingTable: a tier (where records live) + initialiser + sparse optimizer + admission/TTL."""

from __future__ import annotations

import threading
from contextlib import ExitStack
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from ember.embedding.config import TableConfig
from ember.embedding.init import init_rows
from ember.tiers.base import Tier
from ember.tiers.host import HostTier
from ember.tiers.policy import IdCounter
from ember.tiers.storage import StoragePlan, build_tier, plan_storage

__all__ = ["EmbeddingTable"]


class EmbeddingTable:
    """Maps any int64 ID to a trainable row; IDs get a row on first sight (or after ``min_count``).

    ``lookup(ids)`` returns the records of unique IDs (creating missing ones);
    ``apply(ids, records, grads)`` runs the optimizer on them and writes them back to the tier.
    The tier comes from ``config.storage`` unless one is passed.

    With ``config.min_count > 1``, an ID's sightings (lookups) are counted exactly; below the
    threshold it reads an all-zero row and ``apply`` skips it. With ``config.ttl_steps``, each
    stored record carries one more float, the step it was last looked up; a row older than
    ``ttl_steps`` reads as absent at once (so results never depend on when memory is reclaimed)
    and ``expire()``, run every ``ttl_steps`` steps, removes such rows from the tiers.

    Example:
        >>> table = EmbeddingTable(TableConfig(name="t", dim=4, optimizer={"type": "sgd", "lr": 1.0}))
        >>> ids = torch.tensor([3, 99])
        >>> rec = table.lookup(ids)
        >>> table.apply(ids, rec, torch.ones(2, 4))
        >>> torch.allclose(table.lookup(ids)[:, :4], rec[:, :4])  # rec was updated in place
        True
    """

    def __init__(self, config: TableConfig, tier: Tier | None = None) -> None:
        self.config = config
        self.dim = config.dim
        self.tier: Tier = tier if tier is not None else build_tier(config.storage, config.stored_dim, config.name)
        if self.tier.record_dim != config.stored_dim:
            raise ValueError(
                f"table '{config.name}': tier record_dim {self.tier.record_dim} != "
                f"dim + optimizer state{' + last-seen step' if config.ttl_steps else ''} = {config.stored_dim}"
            )
        self.optimizer = config.optimizer
        self.step = 0
        self._ttl = config.ttl_steps
        self._min_count = config.min_count
        self._pending = IdCounter() if config.min_count > 1 else None
        self._filtered_memo: tuple[Tensor, Tensor] | None = None
        # lookup (maybe on the collection's prefetch thread) and the writes of apply never
        # interleave inside one table
        self.lock = threading.Lock()
        self.reset_step_stats()

    def __len__(self) -> int:
        return len(self.tier)

    def storage_plan(self) -> StoragePlan:
        """Memory and disk this table's storage config asks for (what ``build_tier`` checked)."""
        return plan_storage(self.config.storage, self.config.stored_dim, self.config.name)

    def new_records(self, ids: Tensor, seeds: np.ndarray | None = None) -> Tensor:
        """Fresh records (initial weights + initial optimizer state) for ``ids``: [N, record_dim].

        ``seeds`` (int64 [N]) replaces this table's seed per row: ``lookup_many`` fills the new
        rows of several tables with one call.
        """
        w = init_rows(ids, self.dim, self.config.initializer, self.config.seed if seeds is None else seeds)
        return torch.cat([w, self.optimizer.init_state(w)], dim=1)

    def _stored(self, records: Tensor, seen: Tensor | None = None) -> Tensor:
        """[N, record_dim] -> [N, stored_dim] (appends the last-seen step when a TTL is set:
        ``seen`` [N] per row, or the current step)."""
        if self._ttl is None:
            return records
        if seen is None:
            col = records.new_full((records.shape[0], 1), float(self.step))
        else:
            col = seen.to(records.dtype).reshape(-1, 1)
        return torch.cat([records, col], dim=1)

    @property
    def prefetchable(self) -> bool:
        """Whether a lookup may run ahead of the previous batch's ``apply`` with the same result.

        Only without ``min_count`` or a TTL: their sighting counts and last-seen steps depend on
        the order of lookups and applies.
        """
        return self._pending is None and self._ttl is None

    def lookup(self, ids: Tensor, train: bool = True) -> Tensor:
        """Records [U, stored_dim] of unique int64 ``ids`` (CPU); missing IDs are created.

        ``train=False`` (evaluation) neither counts sightings toward ``min_count`` nor refreshes
        the last-seen step. Rows are only stored by ``apply``.
        """
        with self.lock:
            records, found = self.tier.get(ids)
            return self._complete(ids, records.to("cpu"), found, train)

    def lookup_into(self, ids: Tensor, out: Tensor, train: bool = True) -> None:
        """``out[:] = lookup(ids, train)`` for ``out`` [U, stored_dim] (CPU), without the extra
        copy when the tier can read straight into ``out`` (a memory tier's ``get_into``)."""
        with self.lock:
            get_into = getattr(self.tier, "get_into", None)
            if get_into is not None:
                found = get_into(ids, out)
            else:
                records, found = self.tier.get(ids)
                out.copy_(records)
            self._complete(ids, out, found, train)

    @staticmethod
    def lookup_many(tables: Sequence["EmbeddingTable"], ids: Sequence[Tensor], out: Tensor, train: bool = True) -> None:
        """``tables[j].lookup_into(ids[j], out[rows of j], train)`` for every j, with the tables'
        rows back to back in ``out`` [N, stored_dim].

        Tables in memory tiers without ``min_count`` or a TTL, with one initializer and optimizer,
        are read in one native pass and their new rows made in one call (a table group's
        lookup without a Python loop over its tables); others one by one.
        """
        first = tables[0]
        same = lambda a, b: a is b or a == b  # noqa: E731  # pydantic == is slow; shared configs are common
        plain = all(
            t._pending is None and t._ttl is None and t.dim == first.dim
            and same(t.config.initializer, first.config.initializer) and same(t.optimizer, first.optimizer)
            for t in tables
        )
        tiers = [t.tier for t in tables]
        if not (plain and HostTier.batchable(tiers)):
            for t, i, rows in zip(tables, ids, out.split([i.numel() for i in ids])):
                t.lookup_into(i, rows, train=train)
            return
        with _locked(tables):
            found = HostTier.get_into_many(tiers, ids, out)  # type: ignore[arg-type]
            miss = np.flatnonzero(~found.numpy())
            if miss.size:
                owner = np.repeat(np.arange(len(tables)), [i.numel() for i in ids])[miss]
                seeds = np.array([t.config.seed for t in tables], dtype=np.int64)[owner]
                m_ids = torch.from_numpy(np.concatenate([i.numpy() for i in ids])[miss])
                out.index_copy_(0, torch.from_numpy(miss), first.new_records(m_ids, seeds))

    def _complete(self, ids: Tensor, records: Tensor, found: Tensor, train: bool) -> Tensor:
        """Finish a read in place: rows of absent (or expired) IDs become fresh rows (or the
        shared zero row below ``min_count``), sightings and last-seen steps are noted."""
        if self._ttl is not None and bool(found.any()):
            expired = found & (self.step - records[:, -1] > self._ttl)
            if bool(expired.any()):
                found = found & ~expired
                self.expired_reads += int(expired.sum())
        filtered = None
        miss = np.flatnonzero(~found.numpy())  # numpy: cheaper than torch on small per-table arrays
        if miss.size:
            missing = torch.from_numpy(miss)
            m_ids = ids.index_select(0, missing)
            if self._pending is None:
                # index_copy_, not records[missing] = ...: CPU index_put of rows is ~15x slower
                records.index_copy_(0, missing, self._stored(self.new_records(m_ids)))
            else:
                ids_np = m_ids.numpy()
                counts = self._pending.add(ids_np) if train else self._pending.get(ids_np)
                admitted = torch.from_numpy(counts >= self._min_count)
                fresh = torch.zeros(m_ids.numel(), self.config.record_dim)
                if bool(admitted.any()):
                    fresh[admitted] = self.new_records(m_ids[admitted])
                records.index_copy_(0, missing, self._stored(fresh))
                filtered = torch.zeros(ids.numel(), dtype=torch.bool)
                filtered[missing[~admitted]] = True
                self.filtered_reads += int((~admitted).sum())
        if self._ttl is not None and train:
            records[:, -1] = float(self.step)
        if self._pending is not None:
            self._filtered_memo = (ids, filtered if filtered is not None else torch.zeros(ids.numel(), dtype=torch.bool))
        return records

    def _filtered(self, ids: Tensor) -> Tensor | None:
        """Which of ``ids`` are below ``min_count`` (no row, no update); None without a filter."""
        if self._pending is None:
            return None
        memo = self._filtered_memo
        if memo is not None and memo[0] is ids:
            return memo[1]
        absent = ~self.tier.contains(ids)  # type: ignore[attr-defined]
        return absent & torch.from_numpy(self._pending.get(ids.numpy()) < self._min_count)

    def apply(self, ids: Tensor, records: Tensor, grads: Tensor) -> None:
        """One optimizer step on the rows of unique ``ids``; grads [U, D] summed per ID."""
        with self.lock:
            self._apply(ids, records, grads)

    def _apply(self, ids: Tensor, records: Tensor, grads: Tensor) -> None:
        self.step += 1
        filtered = self._filtered(ids)
        self._filtered_memo = None
        if filtered is not None and bool(filtered.any()):
            keep = torch.nonzero(~filtered).squeeze(1)
            sub = records[keep]
            self._update(ids[keep], sub, grads[keep])
            records.index_copy_(0, keep, sub)  # the caller's records reflect the update, as without a filter
            ids = ids[keep]
        else:
            self._update(ids, records, grads)
        if self._pending is not None and ids.numel():
            self._pending.remove(ids.numpy())  # these IDs now have rows
        if self._ttl is not None and self.step % self._ttl == 0:
            self.expire()

    def _update(self, ids: Tensor, records: Tensor, grads: Tensor) -> None:
        _optimizer_step(self.optimizer, self.dim, self.config.record_dim, records, grads, self.step)
        self.tier.put(ids, records)

    def fusable_with(self, other: "EmbeddingTable") -> bool:
        """Whether ``apply_many`` may update both tables' rows in one optimizer call."""
        return (
            self._pending is None
            and other._pending is None
            and self.dim == other.dim
            and self.config.stored_dim == other.config.stored_dim
            and self.step == other.step
            and (self.optimizer is other.optimizer or self.optimizer == other.optimizer)
        )

    @staticmethod
    def apply_many(
        tables: list["EmbeddingTable"], ids: list[Tensor], records: Tensor, grads: Tensor
    ) -> None:
        """``apply`` of several tables at once: one optimizer call over all their rows.

        Same result as ``tables[i].apply(ids[i], records[a_i:b_i], grads[a_i:b_i])`` for each
        table, where the tables' rows lie one after another in ``records`` [sum U, stored_dim]
        and ``grads`` [sum U, D]. Every pair of tables must be ``fusable_with`` each other (same
        dim, optimizer and step; no ``min_count`` filter), so no row is skipped.
        """
        first = tables[0]
        for t in tables:
            t.step += 1
        _optimizer_step(first.optimizer, first.dim, first.config.record_dim, records, grads, first.step)
        tiers = [t.tier for t in tables]
        if HostTier.batchable(tiers):  # one native pass writes every table's rows
            with _locked(tables):
                HostTier.put_many(tiers, ids, records)  # type: ignore[arg-type]
        else:
            for t, i, rows in zip(tables, ids, records.split([i.numel() for i in ids])):
                with t.lock:
                    t.tier.put(i, rows)
        for t in tables:
            if t._ttl is not None and t.step % t._ttl == 0:
                t.expire()

    def expire(self) -> int:
        """Remove every row not looked up for more than ``ttl_steps`` steps; returns how many."""
        if self._ttl is None:
            return 0
        old = [ids[self.step - rec[:, -1] > self._ttl] for ids, rec in self.tier.items()]
        victims = torch.cat(old) if old else torch.empty(0, dtype=torch.int64)
        if victims.numel():
            self.tier.remove(victims)
        self.expired_rows += victims.numel()
        return victims.numel()

    def items(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[Tensor, Tensor]]:
        """Every live (ids, records [N, record_dim]) of the table, each ID once, whatever its tier."""
        for ids, rec, _ in self.items_with_seen(chunk_rows):
            yield ids, rec

    def items_with_seen(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[Tensor, Tensor, Tensor | None]]:
        """``items`` plus each row's last-seen step [N] (None without a TTL), for checkpoints."""
        r = self.config.record_dim
        for ids, rec in self.tier.items(chunk_rows):
            if self._ttl is None:
                yield ids, rec[:, :r], None
                continue
            live = self.step - rec[:, -1] <= self._ttl
            ids, rec = ids[live], rec[live]
            if ids.numel():
                yield ids, rec[:, :r], rec[:, -1]

    def load(self, ids: Tensor, records: Tensor, seen: Tensor | None = None) -> None:
        """Bulk import of unique (ids, records [N, record_dim]), e.g. from a checkpoint.

        With a TTL each row's last-seen step is ``seen`` [N] (as checkpointed), else the
        current ``step``.
        """
        if records.shape[1] != self.config.record_dim:
            raise ValueError(
                f"table '{self.config.name}': load got records of width {records.shape[1]}, "
                f"expected dim + optimizer state = {self.config.record_dim}"
            )
        self.tier.put(ids, self._stored(records, seen))
        if self._pending is not None:
            self._pending.remove(ids.numpy())

    def admission_state(self) -> tuple[Tensor, Tensor]:
        """(ids, counts) of IDs counted toward ``min_count`` but without a row (for checkpoints)."""
        if self._pending is None:
            return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
        ids, counts = self._pending.items()
        return torch.from_numpy(ids), torch.from_numpy(counts)

    def load_admission_state(self, ids: Tensor, counts: Tensor) -> None:
        """Restore what ``admission_state`` returned."""
        if self._pending is not None and ids.numel():
            self._pending.add(ids.numpy(), counts.numpy().astype(np.int32))

    def warm_start(self, ids: Tensor, counts: Tensor) -> int:
        """Seed the caches with ID frequencies counted over a data sample; returns rows promoted."""
        fn = getattr(self.tier, "warm_start", None)
        return int(fn(ids, counts)) if fn is not None else 0

    def flush(self) -> None:
        getattr(self.tier, "flush", lambda: None)()

    def close(self) -> None:
        """Flush and release the tiers' files (a disk tier can then be reopened)."""
        getattr(self.tier, "close", lambda: None)()

    # ---- observability -------------------------------------------------------------------
    def reset_step_stats(self) -> None:
        self.filtered_reads = 0
        self.expired_reads = 0
        self.expired_rows = 0
        getattr(self.tier, "reset_step_stats", lambda: None)()

    def stats(self) -> dict[str, float]:
        """Flat metrics: ``rows``, admission/TTL counters and every tier's ``tier.<name>.*``."""
        out: dict[str, float] = {"rows": float(len(self))}
        if self._pending is not None:
            out["pending_ids"] = float(len(self._pending))
            out["filtered_reads"] = float(self.filtered_reads)
        if self._ttl is not None:
            out["expired_reads"] = float(self.expired_reads)
            out["expired_rows"] = float(self.expired_rows)
        out.update(getattr(self.tier, "stats", lambda: {})())
        return out


def _locked(tables: Sequence[EmbeddingTable]) -> ExitStack:
    """Holds every table's lock (in the given order) for one call over several tables."""
    stack = ExitStack()
    for t in tables:
        stack.enter_context(t.lock)
    return stack


def _optimizer_step(optimizer, dim: int, record_dim: int, records: Tensor, grads: Tensor, step: int) -> None:
    """Run ``optimizer`` on records [N, >= record_dim] in place (weights then state)."""
    rows, state = optimizer.update(records[:, :dim], records[:, dim:record_dim], grads, step)
    if rows.data_ptr() != records.data_ptr():
        records[:, :dim] = rows
    if state.numel() and state.data_ptr() != records[:, dim:record_dim].data_ptr():
        records[:, dim:record_dim] = state
