"""Row initialisers that depend only on (table seed, ID): order-, tier- and rank-independent.

A new ID's first row is a pure function of its ID, so the same run gives the same rows whether
an ID arrives first or last, lives in a cache or on disk, or is re-created after expiry.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from ember.config_base import ConfigModel
from ember import _native
from ember.mix import mix64

__all__ = ["InitializerConfig", "init_rows"]


class InitializerConfig(ConfigModel):
    """How a new row's weights are drawn.

    ``uniform``: U(-scale, scale), scale defaults to 1/sqrt(dim). ``normal``: N(0, std^2),
    std defaults to 1/sqrt(dim). ``zeros``: all zero (e.g. for a wide/linear part).
    """

    type: Literal["uniform", "normal", "zeros"] = "uniform"
    scale: float | None = Field(None, gt=0)
    std: float | None = Field(None, gt=0)


def _uniform01(
    ids: np.ndarray, dim: int, seed: int | np.ndarray, stream: int, scale: float | None = None
) -> np.ndarray:
    """Counter-based uniforms in [0, 1): one per (id, column), reproducible anywhere.

    ``seed`` is the table's seed, or one seed per ID (the tables of a group in one call).
    With ``scale``: ``u * (2 scale) - scale`` in float32, i.e. U(-scale, scale) (fused natively).
    The kernel (and its numpy fallback) is ``ember._native.uniform01``.
    """
    seeds = np.asarray(seed, dtype=np.int64).reshape(-1)
    key = mix64(seeds.astype(np.uint64) * np.uint64(2) + np.uint64(stream))
    mul, add = (1.0, 0.0) if scale is None else (float(np.float32(2 * scale)), -float(np.float32(scale)))
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    out = np.empty((ids.size, dim), dtype=np.float32)
    _native.uniform01(ids, key, dim, out, mul, add)
    return out


def init_rows(ids: Tensor, dim: int, config: InitializerConfig, seed: int | np.ndarray) -> Tensor:
    """Initial weights [N, dim] float32 for ``ids`` (int64 [N]); ``seed``: the table's, or int64 [N].

    Example:
        >>> a = init_rows(torch.tensor([5, 9]), 4, InitializerConfig(), seed=0)
        >>> torch.equal(a[1], init_rows(torch.tensor([9]), 4, InitializerConfig(), seed=0)[0])
        True
    """
    n = ids.numel()
    if config.type == "zeros" or n == 0:
        return torch.zeros(n, dim)
    ids_np = ids.detach().cpu().numpy()
    if config.type == "uniform":
        scale = config.scale if config.scale is not None else 1.0 / float(np.sqrt(dim))
        return torch.from_numpy(_uniform01(ids_np, dim, seed, 0, scale))
    std = config.std if config.std is not None else 1.0 / float(np.sqrt(dim))
    u1 = _uniform01(ids_np, dim, seed, 1)
    u2 = _uniform01(ids_np, dim, seed, 2)
    z = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2 * np.pi * u2)  # Box-Muller
    return torch.from_numpy((z * std).astype(np.float32))
