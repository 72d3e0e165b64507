"""Splitting CSV bytes into fields (``ember.source.csv``)."""

from __future__ import annotations

import numpy as np

from ember import _native


CSV_HEX, CSV_PAREN, CSV_LONG_DIGITS = 1, 2, 4  # csv_hazards' flags
CSV_QUOTE, CSV_CR, CSV_NOT_ASCII = 1, 2, 4  # csv_bytes' flags


def csv_bytes(data: object) -> tuple[int, int]:
    """What ``ember.source.csv`` asks of a block of CSV text before it splits it, in one pass
    over its bytes: (the number of ``\n`` bytes, flags), flags ``CSV_QUOTE`` a ``"`` byte,
    ``CSV_CR`` a ``\r``, ``CSV_NOT_ASCII`` a byte >= 0x80 (then it may not be UTF-8). The
    separate searches it replaces (a newline count, two byte searches, an ASCII check) took
    ~1.1 ms on a 2.3 MB block, this ~0.35."""
    if _native._core is None:
        return _csv_bytes_py(data)
    lines, flags = _native._core.csv_bytes(data)
    return int(lines), int(flags)


def _csv_bytes_py(data: object) -> tuple[int, int]:
    b = np.frombuffer(data, dtype=np.uint8)  # type: ignore[call-overload]
    flags = ((CSV_QUOTE if (b == ord('"')).any() else 0) | (CSV_CR if (b == ord("\r")).any() else 0)
             | (CSV_NOT_ASCII if (b >= 0x80).any() else 0))
    return int(np.count_nonzero(b == ord("\n"))), flags


def csv_hazards(data: bytes) -> int:
    """What in a block of CSV text pyarrow's typed CSV read would take differently from ember's
    text path (``ember.source.csv``), as flags: ``CSV_HEX`` an ``x`` or ``X`` byte (Arrow reads
    ``0x1f`` as an integer, the text path as no integer), ``CSV_PAREN`` a ``(`` (Arrow reads
    ``nan(1)`` as NaN even beside a blank-padded number, the text path then as no number),
    ``CSV_LONG_DIGITS`` a run of 20 or more ASCII digits (Arrow reads zero-padded integers of any
    length, the text path at most 19 digits). One pass over the bytes."""
    if _native._core is None:
        return _csv_hazards_py(data)
    return int(_native._core.csv_hazards(data))


def _csv_hazards_py(data: bytes) -> int:
    flags = (CSV_HEX if b"x" in data or b"X" in data else 0) | (CSV_PAREN if b"(" in data else 0)
    b = np.frombuffer(data, dtype=np.uint8)
    other = np.flatnonzero((b - np.uint8(ord("0"))) > 9)  # uint8 wraps: every byte but a digit
    bounds = np.concatenate([[-1], other, [b.size]])
    if b.size and int(np.diff(bounds).max()) - 1 >= 20:
        flags |= CSV_LONG_DIGITS
    return flags


def csv_split(data: object, delimiter: int, ncols: int, slots: np.ndarray, n: int, out_starts: np.ndarray,
              out_offsets: np.ndarray, crlf: bool = False) -> int:
    """The fields of a block of ``n`` CSV lines without quotes (``ember.source.csv``), split as
    pyarrow splits such text: each line ends with ``\n`` (``crlf``: or ``\r\n``, the CR no part
    of the last field; -1 when a CR is anywhere else, which pyarrow reads as a line end; without
    it the caller has seen no CR) and holds ``ncols`` fields
    separated by the ``delimiter`` byte. ``slots`` (int64 [ncols]): each field's output slot, -1
    for none; field i of slot s starts at ``out_starts[s * n + i]`` (int32) in ``data``, and
    ``out_offsets[s]`` (int32 [k, n + 1]) gets the running sums of its fields' lengths from 0.
    Returns ``n``, or -1 when a line holds another number of fields, there are not ``n`` lines,
    or ``data`` does not end with ``\\n``. Two passes: the separators' positions (64 bytes a
    step), then each slot's starts and lengths from them."""
    if out_starts.dtype != np.int32 or out_offsets.dtype != np.int32 or slots.dtype != np.int64:
        raise ValueError("csv_split: slots int64 [ncols], out_starts int32 [k * n], out_offsets int32 [k, n + 1]")
    if _native._core is None:
        return _csv_split_py(data, delimiter, ncols, slots, n, out_starts, out_offsets, crlf)
    return int(_native._core.csv_split(data, delimiter, ncols, slots, n, out_starts, out_offsets, crlf))


