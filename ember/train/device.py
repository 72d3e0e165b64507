"""The device a run's dense model trains on (``train.device``). Its own module so that the
builder and the distributed start (``ember.train.distributed``) both import it, not each other."""

from __future__ import annotations

import torch

from ember.errors import ConfigError

__all__ = ["pick_device"]


def pick_device(name: str) -> torch.device:
    """``train.device``: ``auto`` is CUDA when one is visible, else the CPU; ``cuda`` with none
    visible raises ConfigError."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device is 'cuda' but no CUDA device is visible; use 'auto' or 'cpu'")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
