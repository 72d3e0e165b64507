"""EmbeddingTable: one table's state: its tier chain, effective seed, step, admission and TTL.

Reads and updates of rows happen in table groups (``ember.embedding.group``); a table holds
what outlives a batch and the per-table parts of a lookup (``complete``: fresh rows under
``min_count`` and TTL; ``expire``).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from ember.embedding.changes import ChangeLog
from ember.embedding.codec import RowCodec, RowDtype, round_nearest
from ember.embedding.config import TableConfig
from ember.embedding.init import InitializerConfig, init_rows, table_seed
from ember.optim import SparseOptimizerConfig
from ember.tiers.base import Tier
from ember.tiers.device_counts import DeviceAdmission
from ember.tiers.policy import IdCounter
from ember.tiers.storage import StoragePlan, build_tier, plan_storage

__all__ = ["EmbeddingTable", "fresh_records"]


def fresh_records(
    ids: Tensor, seeds: int | np.ndarray, dim: int, initializer: InitializerConfig, optimizer: SparseOptimizerConfig,
    scale: np.ndarray | None = None, dtype: RowDtype = "fp32", out: Tensor | None = None,
) -> Tensor:
    """Records [N, dim + state] of new rows: initial weights (per ID and seed; ``scale`` per row
    for uniform initializers) + initial state. The weights are rounded to nearest at ``dtype``
    once, here: a fresh row reads as it will be stored (and as the predictor serves it).
    ``out`` (float32 [N, dim + state], optional): written in place and returned, no other copy."""
    w = round_nearest(init_rows(ids, dim, initializer, seeds, scale), dtype)
    if out is None:
        return torch.cat([w, optimizer.init_state(w)], dim=1)
    out[:, :dim] = w
    out[:, dim:] = optimizer.init_state(w)
    return out


class EmbeddingTable:
    """Maps any int64 ID to a trainable row; IDs get a row on first sight (or after ``min_count``).

    With ``config.min_count > 1``, an ID's sightings (training lookups) are counted exactly;
    below the threshold it reads an all-zero row and is not updated. With ``config.ttl_steps``,
    each stored record carries one more float, the step it was last looked up; a row older than
    ``ttl_steps`` reads as absent at once (so results never depend on when memory is reclaimed)
    and ``expire()``, run every ``ttl_steps`` steps, removes such rows from the tiers.

    Args:
        config: the table's config.
        seed: the run's seed, from which the table's own seed is derived when ``config.seed``
            is unset (``table_seed``).
        tier: the tier chain (default: built from ``config.storage``).

    Example:
        >>> t = EmbeddingTable(TableConfig(name="t", dim=4), seed=7)
        >>> t.seed == table_seed(7, "t"), len(t)
        (True, 0)
    """

    def __init__(self, config: TableConfig, seed: int = 0, tier: Tier | None = None) -> None:
        self.config = config
        self.name = config.name
        self.dim = config.dim
        self.seed = config.seed if config.seed is not None else table_seed(seed, config.name)
        # the tiers hold records packed at the table's dtype: ``codec.words`` 4-byte words each
        self.codec = RowCodec(config.dtype, config.dim, config.stored_dim)
        self.tier: Tier = tier if tier is not None else build_tier(config.storage, self.codec.words, config.name)
        if self.tier.record_dim != self.codec.words:
            raise ValueError(
                f"table '{config.name}': tier record_dim {self.tier.record_dim} != the {self.codec.words} words of a "
                f"record (dim + optimizer state{' + last-seen step' if config.ttl_steps else ''} = "
                f"{config.stored_dim} floats, weights at {config.dtype})"
            )
        self.optimizer = config.optimizer
        self.step = 0  # optimizer steps this table took (a step in which its features reached the loss)
        self.ttl = config.ttl_steps
        self.min_count = config.min_count
        # sightings of IDs without a row (storage.index: device: its group's DeviceAdmission instead)
        self.admission: IdCounter | DeviceAdmission | None = IdCounter() if config.min_count > 1 else None
        self.changes: ChangeLog | None = None  # IDs written or removed since the last delta export
        self.reset_step_stats()

    def __len__(self) -> int:
        return len(self.tier)

    @property
    def special(self) -> bool:
        """Whether lookups need this table's own completion step (``min_count`` or a TTL)."""
        return self.admission is not None or self.ttl is not None

    def storage_plan(self) -> StoragePlan:
        """Memory and disk this table's storage config asks for (what ``build_tier`` checked)."""
        return plan_storage(self.config.storage, self.codec.words, self.config.name)

    def new_records(self, ids: Tensor) -> Tensor:
        """Fresh records (initial weights + initial optimizer state) for ``ids``: [N, record_dim]."""
        return fresh_records(ids, self.seed, self.dim, self.config.initializer, self.optimizer, dtype=self.config.dtype)

    def stored(self, records: Tensor, seen: Tensor | None = None) -> Tensor:
        """[N, record_dim] -> [N, stored_dim] (appends the last-seen step when a TTL is set:
        ``seen`` [N] per row, or the current step)."""
        if self.ttl is None:
            return records
        if seen is None:
            col = records.new_full((records.shape[0], 1), float(self.step))
        else:
            col = seen.to(records.dtype).reshape(-1, 1)
        return torch.cat([records, col], dim=1)

    def complete(self, ids: Tensor, records: Tensor, found: Tensor, train: bool) -> Tensor | None:
        """Finish a read of a ``special`` table in place: absent (or expired) IDs get fresh rows
        (or the shared zero row below ``min_count``), sightings and last-seen steps are noted.
        Returns which rows are filtered by ``min_count`` (no row, no update), or None."""
        if self.ttl is not None and bool(found.any()):
            expired = found & (self.step - records[:, -1].cpu() > self.ttl)
            if bool(expired.any()):
                found = found & ~expired
                self.expired_reads += int(expired.sum())
        filtered = None
        miss = np.flatnonzero(~found.numpy())
        if miss.size:
            missing = torch.from_numpy(miss)
            m_ids = ids.index_select(0, missing)
            if self.admission is None:
                fresh = self.new_records(m_ids)
            else:
                admitted = torch.from_numpy(self.admit(m_ids.numpy(), train))
                fresh = torch.zeros(m_ids.numel(), self.config.record_dim)
                if bool(admitted.any()):
                    fresh[admitted] = self.new_records(m_ids[admitted])
                filtered = torch.zeros(ids.numel(), dtype=torch.bool)
                filtered[missing[~admitted]] = True
            if records.device.type != "cpu":  # fresh rows are made on the host
                self.count_transfer(miss.size)
            records.index_copy_(0, missing.to(records.device), self.stored(fresh).to(records.device))
        if self.ttl is not None and train:
            records[:, -1] = float(self.step)
        return filtered

    def admit(self, ids: np.ndarray, train: bool) -> np.ndarray:
        """``min_count``: which of ``ids`` (absent from the tiers) have been seen often enough for a
        row, bool [N]; a training read counts this sighting first. The rest are counted in
        ``filtered_reads`` (they read the shared all-zero row and take no update)."""
        assert self.admission is not None
        return self.admitted_by(self.admission.add(ids) if train else self.admission.get(ids))

    def admitted_by(self, counts: np.ndarray) -> np.ndarray:
        """``admit``'s decision on the sightings of absent IDs (counted by the caller: a group
        counts its tables' in one pass): at least ``min_count`` gets a row, the rest are
        ``filtered_reads``."""
        ok = counts >= self.min_count
        self.filtered_reads += int(ok.size - np.count_nonzero(ok))
        return ok

    def count_transfer(self, rows: int, width: int | None = None) -> None:
        """Count ``rows`` of ``width`` 4-byte words (default: a stored, packed record) that crossed
        between host and device memory for this table (the caller knows they crossed)."""
        self.transfer_bytes += rows * 4 * (self.codec.words if width is None else width)

    def track_changes(self) -> ChangeLog:
        """Start noting the IDs whose rows change (written, loaded, removed by TTL) for delta
        exports; returns the table's change log (the same one when called again)."""
        if self.changes is None:
            self.changes = ChangeLog()
        return self.changes

    def after_write(self, ids: Tensor, admitted: Tensor | None = None) -> None:
        """Bookkeeping once the rows of ``ids`` were updated and stored: they now have rows
        (``min_count``), they changed (``changes``), and every ``ttl_steps`` steps the expired
        rows are swept. ``admitted``: those of ``ids`` the counter still holds, when the fetch
        knows them (the IDs it admitted: an ID with a row is never counted); None: all of them."""
        if self.changes is not None:
            self.changes.note(ids.numpy())
        gone = ids if admitted is None else admitted
        if isinstance(self.admission, IdCounter) and gone.numel():  # (device counts: cleared by the fetch that admitted)
            self.admission.remove(gone.numpy())
        if self.ttl is not None and self.step % self.ttl == 0:
            self.expire()

    def expire(self) -> int:
        """Remove every row not looked up for more than ``ttl_steps`` steps; returns how many."""
        if self.ttl is None:
            return 0
        # the last-seen step is the last word of a record whatever the dtype (it stays fp32)
        old = [ids[self.step - rec[:, -1] > self.ttl] for ids, rec in self.tier.items()]
        victims = torch.cat(old) if old else torch.empty(0, dtype=torch.int64)
        if victims.numel():
            self.tier.remove(victims)
            if self.changes is not None:
                self.changes.note(victims.numpy())
        self.expired_rows += victims.numel()
        return victims.numel()

    def items(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[Tensor, Tensor]]:
        """Every live (ids, records [N, record_dim]) of the table, each ID once, whatever its tier."""
        for ids, rec, _ in self.items_with_seen(chunk_rows):
            yield ids, rec

    def items_with_seen(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[Tensor, Tensor, Tensor | None]]:
        """``items`` plus each row's last-seen step [N] (None without a TTL), for checkpoints."""
        r = self.config.record_dim
        for ids, packed in self.tier.items(chunk_rows):
            rec = self.codec.decode(packed)
            if self.ttl is None:
                yield ids, rec[:, :r], None
                continue
            live = self.step - rec[:, -1] <= self.ttl
            ids, rec = ids[live], rec[live]
            if ids.numel():
                yield ids, rec[:, :r], rec[:, -1]

    def load(self, ids: Tensor, records: Tensor, seen: Tensor | None = None) -> None:
        """Bulk import of unique (ids, records [N, record_dim]), e.g. from a checkpoint.

        With a TTL each row's last-seen step is ``seen`` [N] (as checkpointed), else the
        current ``step``. Weights are rounded to nearest at the table's dtype (exact when they
        come from a table of that dtype or a narrower one).
        """
        if records.shape[1] != self.config.record_dim:
            raise ValueError(
                f"table '{self.config.name}': load got records of width {records.shape[1]}, "
                f"expected dim + optimizer state = {self.config.record_dim}"
            )
        self.tier.put(ids, self.codec.encode_nearest(self.stored(records, seen).contiguous()))
        if self.changes is not None:
            self.changes.note(ids.numpy())
        if self.admission is not None:
            self.admission.remove(ids.numpy())

    def admission_state(self) -> tuple[Tensor, Tensor]:
        """(ids, counts) of IDs counted toward ``min_count`` but without a row (for checkpoints)."""
        if self.admission is None:
            return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
        ids, counts = self.admission.items()
        return torch.from_numpy(ids), torch.from_numpy(counts)

    def load_admission_state(self, ids: Tensor, counts: Tensor) -> None:
        """Restore what ``admission_state`` returned."""
        if self.admission is not None and ids.numel():
            self.admission.add(ids.numpy(), counts.numpy().astype(np.int32))

    def warm_start(self, ids: Tensor, counts: Tensor) -> int:
        """Seed the caches with ID frequencies counted over a data sample; returns rows promoted."""
        return self.tier.warm_start(ids, counts)

    def flush(self) -> None:
        self.tier.flush()

    def close(self) -> None:
        """Flush and release the tiers' files (a disk tier can then be reopened)."""
        self.tier.close()

    # ---- observability -------------------------------------------------------------------
    def reset_step_stats(self) -> None:
        self.filtered_reads = 0
        self.expired_reads = 0
        self.expired_rows = 0
        self.transfer_bytes = 0
        self.tier.reset_step_stats()

    def stats(self) -> dict[str, float]:
        """Flat metrics: ``rows``, admission/TTL counters, ``transfer_bytes`` (host<->device
        bytes of rows and gradients, all tiers included) and every tier's ``tier.<name>.*``."""
        out: dict[str, float] = {"rows": float(len(self))}
        if self.admission is not None:
            out["pending_ids"] = float(len(self.admission))
            take_filtered = getattr(self.admission, "take_filtered_reads", None)  # (storage.index: device counts them there)
            if take_filtered is not None:
                self.filtered_reads += take_filtered()
            out["filtered_reads"] = float(self.filtered_reads)
        if self.ttl is not None:
            take = getattr(self.tier, "take_expired_reads", None)  # (storage.index: device counts them there)
            if take is not None:
                self.expired_reads += take()
            out["expired_reads"] = float(self.expired_reads)
            out["expired_rows"] = float(self.expired_rows)
        tiers = self.tier.stats()
        moved = sum(v for k, v in tiers.items() if k.endswith(".transfer_bytes"))
        out["transfer_bytes"] = float(self.transfer_bytes + moved)
        out.update(tiers)
        return out
