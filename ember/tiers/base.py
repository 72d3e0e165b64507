"""The storage-tier protocol: where the records ``[weights | optimizer state]`` of a table live."""

from __future__ import annotations

from typing import Iterator, Protocol

from torch import Tensor

__all__ = ["Tier", "TierCounters"]


class Tier(Protocol):
    """A keyed store of fixed-width float32 records (one per ID).

    All methods are vectorised over a batch of IDs (int64 [N] on CPU, unique). ``capacity`` is
    the most rows the tier may hold (None: bounded only by its medium). Implementations:
    HostTier, DeviceTier, DiskTier, and CachedTier(fast, slow) chaining them.
    """

    record_dim: int
    capacity: int | None

    def get(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Records [N, R] and a found mask [N]; rows of absent IDs are unspecified."""
        ...

    def put(self, ids: Tensor, records: Tensor) -> None:
        """Insert or overwrite the records of unique ``ids``."""
        ...

    def remove(self, ids: Tensor) -> Tensor:
        """Delete ``ids``; returns the found mask."""
        ...

    def evict(self, n: int) -> tuple[Tensor, Tensor]:
        """Remove up to ``n`` rows chosen by the tier's policy; returns their (ids, records)."""
        ...

    def items(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[Tensor, Tensor]]:
        """Every (ids, records) held, in chunks (for checkpoints and export)."""
        ...

    def contains(self, ids: Tensor) -> Tensor:
        """Found mask [N] (does not count as an access)."""
        ...

    def flush(self) -> None:
        """Write anything buffered to its medium (a no-op for memory tiers)."""
        ...

    def stats(self) -> dict[str, float]:
        """Flat counters ``tier.<name>.<metric>`` since the last ``reset_step_stats``."""
        ...

    def reset_step_stats(self) -> None: ...

    def __len__(self) -> int: ...

    @property
    def nbytes(self) -> int:
        """Bytes of memory (or disk, for disk tiers) this tier uses now."""
        ...


class TierCounters:
    """The per-step counters a storage tier keeps, and their ``tier.<name>.*`` metrics.

    Subclasses count ``requests``/``hits`` in get, ``inserts`` and ``evictions``, and add their
    own metrics through ``extra_stats``.
    """

    name: str
    requests: int
    hits: int
    inserts: int
    evictions: int

    def reset_step_stats(self) -> None:
        self.requests = 0
        self.hits = 0
        self.inserts = 0
        self.evictions = 0

    def extra_stats(self) -> dict[str, float]:
        return {}

    def stats(self) -> dict[str, float]:
        """Counters since the last ``reset_step_stats`` plus current size, as ``tier.<name>.*``."""
        p = f"tier.{self.name}."
        out = {
            p + "hit_rate": self.hits / self.requests if self.requests else float("nan"),
            p + "requests": float(self.requests),
            p + "rows": float(len(self)),  # type: ignore[arg-type]  # the tier defines __len__
            p + "bytes": float(self.nbytes),  # type: ignore[attr-defined]  # and nbytes
            p + "inserts": float(self.inserts),
            p + "evictions": float(self.evictions),
        }
        out.update({p + k: float(v) for k, v in self.extra_stats().items()})
        return out
