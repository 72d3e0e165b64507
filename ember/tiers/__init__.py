"""ember.tiers: where a table's records ``[weights | optimizer state]`` live.

``HostTier`` (memory), ``DeviceTier`` (bounded cache on the GPU, or in host memory without one),
``DiskTier`` (SSD, tables larger than RAM) and ``CachedTier(fast, slow)`` chaining them;
``StorageConfig`` + ``build_tier`` make a table's chain from its config.
"""

from ember.tiers.base import Tier
from ember.tiers.cached import CachedTier
from ember.tiers.device import DeviceTier
from ember.tiers.disk import DiskTier
from ember.tiers.host import HostTier
from ember.tiers.key_index import KeyIndex
from ember.tiers.policy import CountMinSketch, IdCounter, Policy
from ember.tiers.storage import StorageConfig, StoragePlan, build_tier, parse_bytes, plan_storage

__all__ = [
    "CachedTier",
    "CountMinSketch",
    "DeviceTier",
    "DiskTier",
    "HostTier",
    "IdCounter",
    "KeyIndex",
    "Policy",
    "StorageConfig",
    "StoragePlan",
    "Tier",
    "build_tier",
    "parse_bytes",
    "plan_storage",
]
