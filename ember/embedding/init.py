"""Row initialisers that depend only on (table seed, ID): order-, tier- and rank-independent.

A new ID's first row is a pure function of its ID, so the same run gives the same rows whether
an ID arrives first or last, lives in a cache or on disk, or is re-created after expiry.
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from ember.config_base import ConfigModel
from ember import _native
from ember.mix import golden_steps, mix64, mix64_tensor, shr64
from ember.portable.normal import box_muller

__all__ = ["InitializerConfig", "TENSOR_OPS", "init_keys", "init_rows", "normal_std", "normal_tensor", "table_seed", "uniform_scale",
           "uniform01_tensor"]


class InitializerConfig(ConfigModel):
    """How a new row's weights are drawn.

    ``uniform``: U(-scale, scale), scale defaults to 1/sqrt(dim). ``normal``: N(0, std^2),
    std defaults to 1/sqrt(dim). ``zeros``: all zero (e.g. for a wide/linear part). Either draw
    is the same bits on every CPU and device (``ember.portable.normal`` for the normal's).
    """

    type: Literal["uniform", "normal", "zeros"] = "uniform"
    """`uniform`: U(-scale, scale); `normal`: N(0, std²); `zeros` (e.g. a wide part)."""
    scale: float | None = Field(None, gt=0)
    """Bound of `uniform`; unset: 1/sqrt(dim)."""
    std: float | None = Field(None, gt=0)
    """Standard deviation of `normal`; unset: 1/sqrt(dim)."""


def table_seed(base: int, name: str) -> int:
    """A table's effective seed when its config sets none: a stable mix of the run seed and the
    table name (so two tables never share rows, and ``train.seed`` changes every init).

    Example:
        >>> table_seed(0, "user") != table_seed(0, "item"), table_seed(0, "user") == table_seed(0, "user")
        (True, True)
    """
    digest = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    mixed = mix64(np.array([digest ^ (int(base) & 0xFFFFFFFFFFFFFFFF)], dtype=np.uint64))[0]
    return int(mixed >> np.uint64(1))  # a non-negative int64


def _uniform01(
    ids: np.ndarray, dim: int, seed: int | np.ndarray, stream: int, scale: float | np.ndarray | None = None
) -> np.ndarray:
    """Counter-based uniforms in [0, 1): one per (id, column), reproducible anywhere.

    ``seed`` is the table's seed, or one seed per ID (the tables of a group in one call).
    With ``scale`` (a number, or float64 [N] per row): ``u * (2 scale) - scale`` in float32, i.e.
    U(-scale, scale) (fused natively).
    The kernel (and its numpy fallback) is ``ember._native.uniform01``.
    """
    key = init_keys(seed, stream)
    if isinstance(scale, np.ndarray):
        s = scale.astype(np.float64)
        mul, add = (2 * s).astype(np.float32), (-s).astype(np.float32)
    else:
        mul, add = (1.0, 0.0) if scale is None else (float(np.float32(2 * scale)), -float(np.float32(scale)))
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    out = np.empty((ids.size, dim), dtype=np.float32)
    _native.uniform01(ids, key, dim, out, mul, add)
    return out


def init_keys(seed: int | np.ndarray, stream: int = 0) -> np.ndarray:
    """The counter-based generator's key (uint64 [n]) of each seed and ``stream`` (0: uniform
    draws, 1 and 2: a normal's two uniforms): what ``_native.uniform01`` and
    ``_native.fresh_uniform`` take."""
    seeds = np.asarray(seed, dtype=np.int64).reshape(-1)
    return mix64(seeds.astype(np.uint64) * np.uint64(2) + np.uint64(stream))


def init_rows(
    ids: Tensor, dim: int, config: InitializerConfig, seed: int | np.ndarray, scale: np.ndarray | None = None
) -> Tensor:
    """Initial weights [N, dim] float32 for ``ids`` (int64 [N]); ``seed``: the table's, or int64 [N].

    ``scale`` (float64 [N], uniform only) replaces the config's scale per row, so the new rows
    of tables with different scales come from one call; each row equals what its own scale
    gives (the same float32 operations as the native fused path).

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
        if scale is not None:
            return torch.from_numpy(_uniform01(ids_np, dim, seed, 0, np.asarray(scale, dtype=np.float64)))
        return torch.from_numpy(_uniform01(ids_np, dim, seed, 0, uniform_scale(config, dim)))
    out = np.empty((n, dim), dtype=np.float32)
    _native.normal01(np.ascontiguousarray(ids_np, dtype=np.int64), init_keys(seed, 1), init_keys(seed, 2), dim, out,
                     normal_std(config, dim))
    return torch.from_numpy(out)


def normal_std(config: InitializerConfig, dim: int) -> float:
    """The standard deviation a normal initializer uses for rows of width ``dim``."""
    return config.std if config.std is not None else 1.0 / float(np.sqrt(dim))


def uniform_scale(config: InitializerConfig, dim: int) -> float:
    """The scale a uniform initializer uses for rows of width ``dim``."""
    return config.scale if config.scale is not None else 1.0 / float(np.sqrt(dim))


def uniform01_tensor(ids: Tensor, keys: Tensor, dim: int, mul: Tensor | float = 1.0, add: Tensor | float = 0.0) -> Tensor:
    """``_native.uniform01`` as tensor operations on ``ids``' device, bit for bit: float32
    [N, dim] of ``u * mul + add`` with the counter-based uniform of each (ID, column). ``keys``:
    int64 [1 or N] (``init_keys``' uint64 bits); ``mul``, ``add``: numbers or float32 [N] (one
    per row). New rows made where the rows live (a GPU) without a trip through the host."""
    cols = golden_steps(dim, ids.device)  # (the native kernel's column offsets)
    bits = mix64_tensor(mix64_tensor(ids ^ keys).unsqueeze(1) + cols)
    u = shr64(bits, 40).to(torch.float32) * (1.0 / (1 << 24))
    if isinstance(mul, Tensor):
        return u * mul.unsqueeze(1) + add.unsqueeze(1)  # type: ignore[union-attr]
    if mul == 1.0 and add == 0.0:
        return u
    return u * float(np.float32(mul)) + float(np.float32(add))


def _frexp_tensor(x: Tensor) -> tuple[Tensor, Tensor]:
    m, e = torch.frexp(x)
    return m, e.to(torch.float32)


# box_muller's ops on tensors (the square root through float64: torch's float32 one on a CPU is not correctly rounded)
TENSOR_OPS = SimpleNamespace(frexp=_frexp_tensor, where=torch.where, sqrt=lambda x: x.double().sqrt().float(),
                             floor=torch.floor)


def normal_tensor(ids: Tensor, keys1: Tensor, keys2: Tensor, dim: int, std: Tensor | float) -> Tensor:
    """``_native.normal01`` as tensor operations on ``ids``' device, bit for bit: float32 [N, dim]
    normal draws times ``std`` (a number or float32 [N]); ``keys1``, ``keys2``: int64 [1 or N],
    the normal's two uniform streams (``init_keys(seed, 1)`` and ``(seed, 2)``)."""
    z = box_muller(uniform01_tensor(ids, keys1, dim), uniform01_tensor(ids, keys2, dim), TENSOR_OPS)
    return z * (std.unsqueeze(1) if isinstance(std, Tensor) else float(np.float32(std)))
