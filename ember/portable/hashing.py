"""ember's stable ID hash in plain numpy: the same int64 IDs as ``ember.featurize.hashing``.

Self-contained (numpy and the standard library only) so a serving process needs neither torch
nor ember's training code. The hash (all arithmetic on uint64, wrapping modulo 2**64):

- ``mix64``: the splitmix64 finaliser;
- salt: ``s = int.from_bytes(blake2b(salt.encode("utf-8"), digest_size=8).digest(), "little")``;
- integer ``v`` (two's complement as uint64): ``mix64(v ^ s)``; a boolean hashes as 0 / 1;
- string (UTF-8 bytes ``b`` of length ``n``): ``h = mix64(s ^ ((n + 1) * 0x9E3779B97F4A7C15))``,
  then ``h = mix64(h ^ w)`` for each little-endian 8-byte word ``w`` of ``b`` (the last one
  zero-padded). The result is viewed as int64.

Example:
    >>> int(hash_strings(["68fd1e64"], "C1")[0])
    8589935920311878028
    >>> int(mix64(np.array([1], dtype=np.uint64))[0])
    6238072747940578789
"""

from __future__ import annotations

import functools
import hashlib
from typing import Sequence

import numpy as np

__all__ = ["GOLDEN", "mix64", "salt_key", "hash_ints", "hash_strings"]

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MASK = (1 << 64) - 1
_LONG_BYTES = 4096  # longer strings are hashed one by one with Python ints (a numpy step per word would crawl)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 values (a new array); bijective, wraps mod 2**64."""
    z = np.asarray(x).astype(np.uint64, copy=True)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def _mix64_int(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & _MASK
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


@functools.lru_cache(maxsize=4096)
def salt_key(salt: str) -> np.uint64:
    """The 64-bit key of a feature's salt: the first 8 bytes of its blake2b digest, little-endian."""
    return np.uint64(int.from_bytes(hashlib.blake2b(salt.encode("utf-8"), digest_size=8).digest(), "little"))


def hash_ints(values: np.ndarray | Sequence[int], salt: str) -> np.ndarray:
    """int64 IDs of integer values (or booleans, as 0 / 1): ``mix64(uint64(v) ^ salt_key)``."""
    v = np.ascontiguousarray(np.asarray(values, dtype=np.int64)).view(np.uint64)
    return mix64(v ^ salt_key(salt)).view(np.int64)


def hash_strings(values: Sequence[str | bytes], salt: str) -> np.ndarray:
    """int64 IDs of strings (UTF-8) or bytes, one numpy step per 8-byte word position."""
    raw = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in values]
    n = len(raw)
    lens = np.fromiter((len(b) for b in raw), dtype=np.int64, count=n)
    h = mix64(salt_key(salt) ^ ((lens.astype(np.uint64) + np.uint64(1)) * GOLDEN))
    if n == 0:
        return h.view(np.int64)
    long = lens > _LONG_BYTES
    nwords = np.where(long, 0, (lens + 7) // 8)
    width = int(nwords.max()) * 8
    if width:
        # each string zero-padded to the longest one's whole words: row i, word j = bytes 8j..8j+7
        buf = np.zeros((n, width), dtype=np.uint8)
        for i, b in enumerate(raw):
            if not long[i] and b:
                buf[i, : len(b)] = np.frombuffer(b, dtype=np.uint8)
        words = buf.view("<u8").astype(np.uint64)
        for j in range(width // 8):
            active = np.flatnonzero(nwords > j)
            h[active] = mix64(h[active] ^ words[active, j])
    for i in np.flatnonzero(long):
        b = raw[i] + b"\0" * (-len(raw[i]) % 8)
        z = int(h[i])
        for w in np.frombuffer(b, dtype="<u8").tolist():
            z = _mix64_int(z ^ w)
        h[i] = np.uint64(z)
    return h.view(np.int64)
