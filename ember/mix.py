"""splitmix64 finaliser: the one 64-bit mix every stage uses (ID hashing, synthetic data, the
key index, row initialisers). A leaf module, like ``errors``, so any stage may import it.

Example:
    >>> int(mix64(np.array([1], dtype=np.uint64))[0])
    6238072747940578789
"""

from __future__ import annotations

import numpy as np

__all__ = ["mix64"]

_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """A bijective, well-spread 64-bit mix (uint64 in, new uint64 array out); wraps mod 2**64."""
    z = np.asarray(x).astype(np.uint64, copy=True)
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z