def _csv_split_py(data: object, delimiter: int, ncols: int, slots: np.ndarray, n: int, out_starts: np.ndarray,
                  out_offsets: np.ndarray, crlf: bool = False) -> int:
    b = np.frombuffer(data, np.uint8)  # type: ignore[call-overload]
    ends = np.flatnonzero((b == delimiter) | (b == ord("\n")))
    if ends.size != n * ncols or (n and ends[-1] != b.size - 1) or (not n and b.size):
        return -1
    ends = ends.reshape(n, ncols)
    is_newline = b[ends] == ord("\n")
    if not is_newline[:, -1].all() or is_newline[:, :-1].any():
        return -1
    begins = np.empty_like(ends)
    begins.reshape(-1)[1:] = ends.reshape(-1)[:-1] + 1
    if begins.size:
        begins.reshape(-1)[0] = 0
    lengths = ends - begins
    if crlf:  # a CR just before a line's LF ends the line; any other CR: no split
        cr = (lengths[:, -1] > 0) & (b[np.maximum(ends[:, -1] - 1, 0)] == ord("\r"))
        if int(np.count_nonzero(b == ord("\r"))) != int(np.count_nonzero(cr)):
            return -1
        lengths[:, -1] -= cr
    starts, offsets = out_starts.reshape(-1), out_offsets.reshape(-1)
    k = int(slots.max()) + 1 if slots.size else 0
    starts[: k * n] = 0  # a slot no field fills: no fields, all empty
    offsets[: k * (n + 1)] = 0
    for col, s in enumerate(slots.tolist()):
        if s >= 0:
            starts[s * n : (s + 1) * n] = begins[:, col]
            offsets[s * (n + 1)] = 0
            np.cumsum(lengths[:, col], out=offsets[s * (n + 1) + 1 : (s + 1) * (n + 1)], dtype=np.int32)
    return n


def csv_gather(data: object, starts: np.ndarray, offsets: np.ndarray, n: int, outs: list) -> None:
    """``csv_split``'s fields copied out: ``outs[s]`` (a writable buffer of offsets[s, n] bytes) gets field i of slot s
    (``starts[s * n + i]`` in ``data``) at ``offsets[s, i]``: the data buffer of an Arrow string
    array whose offsets are ``offsets[s]``."""
    if _native._core is None:
        return _csv_gather_py(data, starts, offsets, n, outs)
    _native._core.csv_gather(data, starts, offsets, n, outs)


def _csv_gather_py(data: object, starts: np.ndarray, offsets: np.ndarray, n: int, outs: list) -> None:
    b = np.frombuffer(data, np.uint8)  # type: ignore[call-overload]
    offs = offsets.reshape(len(outs), n + 1).astype(np.int64)
    st = starts.reshape(-1).astype(np.int64)
    for s, buf in enumerate(outs):
        out = np.frombuffer(buf, np.uint8)  # type: ignore[call-overload]  # any writable buffer
        o = offs[s]
        if out.size != o[n]:
            raise ValueError("csv_gather: out s must hold offsets[s, n] bytes")
        lens = np.diff(o)
        out[:] = b[np.repeat(st[s * n : (s + 1) * n] - o[:-1], lens) + np.arange(int(o[n]))]


def csv_ints(data: object, starts: np.ndarray, offsets: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``csv_split``'s fields of m slots (``starts`` int32 [m * n], ``offsets`` int32 [m, n + 1])
    read as decimal integer IDs, without copying their text out: (values int64 [m, n], validity
    uint8 [m, (n + 7) // 8] (Arrow's bits: 0 for an empty field, null), nulls int64 [m]). A slot
    holding a field that is no ID as ``featurize_ids`` reads IDs from text (``-?[0-9]{1,19}``
    within int64, ``arrow_parse_ints``) gets ``nulls[s] = -1`` (its values and validity
    undefined): the caller keeps that column's text, for the featurizer to judge. So an ID
    column of a CSV block becomes exactly what the featurizer makes of its text."""
    m = offsets.shape[0] if offsets.ndim == 2 else 0
    if offsets.shape != (m, n + 1) or offsets.dtype != np.int32 or starts.dtype != np.int32 or starts.size != m * n:
        raise ValueError("csv_ints: starts int32 [m * n], offsets int32 [m, n + 1]")
    out, valid, nulls = np.empty((m, n), np.int64), np.empty((m, (n + 7) // 8), np.uint8), np.empty(m, np.int64)
    if _native._core is None:
        _csv_ints_py(data, starts, offsets, n, out, valid, nulls)
    else:
        _native._core.csv_ints(data, np.ascontiguousarray(starts), np.ascontiguousarray(offsets), n, out, valid, nulls)
    return out, valid, nulls


def _csv_ints_py(data: object, starts: np.ndarray, offsets: np.ndarray, n: int, out: np.ndarray, valid: np.ndarray,
                 nulls: np.ndarray) -> None:
    from ember._native.arrow import _arrow_parse_ints_py

    for s in range(out.shape[0]):
        text = np.empty(int(offsets[s, n]), np.uint8)
        _csv_gather_py(data, starts[s * n : (s + 1) * n], offsets[s : s + 1], n, [text])
        state = np.empty(n, np.int8)
        if _arrow_parse_ints_py(offsets[s].tobytes(), text.tobytes(), b"", 0, n, 4, out[s], state) != 0:  # -1 or bad IDs
            nulls[s] = -1
            continue
        valid[s] = np.packbits(state == 0, bitorder="little")
        out[s][state != 0] = 0
        nulls[s] = int(np.count_nonzero(state == 1))
