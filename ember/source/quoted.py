"""Where the records of CSV text end when quoted values may hold line ends (``csv.newlines_in_values``).

A quote opens a quoted value only as a field's first character (``"a,b"``; in ``a"b`` it is a
letter, as pyarrow reads it); ``""`` inside is a quote. A quoted value may hold delimiters and
line ends when it is closed the way CSV writers close it: its closing quote followed by the
delimiter or the line end. A quote that opens a value spanning lines but is never closed that
way (a stray ``"`` in the data) would swallow the lines after it, so it is not taken for one:
the line it stands on is a bad row (``UNCLOSED``), and reading goes on with the next line. A
value that closes on its own line is left to pyarrow's lenient reading (``"a"b`` is ``ab``).

The scan visits quote characters only (``bytes.find``), so text without quotes costs one pass;
a quoted value still open at a block's end is carried into the next block, up to ``limit``
bytes (past that, its quote counts as stray: memory stays bounded whatever the data).

Example:
    >>> scan(b'1,"a\\nb",2\\n3,x,4\\n', b",", final=True)
    Scan(units=[('ok', 0, 16)], spans=[(2, 6)], cut=16)
    >>> scan(b'1,"a,2\\n3,x,4\\n', b",", final=True).units  # a stray quote: its line alone is bad
    [('stray', 0, 7), ('ok', 7, 13)]
"""

from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

__all__ = ["Scan", "scan", "quoted_blocks", "record_starts", "UNCLOSED"]

UNCLOSED = "<row>: quoted value not closed"
_NL, _CR, _QUOTE = 10, 13, b'"'


@dataclass
class Scan:
    """``units``: ``("ok", start, end)`` runs of whole records, ``("stray", start, end)`` a bad
    row (the record up to the end of the line of a stray quote), in order, covering
    ``block[:cut]``; ``spans``: (open, close) of the quoted values that hold a line end;
    ``block[cut:]``: a record whose quoted value is still open (carried to the next block)."""

    units: list[tuple[str, int, int]] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    cut: int = 0


@functools.lru_cache(maxsize=8)
def _patterns(delimiter: bytes) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """A quoted value closed on its line, and a quote that starts a field (regexes, run in C)."""
    d = re.escape(delimiter)
    start = rb"(?<![^" + d + rb"\r\n])"
    return re.compile(start + rb'"[^"\r\n]*(?:""[^"\r\n]*)*"'), re.compile(start + rb'"')


def _no_value_spans_lines(block: bytes, delimiter: bytes) -> bool:
    """Whether every quoted value of ``block`` closes on its line, holding no CR or LF (the common case, checked in
    C): with those removed, no quote starts a field. Conservative: False sends ``scan`` on."""
    closed, field_start = _patterns(delimiter)
    return field_start.search(closed.sub(b"", block)) is None


def scan(block: bytes, delimiter: bytes, final: bool) -> Scan:
    """Records of ``block`` (whole lines); ``final``: no text follows, so a value still open
    at the end is a stray quote (else it is left for the next block: ``cut`` before its record)."""
    out = Scan()
    if _QUOTE not in block or _no_value_spans_lines(block, delimiter):
        out.units, out.cut = [("ok", 0, len(block))] if block else [], len(block)
        return out
    delim = delimiter[0]
    start = pos = 0  # start of the current "ok" run; where the quote search goes on
    while True:
        q = block.find(_QUOTE, pos)
        if q < 0:
            break
        if q > 0 and block[q - 1] not in (delim, _NL, _CR):
            pos = q + 1  # a quote inside an unquoted field is a letter
            continue
        close = q + 1
        while True:
            close = block.find(_QUOTE, close)
            if close < 0 or block[close + 1 : close + 2] != _QUOTE:
                break
            close += 2  # "" is a quote inside the value
        if close >= 0 and block.find(b"\n", q, close) < 0 and block.find(b"\r", q, close) < 0:
            pos = close + 1  # closed on its own line
            continue
        if close >= 0 and (close + 1 == len(block) or block[close + 1] in (delim, _NL, _CR)):
            out.spans.append((q, close))  # a value holding line ends, closed as writers close one
            pos = close + 1
            continue
        rec = _record_start(block, start, q, out.spans)
        if close < 0 and not final:  # may close in the next block: carry its record there
            out.spans = [s for s in out.spans if s[0] < rec]
            if rec > start:
                out.units.append(("ok", start, rec))
            out.cut = rec
            return out
        end = block.find(b"\n", q) + 1 or len(block)  # the stray quote's line ends its bad row
        out.spans = [s for s in out.spans if s[0] < rec]
        if rec > start:
            out.units.append(("ok", start, rec))
        out.units.append(("stray", rec, end))
        start = pos = end
    if start < len(block):
        out.units.append(("ok", start, len(block)))
    out.cut = len(block)
    return out


def _record_start(block: bytes, lo: int, at: int, spans: list[tuple[int, int]]) -> int:
    """Start of the record holding byte ``at``: after the last line end before it that is not
    inside a quoted value (``spans``), and not before ``lo``."""
    opens = [s[0] for s in spans]
    r = at
    while True:
        r = block.rfind(b"\n", lo, r)
        if r < 0:
            return lo
        i = bisect.bisect_left(opens, r) - 1
        if i >= 0 and spans[i][1] > r:
            r = spans[i][0]  # inside a quoted value: look before it
            continue
        return r + 1


def record_starts(block: bytes, start: int, end: int, spans: list[tuple[int, int]]) -> np.ndarray:
    """Start offsets of the records in ``block[start:end]`` (whole records): a record ends at
    a line end (LF, CRLF, or a lone CR, as pyarrow reads them) outside the quoted ``spans``."""
    arr = np.frombuffer(block, dtype=np.uint8, count=end)[start:]
    ends = np.flatnonzero(arr == _NL)
    cr = np.flatnonzero(arr == _CR)
    if cr.size:  # a lone CR ends a record too
        nxt = cr + 1
        lone = cr[(nxt >= arr.size) | (arr[np.minimum(nxt, arr.size - 1)] != _NL)]
        ends = np.sort(np.concatenate([ends, lone])) if lone.size else ends
    ends = ends + start
    if spans:
        opens = np.array([s[0] for s in spans])
        closes = np.array([s[1] for s in spans])
        i = np.searchsorted(opens, ends) - 1
        inside = (i >= 0) & (closes[np.maximum(i, 0)] > ends)
        ends = ends[~inside]
    ends = ends[ends < end - 1]  # the last record's end is the run's end
    return np.concatenate([[start], ends + 1]).astype(np.int64)


def quoted_blocks(blocks: Iterator[bytes], delimiter: str, limit: int) -> Iterator[tuple[bytes, Scan]]:
    """Blocks of whole records (each block of whole lines, with the record a quoted value
    keeps open carried into the next), each with its scan. A record carried past ``limit``
    bytes ends: its quote counts as stray."""
    delim = delimiter.encode("utf-8")
    carry = b""
    pending: list[bytes] = []
    pending_bytes = 0
    for data in blocks:
        pending.append(data)
        pending_bytes += len(data)
        if pending_bytes < len(carry):
            continue  # a value is open: scan again once the text has doubled (linear in all)
        block = carry + b"".join(pending)
        pending, pending_bytes = [], 0
        found = scan(block, delim, final=len(block) > limit)
        carry = block[found.cut :]
        if found.cut:
            yield block[: found.cut], found
    block = carry + b"".join(pending)
    if block:
        yield block, scan(block, delim, final=True)
