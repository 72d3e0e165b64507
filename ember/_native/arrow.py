"""Hashing and parsing Arrow buffers in place (``ember.featurize``): categorical values to
int64 IDs, dense float columns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ember import _native
from ember.mix import mix64


# An Arrow array's buffers as they are (pyarrow.Buffer, or any bytes-like object): validity a
# bitmap (bit off+i set = value i present; b"" = no nulls), string offsets int32 (width 4) or
# int64 (width 8) and their bytes, or fixed-width integers. Nothing passes through Python
# objects. A null is hashed as 0 / "" and flagged in out_valid; the hash is hashing.py's.

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MASK64 = (1 << 64) - 1
_LONG_BYTES = 4096  # strings longer than this are hashed one by one (see hash_utf8_buffers)


def _mix64_int(z: int) -> int:
    """``mix64`` of one Python int (for the word loop of a single long string)."""
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & _MASK64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def hash_utf8_buffers(offsets: np.ndarray, data: np.ndarray, salt: np.uint64, long_bytes: int = _LONG_BYTES) -> np.ndarray:
    """Hash each string ``data[offsets[i]:offsets[i+1]]`` with numpy: ``h = mix64(salt ^
    (len+1)*golden)``, then ``h = mix64(h ^ word)`` over its little-endian 8-byte words (the last
    zero-padded). The reference of the string kernel (and ``hash_strings``'s own path).

    Strings are hashed side by side, one numpy step per word position, so the steps number the
    longest string's words. A string over ``long_bytes`` (a 2 MiB token in a CSV line) would make
    that hundreds of thousands of steps for one value: those are hashed one by one with Python
    ints instead (same result, about 1 s per 4 MiB), and the shared steps stop at ``long_bytes``.
    """
    starts = offsets[:-1].astype(np.int64)
    lens = (offsets[1:] - offsets[:-1]).astype(np.int64)
    h = mix64(salt ^ ((lens.astype(np.uint64) + np.uint64(1)) * _GOLDEN))
    if lens.size == 0:
        return h.view(np.int64)
    long = lens > long_bytes
    nwords = np.where(long, 0, (lens + 7) // 8)
    padded = np.concatenate([data, np.zeros(8, dtype=np.uint8)])
    # words[i] is the little-endian uint64 made of bytes i..i+7: an unaligned strided view, so
    # gathering one word per string is a single fancy-index.
    words = np.ndarray((padded.size - 7,), dtype="<u8", buffer=padded, strides=(1,))
    for j in range(int(nwords.max())):
        active = np.flatnonzero(nwords > j) if j else np.flatnonzero(nwords > 0)
        word = words[starts[active] + 8 * j].astype(np.uint64)
        remaining = lens[active] - 8 * j
        short = remaining < 8  # bytes past the end of the string belong to the next one
        if short.any():
            keep = (np.uint64(1) << (remaining[short].astype(np.uint64) * np.uint64(8))) - np.uint64(1)
            word[short] &= keep
        h[active] = mix64(h[active] ^ word)
    for i in np.flatnonzero(long):
        a, n = int(starts[i]), int(lens[i])
        chunk = np.zeros(-(-n // 8) * 8, dtype=np.uint8)
        chunk[:n] = data[a : a + n]
        z = int(h[i])
        for w in chunk.view("<u8").tolist():
            z = _mix64_int(z ^ w)
        h[i] = np.uint64(z)
    return h.view(np.int64)


def _present(validity: object, off: int, n: int) -> np.ndarray:
    """bool [n]: the validity bitmap's bits off..off+n-1 (all True for an empty bitmap)."""
    bits = np.frombuffer(validity, np.uint8)  # type: ignore[call-overload]
    if bits.size == 0:
        return np.ones(n, dtype=bool)
    if bits.size * 8 < off + n:
        raise ValueError("arrow hash: the validity bitmap is shorter than off + n bits")
    return np.unpackbits(bits, count=off + n, bitorder="little")[off:].astype(bool)


def _check_out(n: int, out: np.ndarray, out_valid: np.ndarray) -> None:
    if out.dtype != np.int64 or out.shape != (n,) or out_valid.dtype != np.bool_ or out_valid.shape != (n,):
        raise ValueError("arrow hash: out must be int64 [n] and out_valid bool [n]")


def arrow_hash_strings(offsets: object, data: object, validity: object, off: int, n: int, width: int, salt: int,
                       out: np.ndarray, out_valid: np.ndarray) -> int:
    """Hash the n strings of an Arrow (large_)string or binary array from its buffers into
    ``out`` (int64 [n]) and flag its present values in ``out_valid`` (bool [n]); returns the
    number of nulls. ``offsets``: int32 (``width`` 4) or int64 (8) offsets, from element ``off``;
    ``data``: the bytes (b"" when there are none); ``validity``: the bitmap or b"".
    Runs on several threads when the call is large enough."""
    _check_out(n, out, out_valid)
    core = _native._core
    if core is None:
        return _arrow_hash_strings_py(offsets, data, validity, off, n, width, salt, out, out_valid)

    return core.arrow_hash_strings(offsets, data, validity, off, n, width, salt, out, out_valid, _native.part_count(n))


def _arrow_hash_strings_py(offsets: object, data: object, validity: object, off: int, n: int, width: int, salt: int,
                           out: np.ndarray, out_valid: np.ndarray) -> int:
    # the reference: each distinct value hashed once (dictionary encoding), with numpy
    _check_out(n, out, out_valid)
    present = _present(validity, off, n)
    arr = _binary_from_buffers("arrow_hash_strings", offsets, data, off, n, width)
    key = np.uint64(salt)
    if not present.all():  # a null is hashed as ""
        arr = pc.if_else(pa.array(present), arr, pa.scalar(b"", arr.type))
    enc = pc.dictionary_encode(arr)
    dic = enc.dictionary
    bufs = dic.buffers()
    doffs = np.frombuffer(bufs[1], np.int64 if width == 8 else np.int32)[dic.offset : dic.offset + len(dic) + 1].astype(np.int64)
    ddata = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    if len(dic):
        ddata, doffs = ddata[int(doffs[0]) : int(doffs[-1])], doffs - doffs[0]
    ids = hash_utf8_buffers(doffs, ddata, key)
    out[:] = ids[enc.indices.to_numpy(zero_copy_only=False)] if n else 0
    out_valid[:] = present
    return int(n - present.sum())


def arrow_hash_ints(values: object, validity: object, off: int, n: int, width: int, signed: bool, salt: int,
                    out: np.ndarray, out_valid: np.ndarray) -> int:
    """Hash the n integers of an Arrow integer array (``width`` 1, 2, 4 or 8 bytes, ``signed``
    or not; sign- or zero-extended to 64 bits) from its buffers: ``mix64(v ^ salt)`` into
    ``out`` (int64 [n]), present values flagged in ``out_valid``; returns the number of nulls."""
    _check_out(n, out, out_valid)
    core = _native._core
    if core is None:
        return _arrow_hash_ints_py(values, validity, off, n, width, signed, salt, out, out_valid)

    return core.arrow_hash_ints(values, validity, off, n, width, signed, salt, out, out_valid, _native.part_count(n))


def _arrow_hash_ints_py(values: object, validity: object, off: int, n: int, width: int, signed: bool, salt: int,
                        out: np.ndarray, out_valid: np.ndarray) -> int:
    _check_out(n, out, out_valid)
    if width not in (1, 2, 4, 8):
        raise ValueError("arrow_hash_ints: width must be 1, 2, 4 or 8 bytes")
    present = _present(validity, off, n)
    v = np.frombuffer(values, np.dtype(f"{'i' if signed else 'u'}{width}"), count=off + n)[off:]  # type: ignore[call-overload]
    v = np.where(present, v.astype(np.int64), 0)  # sign- or zero-extended; uint64 keeps its bits
    out[:] = mix64(v.view(np.uint64) ^ np.uint64(salt)).view(np.int64)
    out_valid[:] = present
    return int(n - present.sum())


_INT_TOKEN = r"^-?\d{1,19}$"


def arrow_parse_ints(offsets: object, data: object, validity: object, off: int, n: int, width: int, out: np.ndarray,
                     state: np.ndarray) -> int:
    """Decimal integer IDs from an Arrow string array's buffers (as ``arrow_hash_strings`` takes
    them) into ``out`` (int64 [n]), with ``state`` (uint8 [n]) 0 for an ID (``-?`` and 1-19
    digits, within int64), 1 for a missing value (null or empty), 2 for a bad one (``out`` 0
    then). Returns the number of bad values, or -1 when a present value holds a byte other than
    a digit or ``-`` (blanks, ``+``, ...): the caller then parses the column its general way."""
    if out.dtype != np.int64 or out.shape != (n,) or state.dtype != np.uint8 or state.shape != (n,):
        raise ValueError("arrow_parse_ints: out must be int64 [n] and state uint8 [n]")
    if _native._core is None:
        return _arrow_parse_ints_py(offsets, data, validity, off, n, width, out, state)
    return _native._core.arrow_parse_ints(offsets, data, validity, off, n, width, out, state)


def _arrow_parse_ints_py(offsets: object, data: object, validity: object, off: int, n: int, width: int, out: np.ndarray,
                         state: np.ndarray) -> int:
    present = _present(validity, off, n)
    arr = _binary_from_buffers("arrow_parse_ints", offsets, data, off, n, width)
    plain = np.asarray(pc.match_substring_regex(arr, r"^[-0-9]*$"), dtype=bool)
    if (present & ~plain).any():
        return -1
    missing = ~present | (np.asarray(pc.binary_length(arr), dtype=np.int64) == 0)
    ok = np.asarray(pc.match_substring_regex(arr, _INT_TOKEN), dtype=bool) & ~missing
    for i in np.flatnonzero(ok & (np.asarray(pc.binary_length(arr), dtype=np.int64) >= 19)):
        ok[i] = -(2**63) <= int(arr[int(i)].as_py()) < 2**63  # 19 digits may pass int64's range
    text = pc.if_else(pa.array(ok), arr, pa.scalar(b"0", arr.type)).cast(pa.large_string() if width == 8 else pa.string())
    out[:] = np.asarray(pc.cast(text, pa.int64()), dtype=np.int64)
    state[:] = np.where(missing, 1, np.where(ok, 0, 2))
    return int((state == 2).sum())


def featurize_ids(columns: list[tuple], n: int, out_values: np.ndarray, out_lengths: np.ndarray,
                  out_offsets: np.ndarray, out_counts: np.ndarray, batch: "pa.RecordBatch | None" = None,
                  exported: tuple[object, object] | None = None) -> int:
    """The single-valued sparse columns of one record batch in one pass over their Arrow buffers
    (``ember.featurize.featurizer``). Each column is ``(kind, values, data, validity, off, width,
    signed, hash, salt, listed)``: kind 0 an integer array (``values`` its ``width``-byte
    integers, ``signed`` or not, ``data`` b""), kind 1 a hashed (large_)string or binary array,
    kind 2 a string array of decimal integer IDs, not hashed (``values`` its int32/int64 offsets,
    ``width`` 4 or 8, ``data`` its bytes); ``validity`` the bitmap or b"", ``off`` the array's
    offset. A value is kept unless null, ``listed`` (a tuple of bytes for kinds 1 and 2; of
    integers for kind 0, compared as the 64-bit pattern of the sign- or zero-extended value) or,
    for kind 2, empty; it becomes ``hash`` ? its ID (``arrow_hash_strings`` / ``arrow_hash_ints``
    with ``salt``) : the integer (kind 2: as ``arrow_parse_ints`` reads it). Column c's kept
    values go to ``out_values`` (int64 [>= C * n]) after those of the columns before it,
    ``out_counts[c]`` of them; ``out_lengths`` (int64 [C * n]) gets each row's 0 or 1,
    ``out_offsets`` (int64 [C, n + 1]) their running sums. A kind 2 column with a value that is
    no ID (a byte other than 0-9 and ``-``, or a bad ID; listed values aside) is declined:
    ``out_counts[c]`` = -1, nothing of it kept (its lengths and offsets are left undefined), for
    the caller's general path. Returns the values kept.

    With ``batch`` (a record batch of ``n`` rows), a column is ``(kind, child, width, signed,
    hash, salt, listed)``: its buffers are those of ``batch.column(child)``, read in place by
    the native core through the Arrow C data interface (no Python object a column);
    ``exported``: ``batch.__arrow_c_array__()`` when the caller has it already (one export for
    several calls)."""
    c = len(columns)
    if (out_values.dtype != np.int64 or out_values.size < c * n or out_lengths.dtype != np.int64
            or out_lengths.shape != (c * n,) or out_offsets.dtype != np.int64 or out_offsets.shape != (c, n + 1)
            or out_counts.dtype != np.int64 or out_counts.shape != (c,)):
        raise ValueError("featurize_ids: out_values int64 [>= C * n], out_lengths int64 [C * n], "
                         "out_offsets int64 [C, n + 1], out_counts int64 [C]")
    if _native._core is None:
        if batch is not None:
            columns = [(kind, *_column_buffers(batch, child, n, kind), width, signed, hashed, salt, listed)
                       for kind, child, width, signed, hashed, salt, listed in columns]
        return _featurize_ids_py(columns, n, out_values, out_lengths, out_offsets, out_counts)
    if batch is not None and exported is None:
        exported = _exported(batch, n)
    return int(_native._core.featurize_ids(columns, n, out_values, out_lengths, out_offsets, out_counts,
                                           None if batch is None else exported))


def _featurize_ids_py(columns: list[tuple], n: int, out_values: np.ndarray, out_lengths: np.ndarray,
                      out_offsets: np.ndarray, out_counts: np.ndarray) -> int:
    total = 0
    ids, valid = np.empty(n, np.int64), np.empty(n, np.bool_)
    for c, (kind, values, data, validity, off, width, signed, hashed, salt, listed) in enumerate(columns):
        if kind == 2:
            if hashed:
                raise ValueError("featurize_ids: a column of integer IDs as text (kind 2) is not hashed")
            present = _present(validity, off, n)
            arr = _binary_from_buffers("featurize_ids", values, data, off, n, width)
            listed_mask = np.zeros(n, bool)
            if listed:
                listed_mask = np.asarray(pc.fill_null(pc.is_in(arr, value_set=pa.array(list(listed), arr.type)), False), dtype=bool)
            empty = np.asarray(pc.binary_length(arr), dtype=np.int64) == 0
            asked = present & ~listed_mask & ~empty
            if not asked.any():
                valid[:] = False
                ids[:] = 0
            else:
                ok = np.asarray(pc.fill_null(pc.match_substring_regex(arr, _INT_TOKEN), False), dtype=bool)
                for i in np.flatnonzero(ok & asked & (np.asarray(pc.binary_length(arr), dtype=np.int64) >= 19)):
                    ok[i] = -(2**63) <= int(arr[int(i)].as_py()) < 2**63  # 19 digits may pass int64's range
                if (asked & ~ok).any():  # not an ID: the caller's general path judges the column
                    out_counts[c] = -1
                    continue
                text = pc.if_else(pa.array(asked), arr, pa.scalar(b"0", arr.type))
                ids[:] = np.asarray(pc.cast(text.cast(pa.large_string() if width == 8 else pa.string()), pa.int64()),
                                    dtype=np.int64)
                valid[:] = asked
        elif kind == 1:
            if not hashed:
                raise ValueError("featurize_ids: a string column (kind 1) must be hashed")
            _arrow_hash_strings_py(values, data, validity, off, n, width, salt, ids, valid)
            if listed:
                arr = _binary_from_buffers("featurize_ids", values, data, off, n, width)
                valid &= ~np.asarray(pc.fill_null(pc.is_in(arr, value_set=pa.array(list(listed), arr.type)), False), dtype=bool)
        elif kind == 0:
            if width not in (1, 2, 4, 8):
                raise ValueError("featurize_ids: an integer column's width must be 1, 2, 4 or 8 bytes")
            present = _present(validity, off, n)
            v = np.frombuffer(values, np.dtype(f"{'i' if signed else 'u'}{width}"), count=off + n)[off:]  # type: ignore[call-overload]
            bits = v.astype(np.int64).view(np.uint64)  # sign- or zero-extended; uint64 keeps its bits
            valid[:] = present
            if listed:
                valid &= ~np.isin(bits, np.array([x & (2**64 - 1) for x in listed], np.uint64))
            ids[:] = mix64(bits ^ np.uint64(salt)).view(np.int64) if hashed else bits.view(np.int64)
        else:
            raise ValueError(f"featurize_ids: column kind must be 0 (integers), 1 (hashed strings) or 2 (integer IDs as "
                             f"text), got {kind}")
        kept = ids[valid]
        out_values[total : total + kept.size] = kept
        out_lengths[c * n : (c + 1) * n] = valid
        out_offsets[c, 0] = 0
        np.cumsum(valid, out=out_offsets[c, 1:])
        out_counts[c] = kept.size
        total += kept.size
    return total


def dense_floats(columns: list[tuple], n: int, out: np.ndarray, out_done: np.ndarray,
                 batch: "pa.RecordBatch | None" = None, exported: tuple[object, object] | None = None) -> int:
    """Integer columns, and string columns of plain integers and empty fields (CSV counts), as
    float64 in one call, as ``parse_floats`` reads them: each column ``(kind, values, data,
    validity, off, width, signed, row)``: kind 0 an integer array (``values`` its
    ``width``-byte integers, ``data`` b""), kind 1 a string array (its offsets of ``width`` 4
    or 8 and bytes, as ``arrow_parse_ints`` takes them); ``row``: its row of ``out`` (float64
    [R, n]). An integer is rounded to float64 (numpy's ``astype``); a string ``-?`` and 1-19
    digits within int64 likewise (``-0`` is -0.0, as a decimal parse makes it); a null or empty
    value is NaN. A string column holding any other value is not done (``out_done[c]`` = 0, its
    row undefined), for the caller's general parse. Returns the columns done.

    With ``batch``, a column is ``(kind, child, width, signed, row)``, its buffers those of
    ``batch.column(child)`` (read in place, as ``featurize_ids`` reads them), and an integer
    column with nulls is not done (Arrow's cast decides those: it refuses integers past 2**53);
    ``exported`` as for ``featurize_ids``."""
    if out.dtype != np.float64 or out.ndim != 2 or out.shape[1] != n or not out.flags.c_contiguous \
            or out_done.dtype != np.uint8 or out_done.shape != (len(columns),):
        raise ValueError("dense_floats: out float64 [R, n] (C-contiguous), out_done uint8 [C]")
    if _native._core is None:
        if batch is None:
            return _dense_floats_py(columns, n, out, out_done)
        nulls = [kind == 0 and batch.column(child).null_count > 0 for kind, child, *_ in columns]
        done = _dense_floats_py([(kind, *_column_buffers(batch, child, n, kind), width, signed, row)
                                 for kind, child, width, signed, row in columns], n, out, out_done)
        out_done[np.array(nulls, bool)] = 0
        return done - sum(nulls)
    if batch is not None and exported is None:
        exported = _exported(batch, n)
    return int(_native._core.dense_floats(columns, n, out, out_done, None if batch is None else exported))


def _dense_floats_py(columns: list[tuple], n: int, out: np.ndarray, out_done: np.ndarray) -> int:
    x, state = np.empty(n, np.int64), np.empty(n, np.uint8)
    for c, (kind, offsets, data, validity, off, width, signed, row) in enumerate(columns):
        if kind == 0:
            v = np.frombuffer(offsets, np.dtype(f"{'i' if signed else 'u'}{width}"), count=off + n)[off:]  # type: ignore[call-overload]
            out[row] = np.where(_present(validity, off, n), v.astype(np.float64), np.nan)
            out_done[c] = 1
            continue
        if _arrow_parse_ints_py(offsets, data, validity, off, n, width, x, state) < 0 or (state == 2).any():
            out_done[c] = 0
            continue
        values = x.astype(np.float64)
        values[state == 1] = np.nan
        zeros = np.flatnonzero((x == 0) & (state == 0))
        if zeros.size:  # "-0": -0.0
            starts = np.frombuffer(offsets, np.int64 if width == 8 else np.int32, count=off + n + 1)[off + zeros]  # type: ignore[call-overload]
            values[zeros[np.frombuffer(data, np.uint8)[starts] == ord("-")]] = -0.0  # type: ignore[call-overload]
        out[row] = values
        out_done[c] = 1
    return int(out_done.sum())


def _batch_of(batch: "pa.RecordBatch", n: int) -> "pa.RecordBatch":
    """``batch``, checked to be a record batch of ``n`` rows (the form by position needs one)."""
    if not isinstance(batch, pa.RecordBatch) or batch.num_rows != n:
        raise ValueError(f"a record batch of {n} rows is needed, got {type(batch).__name__}")
    return batch


def _exported(batch: "pa.RecordBatch", n: int) -> tuple[object, object]:
    """``batch`` through the Arrow C data interface (schema and array capsules), for the native
    core to read its columns' buffers in place."""
    return _batch_of(batch, n).__arrow_c_array__()


def _column_buffers(batch: "pa.RecordBatch", child: int, n: int, kind: int) -> tuple[object, object, object, int]:
    """``(values, data, validity, off)`` of ``batch.column(child)`` as the buffer form of a
    column passes them (validity b"" without nulls, data b"" for integers)."""
    arr = _batch_of(batch, n).column(child)
    bufs = arr.buffers()
    validity = bufs[0] if bufs[0] is not None and arr.null_count else b""
    data = (bufs[2] if bufs[2] is not None else b"") if kind != 0 else b""
    return bufs[1], data, validity, arr.offset


def _binary_from_buffers(fn: str, offsets: object, data: object, off: int, n: int, width: int) -> "pa.Array":
    """The (large_)binary Arrow array of a string column's offsets and data buffers, checked
    (the fallbacks' view of what the native kernels read in place)."""
    if width not in (4, 8):
        raise ValueError(f"{fn}: width must be 4 (int32 offsets) or 8 (int64)")
    arr = pa.Array.from_buffers(pa.large_binary() if width == 8 else pa.binary(), n,
                                [None, pa.py_buffer(offsets), pa.py_buffer(data)], offset=off)
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid as e:
        raise ValueError(f"{fn}: offsets out of the data's range ({e})") from None
    return arr
