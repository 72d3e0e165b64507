"""Pure, vectorised column transforms: parse numbers, dense transforms, jagged filtering.

Example:
    >>> import pyarrow as pa
    >>> x, missing, bad = parse_floats(pa.array(["1.5", "", None, "abc", " 2 "]))
    >>> x[[0, 4]].tolist(), missing.tolist(), bad.tolist()
    ([1.5, 2.0], [False, True, True, False, False], [False, False, False, True, False])
    >>> dense_transform(np.array([np.nan, -3.0, 9.0]), fill=0.0, log1p=True).round(3).tolist()
    [0.0, 0.0, 2.303]
    >>> dense_transform(np.array([np.nan, -3.0, 9.0]), sign_log1p=True).round(3).tolist()
    [0.0, -1.386, 2.303]
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ember import _native

__all__ = ["INTEGER", "parse_floats", "parse_ints", "is_listed", "dense_transform", "dense_runs", "signed_log1p", "row_of",
           "filter_jagged", "truncate_jagged"]

_NUMBER = r"^[-+]?((\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|(?i:nan|inf|infinity))$"
INTEGER = r"^-?\d{1,19}$"  # an integer ID as text (parse_ints)


def _is_stringy(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def parse_floats(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values float64, missing, bad)`` of a numeric or string column.

    Missing: null, empty or blank string, or NaN (also the string "nan"). Bad: a string that is
    not a decimal number (``1``, ``-2.5``, ``.5``, ``3e-4``; surrounding blanks allowed) or an
    infinite value.
    ``values`` is NaN where missing or bad.
    """
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    if _is_stringy(arr.type):
        fast = _buffer_int_floats(arr)
        if fast is not None:
            return fast
        arr = pc.if_else(pc.equal(arr, ""), pa.scalar(None, arr.type), arr)  # CSV's empty field: missing
        try:  # fast path: every value parses (nulls stay null)
            values = np.array(pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
            missing = np.isnan(values)
            bad = np.zeros(len(values), dtype=bool)
        except pa.ArrowInvalid:  # find the values that do not, with a regex over all of them
            s = pc.utf8_trim_whitespace(arr)
            missing = np.asarray(pc.fill_null(pc.equal(s, ""), True), dtype=bool)
            ok = np.asarray(pc.fill_null(pc.match_substring_regex(s, _NUMBER), False), dtype=bool)
            bad = ~missing & ~ok
            x = pc.cast(pc.if_else(pa.array(ok), s, pa.scalar(None, s.type)), pa.float64())
            values = np.array(x.to_numpy(zero_copy_only=False), dtype=np.float64)  # writable copy
            missing |= np.isnan(values) & ok
    elif pa.types.is_integer(arr.type) and not arr.null_count:  # the common case: no NaN, no inf to look for
        values = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.float64)
        zeros = np.zeros(len(values), dtype=bool)
        return values, zeros, zeros.copy()
    elif (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or pa.types.is_boolean(arr.type)
          or pa.types.is_decimal(arr.type)):
        values = arr.cast(pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64, copy=True)
        missing = np.isnan(values)
        bad = np.zeros(len(values), dtype=bool)
    else:
        raise TypeError(f"expected a number or string column, got {arr.type}")
    bad |= np.isinf(values)
    values[bad] = np.nan
    return values, missing, bad


