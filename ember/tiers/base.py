"""The storage-tier protocol: where the records ``[weights | optimizer state]`` of a table live.

``Tier`` is closed: it lists every method a tier has, and table groups and caches talk to
tiers only through it. Kernels take explicit buffers (a tier hands its own arrays to them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

__all__ = ["Tier", "TierCounters"]


class Tier(ABC):
    """A keyed store of fixed-width float32 records (one per ID).

    All methods are vectorised over a batch of IDs (int64 [N] on CPU, unique). ``capacity`` is
    the most rows the tier may hold (None: bounded only by its medium); ``device`` is where its
    records live and where ``get_into`` writes fastest. Implementations: HostTier, DeviceTier,
    DiskTier, and CachedTier(fast, slow) chaining them.
    """

    name: str
    record_dim: int
    capacity: int | None
    device: torch.device
    policy: str | None = None  # "lru" / "lfu" for tiers that evict by access, else None

    # ---- rows ---------------------------------------------------------------------------
    @abstractmethod
    def get_into(self, ids: Tensor, out: Tensor) -> Tensor:
        """Write the records of found ``ids`` into the rows of ``out`` [N, R] (others untouched);
        returns the found mask [N] (CPU bool). Counts an access of each ID (policy, admission)."""

    @abstractmethod
    def put(self, ids: Tensor, records: Tensor, counts: np.ndarray | None = None) -> None:
        """Insert or overwrite the records of unique ``ids`` (``records`` on any device).

        ``counts`` (optional, int [N]) seeds the access count of newly inserted IDs in tiers
        with an eviction policy (so a promoted row is not the next victim); others ignore it.
        """

    @abstractmethod
    def remove(self, ids: Tensor) -> Tensor:
        """Delete ``ids``; returns the found mask [N]."""

    @abstractmethod
    def contains(self, ids: Tensor) -> Tensor:
        """Found mask [N] (does not count as an access)."""

    # ---- eviction -----------------------------------------------------------------------
    @abstractmethod
    def evict(self, n: int) -> tuple[Tensor, Tensor]:
        """Remove up to ``n`` rows chosen by the tier's policy; returns their (ids, records)."""

    def victims(self, n: int) -> tuple[Tensor, np.ndarray]:
        """The ``n`` IDs ``evict(n)`` would take, best victim first, with their access counts
        (what admission compares a candidate against). Tiers without counts report zeros."""
        raise NotImplementedError(f"{type(self).__name__} has no eviction policy to ask")

    def decay_counts(self) -> None:
        """Age the access counts (halve them), so LFU follows a drifting distribution."""

    # ---- whole tier ---------------------------------------------------------------------
    @abstractmethod
    def items(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[Tensor, Tensor]]:
        """Every (ids, records) held, in chunks, records on CPU (for checkpoints and export)."""

    def warm_start(self, ids: Tensor, counts: Tensor) -> int:
        """Seed caches with ID frequencies counted over a data sample; returns rows promoted."""
        return 0

    def flush(self) -> None:
        """Write anything buffered to its medium (a no-op for memory tiers)."""

    def close(self) -> None:
        """Flush and release files (a disk tier can then be reopened)."""
        self.flush()

    # ---- size and observability -----------------------------------------------------------
    @abstractmethod
    def __len__(self) -> int: ...

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes of memory (or disk, for disk tiers) this tier uses now."""

    @property
    def free_rows(self) -> int | None:
        """Rows that can still be inserted without an eviction (None: unbounded)."""
        return None if self.capacity is None else self.capacity - len(self)

    def count_transfer(self, rows: int, other: torch.device) -> None:
        """Count ``rows`` records moved between this tier's device and ``other`` (host<->GPU);
        tiers that keep counters add them to ``transfer_bytes``."""

    @abstractmethod
    def stats(self) -> dict[str, float]:
        """Flat counters ``tier.<name>.<metric>`` since the last ``reset_step_stats``."""

    @abstractmethod
    def reset_step_stats(self) -> None: ...


class TierCounters:
    """The per-step counters a storage tier keeps, and their ``tier.<name>.*`` metrics.

    Subclasses count ``requests``/``hits`` in get_into, ``inserts`` and ``evictions``, and add
    their own metrics through ``extra_stats``.
    """

    name: str
    requests: int
    hits: int
    inserts: int
    evictions: int
    transfer_bytes: int
    device: torch.device
    record_dim: int

    def reset_step_stats(self) -> None:
        self.requests = 0
        self.hits = 0
        self.inserts = 0
        self.evictions = 0
        self.transfer_bytes = 0

    def count_transfer(self, rows: int, other: torch.device) -> None:
        """Count ``rows`` records moved between this tier's device and ``other`` (host<->GPU)."""
        if other.type != self.device.type:
            self.transfer_bytes += rows * 4 * self.record_dim

    def extra_stats(self) -> dict[str, float]:
        return {}

    def stat_rows(self) -> int:
        """The ``rows`` stat: rows this tier holds."""
        return len(self)  # type: ignore[arg-type]  # the tier defines __len__

    def stats(self) -> dict[str, float]:
        """Counters since the last ``reset_step_stats`` plus current size, as ``tier.<name>.*``."""
        p = f"tier.{self.name}."
        out = {
            p + "hit_rate": self.hits / self.requests if self.requests else float("nan"),
            p + "requests": float(self.requests),
            p + "hits": float(self.hits),
            p + "rows": float(self.stat_rows()),
            p + "bytes": float(self.nbytes),  # type: ignore[attr-defined]  # and nbytes
            p + "inserts": float(self.inserts),
            p + "evictions": float(self.evictions),
            p + "transfer_bytes": float(self.transfer_bytes),
        }
        out.update({p + k: float(v) for k, v in self.extra_stats().items()})
        return out
