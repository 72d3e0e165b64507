"""splitmix64 finaliser: the one 64-bit mix every stage uses (ID hashing, synthetic data, the
key index, row initialisers). A leaf module, like ``errors``, so any stage may import it.

Example:
    >>> int(mix64(np.array([1], dtype=np.uint64))[0])
    6238072747940578789
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # (no torch import here: ``import ember`` stays cheap)
    import torch
    from torch import Tensor

__all__ = ["golden_steps", "mix64", "mix64_tensor", "shr64"]

_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_M1_I64, _M2_I64 = int(np.array(_M1).view(np.int64)), int(np.array(_M2).view(np.int64))  # (the same bits)
_GOLDEN_I64 = int(np.array(np.uint64(0x9E3779B97F4A7C15)).view(np.int64))  # the golden-ratio step (its bits)
_STEPS: dict = {}  # (n, device) -> golden_steps' tensor


def mix64(x: np.ndarray) -> np.ndarray:
    """A bijective, well-spread 64-bit mix (uint64 in, new uint64 array out); wraps mod 2**64."""
    z = np.asarray(x).astype(np.uint64, copy=True)
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


def shr64(z: "Tensor", r: int) -> "Tensor":
    """``z >> r`` of uint64 bits held in an int64 tensor (torch's shift is arithmetic: the sign's
    copies are masked off)."""
    return (z >> r) & ((1 << (64 - r)) - 1)


def mix64_tensor(z: "Tensor") -> "Tensor":
    """``mix64`` on int64 tensors (any device): the same bits, products wrapping mod 2**64 as
    uint64 ones do."""
    z = z ^ shr64(z, 30)
    z = z * _M1_I64
    z = z ^ shr64(z, 27)
    z = z * _M2_I64
    return z ^ shr64(z, 31)


def golden_steps(n: int, device: "str | torch.device") -> "Tensor":
    """int64 [n] on ``device``: (1..n) x 0x9E3779B97F4A7C15, wrapping as uint64 (the bits): the
    per-column offsets of the counter-based draws (``uniform01_tensor``) and of the rounding
    noise's lanes (``sr_noise``). Made once per (n, device) and kept: no launch and no upload
    (which from pageable memory would be a blocking copy) per call."""
    import torch

    device = torch.device(device)
    t = _STEPS.get((n, device))
    if t is None:
        t = _STEPS[(n, device)] = torch.arange(1, n + 1, dtype=torch.int64, device=device) * _GOLDEN_I64
    return t