def parse_ints(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values int64, missing, bad)`` of an integer or decimal-string column (IDs as is)."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    if pa.types.is_integer(arr.type):
        if not arr.null_count:  # no fill, and int64 without a copy
            zeros = np.zeros(len(arr), dtype=bool)
            return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64), zeros, zeros.copy()
        missing = np.asarray(arr.is_null(), dtype=bool)
        return arr.fill_null(0).cast(pa.int64()).to_numpy(zero_copy_only=False), missing, np.zeros_like(missing)
    if not _is_stringy(arr.type):
        raise TypeError(f"expected an integer or string column of IDs, got {arr.type}")
    fast = _buffer_ints(arr)
    if fast is not None:
        return fast
    fast = _plain_ints(arr)
    if fast is not None:
        return fast
    s = pc.utf8_trim_whitespace(arr)
    missing = np.asarray(pc.fill_null(pc.equal(s, ""), True), dtype=bool)
    ok = np.array(pc.fill_null(pc.match_substring_regex(s, INTEGER), False), dtype=bool)
    try:  # one vectorised cast; it fails only when a 19+-digit token overflows int64
        x = pc.cast(pc.if_else(pa.array(ok), s, pa.scalar("0", s.type)), pa.int64())
    except pa.ArrowInvalid:  # find those few tokens one by one (rare: full-range IDs fit)
        long = np.flatnonzero(ok & np.asarray(pc.fill_null(pc.greater_equal(pc.utf8_length(s), 19), False), dtype=bool))
        for i in long:
            if not -(2**63) <= int(s[int(i)].as_py()) < 2**63:
                ok[i] = False
        x = pc.cast(pc.if_else(pa.array(ok), s, pa.scalar("0", s.type)), pa.int64())
    bad = ~missing & ~ok
    return x.to_numpy(zero_copy_only=False), missing, bad


