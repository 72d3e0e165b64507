"""Device tier: a bounded cache of records in GPU memory, or in host memory when there is no GPU."""

from __future__ import annotations

import torch

from ember.tiers.host import HostTier
from ember.tiers.policy import Policy

__all__ = ["DeviceTier", "default_cache_device"]


def default_cache_device() -> torch.device:
    """``cuda`` when a GPU is visible, else ``cpu`` (the cache logic is the same on both)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class DeviceTier(HostTier):
    """The fastest tier: a fixed-size arena (allocated up front) with LRU/LFU eviction.

    Without a GPU it is a bounded host-memory cache, so the same caching logic runs and is
    tested on every machine. With a GPU, hits are read, pooled and updated on it: only misses
    and evictions cross to the host (see ``transfer_bytes`` in the stats).

    Example:
        >>> t = DeviceTier(record_dim=2, capacity=2, policy="lru", device="cpu")
        >>> t.put(torch.tensor([1, 2]), torch.zeros(2, 2))
        >>> _ = t.get_into(torch.tensor([1]), torch.zeros(1, 2))
        >>> t.evict(1)[0].tolist()  # least recently used first
        [2]
    """

    name = "device"

    def __init__(
        self,
        record_dim: int,
        capacity: int,
        policy: Policy = "lfu",
        device: str | torch.device | None = None,
    ) -> None:
        super().__init__(
            record_dim,
            capacity=capacity,
            initial_rows=capacity,
            policy=policy,
            device=default_cache_device() if device is None else device,
        )
