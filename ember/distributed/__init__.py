"""Distributed training on torch.distributed (torchrun): process group, sharding of the
embedding rows over ranks, the all-to-all exchange, the sharding planner.

Nothing here is imported by ``import ember``; a single process never touches it.
"""

from ember.distributed.config import DistributedConfig

__all__ = ["DistributedConfig"]