def _buffer_ints(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``parse_ints`` of a string column in one pass over its Arrow buffers
    (``ember._native.arrow_parse_ints``); None when a value holds a byte other than a digit or
    ``-`` (blanks, signs, text), which the general path judges."""
    n = len(arr)
    bufs = arr.buffers()
    wide = pa.types.is_large_string(arr.type)
    out, state = np.empty(n, np.int64), np.empty(n, np.uint8)
    validity = bufs[0] if bufs[0] is not None and arr.null_count else b""
    if _native.arrow_parse_ints(bufs[1], bufs[2] if bufs[2] is not None else b"", validity, arr.offset, n,
                                8 if wide else 4, out, state) < 0:
        return None
    return out, state == 1, state == 2


def _buffer_int_floats(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``parse_floats`` of a string column of plain integers and empty fields (Criteo's counts)
    from one pass over its buffers (``_buffer_ints``): int64 -> float64 rounds as Arrow's
    decimal cast does. None for anything else (decimals, blanks, a "-0" whose sign a float
    keeps), which the general path parses."""
    parsed = _buffer_ints(arr)
    if parsed is None or parsed[2].any():
        return None
    x, missing, bad = parsed
    zeros = np.flatnonzero((x == 0) & ~missing)
    if zeros.size:  # "-0" is -0.0 to Arrow's cast
        wide = pa.types.is_large_string(arr.type)
        offsets = np.frombuffer(arr.buffers()[1], np.int64 if wide else np.int32, count=arr.offset + len(arr) + 1)
        if (np.frombuffer(arr.buffers()[2], np.uint8)[offsets[arr.offset + zeros]] == ord("-")).any():
            return None
    values = x.astype(np.float64)
    values[missing] = np.nan
    return values, missing, bad


def _plain_ints(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``parse_ints`` of a string column whose every value is empty, null or a plain decimal
    integer (``-?`` and at most 19 digits, no blanks): one cast, no regex. None when some value
    may not be, and the regex must decide which.

    The cast alone is not the integer syntax (Arrow also takes ``0x10`` and zero-padded tokens
    longer than 19 digits): it decides only once the column's bytes are all digits, ``-``, ``.``
    or ``/`` (the last two fail the cast) and no value is longer than 19 characters, or 20
    starting with ``-``."""
    lengths = pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64 if pa.types.is_large_string(arr.type) else np.int32)
    offsets = offsets[arr.offset: arr.offset + len(arr) + 1]
    if len(arr) and offsets[-1] > offsets[0]:
        data = np.frombuffer(data_buf, np.uint8)[offsets[0]: offsets[-1]]
        if data.min() < ord("-") or data.max() > ord("9"):  # digits and "-" (and "./", which no cast takes)
            return None
        long = np.flatnonzero(lengths > 19)
        if long.size and ((lengths[long] > 20).any() or (data[offsets[long] - offsets[0]] != ord("-")).any()):
            return None
    missing = lengths == 0
    filled = pc.if_else(pa.array(missing), pa.scalar("0", arr.type), arr) if missing.any() else arr
    try:
        x = pc.cast(filled, pa.int64())
    except pa.ArrowInvalid:  # e.g. "5-", or 19 digits past int64's range
        return None
    return x.to_numpy(zero_copy_only=False), missing, np.zeros_like(missing)


def is_listed(arr: pa.Array, values: list[str]) -> np.ndarray:
    """Mask of the elements of ``arr`` equal to one of ``values`` (a schema's ``missing_values``).

    A string column is compared as text (a binary one as UTF-8 bytes); an integer column with
    the entries that are integers (``"-1"`` matches -1; the others cannot occur in it, nor any
    in a boolean column). Nulls are never listed: they are
    missing anyway.

    Example:
        >>> is_listed(pa.array(["a", "", None, "-1"]), ["", "-1"]).tolist()
        [False, True, False, True]
        >>> is_listed(pa.array([3, -1, None]), ["", "-1"]).tolist()
        [False, True, False]
    """
    if not values:
        return np.zeros(len(arr), dtype=bool)
    if "" in values and (_is_stringy(arr.type) or pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        # the empty value (CSV's empty field) from the offsets alone: no hashing of every value
        empty = _empty_strings(arr)
        rest = [v for v in values if v != ""]
        return empty | is_listed(arr, rest) if rest else empty
    if pa.types.is_integer(arr.type):
        info = np.iinfo(arr.type.to_pandas_dtype())
        ints = [int(v) for v in values if re.fullmatch(INTEGER, v.strip()) and info.min <= int(v) <= info.max]
        value_set = pa.array(ints, arr.type)
    elif _is_stringy(arr.type):
        value_set = pa.array(values, arr.type)
    elif pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type):  # hashed like text: compare as UTF-8
        value_set = pa.array([v.encode("utf-8") for v in values], arr.type)
    elif pa.types.is_boolean(arr.type):  # no listed value can occur in it (like non-integers in an int column)
        return np.zeros(len(arr), dtype=bool)
    else:
        raise TypeError(f"missing_values: expected a string or integer column, got {arr.type}")
    return np.asarray(pc.fill_null(pc.is_in(arr, value_set=value_set), False), dtype=bool)


def _empty_strings(arr: pa.Array) -> np.ndarray:
    """Mask of the present values of a (large_)string or binary array that are empty."""
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=bool)
    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    offsets = np.frombuffer(arr.buffers()[1], np.int64 if wide else np.int32, count=arr.offset + n + 1)[arr.offset:]
    empty = offsets[1:] == offsets[:-1]
    if arr.null_count:
        empty &= ~np.asarray(arr.is_null(), dtype=bool)
    return empty


def signed_log1p(x: np.ndarray) -> np.ndarray:
    """``sign(x) * log(1 + |x|)`` (the schema's ``sign_log1p``): log1p's compression for
    columns that go negative.

    Odd and monotonic, so a negative value keeps its sign and its order instead of becoming 0
    as ``log1p`` makes it (balances, deltas, signed scores); 0 stays 0.

    Example:
        >>> signed_log1p(np.array([-9.0, 0.0, 9.0])).round(3).tolist()
        [-2.303, 0.0, 2.303]
    """
    return np.sign(x) * np.log1p(np.abs(x))


def dense_transform(
    x: np.ndarray,
    fill: float = 0.0,
    log1p: bool = False,
    clip: tuple[float | None, float | None] | None = None,
    standardize: tuple[float, float] | None = None,
    sign_log1p: bool = False,
) -> np.ndarray:
    """Fill NaN -> clip -> log1p(max(x, 0)) or signed_log1p(x) -> (x - mean) / std, as float64."""
    if log1p and sign_log1p:
        raise ValueError("dense_transform: log1p and sign_log1p exclude each other; pick one")
    x = np.where(np.isnan(x), fill, x)
    if clip is not None:
        x = np.clip(x, -np.inf if clip[0] is None else clip[0], np.inf if clip[1] is None else clip[1])
    if log1p:
        x = np.log1p(np.maximum(x, 0.0))
    if sign_log1p:
        x = signed_log1p(x)
    if standardize is not None:
        x = (x - standardize[0]) / standardize[1]
    return x


def dense_runs(
    raw: np.ndarray,
    runs: Sequence[tuple[int, int, float, tuple[float | None, float | None] | None, bool, tuple[float, float] | None, bool]],
) -> tuple[np.ndarray, list[int]]:
    """The dense rows ``raw`` (float64 [R, n], changed in place) as the batch's float32 [n, R],
    each run ``(start, stop, fill, clip, log1p, standardize, sign_log1p)`` of rows transformed as
    ``dense_transform`` does it (bit for bit: the result equals ``dense_transform`` per row and a
    float32 cast), in two native passes (``_native.dense_prepare`` / ``dense_finish``) with
    numpy's log1p for the values its table does not hold. Returns the array and the runs (their
    index) that took ``dense_transform`` instead: a NaN fill or clip bound, a -0.0 clip bound,
    or a -0.0 value (a signed zero's max and sign are numpy's to decide)."""
    rows, n = raw.shape
    scaled = np.zeros(rows, np.uint8)
    means, stds = np.zeros(rows), np.ones(rows)
    declined: list[int] = []
    rest: np.ndarray | None = None
    for r, (a, b, fill, clip, log1p, standardize, sign_log1p) in enumerate(runs):
        lo, hi = (-np.inf if clip is None or clip[0] is None else float(clip[0]),
                  np.inf if clip is None or clip[1] is None else float(clip[1]))
        mode = 1 if log1p else 2 if sign_log1p else 0
        k = -1
        if not (any(math.isnan(v) for v in (fill, lo, hi)) or any(v == 0 and math.copysign(1.0, v) < 0 for v in (lo, hi))
                or (log1p and sign_log1p)):
            if rest is None or rest.size < (b - a) * n:
                rest = np.empty((b - a) * n, np.int64)
            k = _native.dense_prepare(raw[a:b], float(fill), lo, hi, mode, rest)
        if k < 0:
            declined.append(r)
            raw[a:b] = dense_transform(raw[a:b], fill, log1p, clip, standardize, sign_log1p)
            continue
        if k:  # values past the table: numpy's log1p (dense_transform's)
            assert rest is not None
            flat, at = raw[a:b].reshape(-1), rest[:k]
            flat[at] = np.log1p(flat[at]) if log1p else signed_log1p(flat[at])
        if standardize is not None:
            scaled[a:b] = 1
            means[a:b], stds[a:b] = standardize
    out = np.empty((n, rows), np.float32)
    _native.dense_finish(raw, scaled, means, stds, out)
    return out, declined


def row_of(lengths: np.ndarray) -> np.ndarray:
    """Row index of every element of a jagged array with these row lengths.

    Example:
        >>> row_of(np.array([2, 0, 1])).tolist()
        [0, 0, 2]
    """
    return np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)


def filter_jagged(lengths: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """New row lengths after dropping the elements where ``keep`` is false.

    Example:
        >>> filter_jagged(np.array([2, 0, 1]), np.array([True, False, True])).tolist()
        [1, 0, 1]
    """
    if keep.size == lengths.size and (lengths == 1).all():  # one value per row (no separator)
        return keep.astype(np.int64)
    return np.bincount(row_of(lengths)[keep], minlength=lengths.size).astype(np.int64)


def truncate_jagged(lengths: np.ndarray, max_length: int) -> np.ndarray:
    """Element mask keeping the first ``max_length`` elements of every row.

    Example:
        >>> truncate_jagged(np.array([3, 1]), 2).tolist()
        [True, True, False, True]
    """
    starts = np.cumsum(lengths) - lengths
    pos = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts, lengths)
    return pos < max_length
