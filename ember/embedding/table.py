"""EmbeddingTable: a tier (where records live) + initialiser + sparse optimizer."""

from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor

from ember.embedding.config import TableConfig
from ember.embedding.init import init_rows
from ember.tiers.base import Tier
from ember.tiers.host import HostTier

__all__ = ["EmbeddingTable"]


class EmbeddingTable:
    """Maps any int64 ID to a trainable row; IDs get a row on first sight.

    ``lookup(ids)`` returns the records of unique IDs (creating missing ones);
    ``apply(ids, records, grads)`` runs the optimizer on them and writes them back.

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
        self.tier: Tier = tier if tier is not None else HostTier(config.record_dim)
        if self.tier.record_dim != config.record_dim:
            raise ValueError(
                f"table '{config.name}': tier record_dim {self.tier.record_dim} != "
                f"dim + optimizer state = {config.record_dim}"
            )
        self.optimizer = config.optimizer
        self.step = 0

    def __len__(self) -> int:
        return len(self.tier)

    def new_records(self, ids: Tensor) -> Tensor:
        """Fresh records (initial weights + initial optimizer state) for ``ids``."""
        w = init_rows(ids, self.dim, self.config.initializer, self.config.seed)
        return torch.cat([w, self.optimizer.init_state(w)], dim=1)

    def lookup(self, ids: Tensor) -> Tensor:
        """Records [U, R] of unique int64 ``ids`` (CPU); missing IDs are created."""
        records, found = self.tier.get(ids)
        if not bool(found.all()):
            missing = ~found
            records[missing] = self.new_records(ids[missing])
        return records

    def apply(self, ids: Tensor, records: Tensor, grads: Tensor) -> None:
        """One optimizer step on the rows of unique ``ids``; grads [U, D] summed per ID."""
        self.step += 1
        d = self.dim
        rows, state = self.optimizer.update(records[:, :d], records[:, d:], grads, self.step)
        if rows.data_ptr() != records.data_ptr():
            records[:, :d] = rows
        if state.numel() and state.data_ptr() != records[:, d:].data_ptr():
            records[:, d:] = state
        self.tier.put(ids, records)

    def items(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[Tensor, Tensor]]:
        """Every (ids, records) of the table."""
        return self.tier.items(chunk_rows)

    def load(self, ids: Tensor, records: Tensor) -> None:
        """Bulk import of (ids, records), e.g. from a checkpoint."""
        self.tier.put(ids, records)
