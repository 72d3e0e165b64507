"""Stable hashing of categorical values (strings or integers) to int64 IDs.

The same value, salt and kind (string vs integer) give the same ID on every run, process and
machine: nothing here depends on Python's ``hash()``, the platform's byte order or numpy's RNG.

The exact hash (all arithmetic on uint64, wrapping modulo 2**64; ``mix64`` is the splitmix64
finaliser, :func:`ember.source.mix.mix64`, identical to ``ember.tiers.key_index.mix64``):

- salt: ``s = int.from_bytes(blake2b(salt.encode("utf-8"), digest_size=8).digest(), "little")``.
- integer ``v`` (any int dtype, taken as its two's-complement uint64): ``mix64(v ^ s)``.
  This is a bijection for a fixed salt, so distinct integers never collide within a feature.
- string ``x`` (UTF-8 bytes ``b`` of length ``n``): ``h = mix64(s ^ ((n + 1) * 0x9E3779B97F4A7C15))``;
  then for each 8-byte word ``w_j`` of ``b`` (little-endian, the last word zero-padded):
  ``h = mix64(h ^ w_j)``. The result is viewed as int64.

:func:`hash_array` hashes straight from the Arrow array's buffers (validity bitmap, offsets and
bytes, or fixed-width integers) in the native core (``ember._native.arrow_hash_strings`` /
``arrow_hash_ints``): no Python objects, no copies, one pass. Without the native core
(``EMBER_NATIVE=0`` or not built) the same wrappers run the reference: strings hashed over the
*distinct* values of a batch only (``pyarrow.compute.dictionary_encode``, then a take by
indices), eight bytes per vectorised numpy step; integers mixed with numpy.
:func:`hash_array_reference` is the earlier, array-level path, kept as the slow reference the
fast one is tested against. Note that the integer 7 and the string "7"
get different IDs: a column keeps its kind across files of one dataset (CSV columns are strings).

Missing values (nulls) get no ID at all: :func:`hash_array` returns them as a mask, and the
featurizer turns a missing categorical into an empty bag.

Example:
    >>> import pyarrow as pa
    >>> ids, valid = hash_array(pa.array(["a", None, "a"]), salt="C1")
    >>> bool(ids[0] == ids[2]), valid.tolist()
    (True, [True, False, True])
    >>> bool(hash_array(pa.array(["a"]), salt="C2")[0][0] != ids[0])
    True
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ember import _native
from ember._native import hash_utf8_buffers
from ember.mix import mix64

__all__ = ["salt_key", "hash_ints", "hash_strings", "hash_array", "hash_array_reference"]


@functools.lru_cache(maxsize=4096)
def salt_key(salt: str) -> np.uint64:
    """The 64-bit key of a salt (first 8 bytes of its blake2b digest, little-endian).

    Example:
        >>> int(salt_key("C1")) == int(salt_key("C1")) != int(salt_key("C2"))
        True
    """
    digest = hashlib.blake2b(salt.encode("utf-8"), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))


def hash_ints(values: np.ndarray, salt: str) -> np.ndarray:
    """Hash integer values to int64 IDs: ``mix64(uint64(v) ^ salt_key(salt))``.

    Example:
        >>> ids = hash_ints(np.array([1, 2, 1]), "f")
        >>> bool(ids[0] == ids[2]), bool(ids[0] != ids[1])
        (True, True)
    """
    v = np.ascontiguousarray(values).astype(np.int64, copy=False).view(np.uint64)
    return mix64(v ^ salt_key(salt)).view(np.int64)


def hash_strings(values: pa.Array | pa.ChunkedArray, salt: str) -> np.ndarray:
    """Hash every element of a (large_)string or binary array; nulls hash as "".

    Works on any array: sliced ones (an offset into shared buffers), with nulls, and chunked
    (each chunk hashed on its own; a value's ID never depends on where it sits).

    Example:
        >>> import pyarrow as pa
        >>> int(hash_strings(pa.array(["68fd1e64"]), "C1")[0])
        8589935920311878028
    """
    if isinstance(values, pa.ChunkedArray):
        parts = [hash_strings(c, salt) for c in values.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type):
        off_dtype = np.int64
    elif pa.types.is_string(values.type) or pa.types.is_binary(values.type):
        off_dtype = np.int32
    else:
        raise TypeError(f"hash_strings: expected a string array, got {values.type}")
    n = len(values)
    bufs = values.buffers()
    # a slice shares its parent's buffers: its n + 1 offsets start at values.offset
    offsets = np.frombuffer(bufs[1], dtype=off_dtype)[values.offset : values.offset + n + 1].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    lo = int(offsets[0]) if n else 0
    data, offsets = data[lo : int(offsets[-1])] if n else data[:0], offsets - lo  # this slice's bytes only
    if values.null_count:
        # A null slot may span bytes in principle: give it length 0 and gather the other
        # values' bytes into a fresh buffer.
        lens = np.diff(offsets)
        lens[values.is_null().to_numpy(zero_copy_only=False)] = 0
        starts = offsets[:-1]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        data = data[np.repeat(starts - offsets[:-1], lens) + np.arange(int(offsets[-1]))]
    return hash_utf8_buffers(offsets, data, salt_key(salt))


# offset width of each string type, by type id (hashing a DataType costs more than the hash below)
_STRINGS = {t.id: w for t, w in ((pa.string(), 4), (pa.binary(), 4), (pa.large_string(), 8), (pa.large_binary(), 8))}


def hash_array(values: pa.Array | pa.ChunkedArray, salt: str) -> tuple[np.ndarray, np.ndarray]:
    """Hash a flat arrow array of strings or integers to ``(ids int64 [N], valid bool [N])``.

    Hashed from the array's buffers (see the module docstring). Null entries get
    ``valid=False`` (and an arbitrary ID the caller drops). Sliced and chunked arrays hash
    exactly like the equivalent plain array; the IDs of present values equal
    :func:`hash_array_reference`'s.
    """
    if isinstance(values, pa.ChunkedArray):  # chunk by chunk: no copy, no 2 GiB offset limit
        parts = [hash_array(c, salt) for c in values.chunks]
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, bool)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    t = values.type
    if pa.types.is_dictionary(t):
        values = values.cast(t.value_type)
        t = values.type
    n = len(values)
    width = _STRINGS.get(t.id)
    if width is None and not pa.types.is_integer(t):
        return hash_array_reference(values, salt)  # booleans; other types raise there
    ids, valid = np.empty(n, np.int64), np.empty(n, np.bool_)
    bufs = values.buffers()
    validity = bufs[0] if bufs[0] is not None and values.null_count else b""
    key = int(salt_key(salt))
    if width is not None:
        _native.arrow_hash_strings(bufs[1], bufs[2] if bufs[2] is not None else b"", validity, values.offset, n, width, key,
                                   ids, valid)
    else:
        _native.arrow_hash_ints(bufs[1], validity, values.offset, n, t.bit_width // 8, pa.types.is_signed_integer(t), key,
                                ids, valid)
    return ids, valid


def hash_array_reference(values: pa.Array | pa.ChunkedArray, salt: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`hash_array` at the array level, the reference the buffer path is tested against:
    strings are dictionary-encoded first so each distinct value is hashed once, with numpy."""
    if isinstance(values, pa.ChunkedArray):  # chunk by chunk: no copy, no 2 GiB offset limit
        parts = [hash_array_reference(c, salt) for c in values.chunks]
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, bool)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    valid = ~values.is_null().to_numpy(zero_copy_only=False) if values.null_count else np.ones(len(values), bool)
    t = values.type
    if pa.types.is_dictionary(t):
        values = values.cast(t.value_type)
        t = values.type
    if pa.types.is_integer(t):
        raw = values.fill_null(0).to_numpy(zero_copy_only=False)
        return hash_ints(raw, salt), valid
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        enc = pc.dictionary_encode(values)
        codes = enc.indices.fill_null(0).to_numpy(zero_copy_only=False)
        dict_ids = hash_strings(enc.dictionary, salt)
        if len(dict_ids) == 0:
            return np.zeros(len(values), np.int64), valid
        return dict_ids[codes], valid
    if pa.types.is_boolean(t):
        return hash_ints(values.fill_null(False).to_numpy(zero_copy_only=False).astype(np.int64), salt), valid
    raise TypeError(f"cannot hash a column of type {t}; categorical columns must be strings or integers")
