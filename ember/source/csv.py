"""Stream CSV/TSV files in blocks of whole lines, parsed by pyarrow; exact row numbers.

The file is read ``block_bytes`` at a time and cut at the last newline, so memory stays at a
few blocks however large the file, and the line number of every row is known (pyarrow's own
streaming reader does not report line numbers of bad lines). By default quoted values may
not contain newlines; a quote that does not close on its line makes that line a bad row (it
would otherwise swallow the lines after it). With ``newlines_in_values`` they may (blocks are
then cut between records, see :mod:`ember.source.quoted`), and a row is numbered by the line
it starts on. A UTF-8 byte order mark at the start is dropped (it is no part of the first
name). A line may be of any length (a block grows to hold it). Every column is
read as a string, an empty field as ``""`` (a CSV has no null): the featurizer decides what it
means (a missing number; for a categorical column the category ``""`` unless the schema lists
it in ``missing_values``) and converts numbers itself so it can name the row and value that
fail.

A plain block (no quote, LF or CRLF line ends, every line its number of fields: what Criteo-like
exports are) is split by ember's native splitter (``_native.csv_split`` / ``csv_gather``: the
fields found, then copied into Arrow string columns): exactly what pyarrow's text read gives for
it, without its conversions (the featurizer parses counts natively). A column typed int64
(integer IDs, below) is read as IDs straight from the block instead (``_native.csv_ints``, the
featurizer's own reading of ID text: an empty field null), unless one of its fields is no ID:
then it stays text. Any other block is read by pyarrow as below (logged once per reason), the
reference the splitter is tested against.

Typed reads (``types``: the arrow type the reader's consumer turns a column into, e.g. int64
for integer IDs, :func:`ember.featurize.featurizer.read_types`; float64 columns are handled too):
a block is first read with pyarrow parsing those columns as numbers (an empty field null), which
the featurizer takes as it would have taken their text. That is only a faster way to the same
result, so a block takes the text path instead (the reference; every bad-row rule lives there)
whenever the two could differ: a value pyarrow cannot convert, a line with the wrong number of
fields, a quoted value holding a line end, an infinite number (a bad value, which an error
names by its text), or text the number parsers read more loosely than the featurizer
(``0x1f``, ``nan(1)``, 20 or more digits in a row: those columns of that block are read as
text; ``ember._native.csv_hazards``). Each such reason is logged once per process and counted
(:func:`typed_read_fallbacks`). With ``newlines_in_values`` every column is text.

Compressed files (``.gz``, ``.bz2``, ...) are decompressed on the fly. A URI
(``s3://...``) is read as a stream of ranged requests (:mod:`ember.source.storage`), never
downloaded whole first.

The text must be UTF-8: a line that is not is a bad row (``on_bad_rows``: an error naming file,
row, column and byte offset, or skipped and counted under ``"<row>: not valid UTF-8 text"``).

Example:
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "t.csv")
    >>> _ = open(path, "w").write("y,a\\n1,x\\n0,\\n")
    >>> [(c.first_row, c.batch.to_pydict()) for c in read_csv(path, ["y", "a"])]
    [(2, {'y': ['1', '0'], 'a': ['x', '']})]
"""

from __future__ import annotations

import codecs
import logging
import threading
from collections import Counter
from typing import Any, Callable, Generator, Iterator, Literal, Mapping, Sequence, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ember import _native
from ember.errors import DataError
from ember.source.bad_rows import BadRowReport, raise_bad_row
from ember.source import storage
from ember.source.base import RecordChunk, check_columns, check_unique, read_failed
from ember.source.quoted import UNCLOSED, Scan, quoted_blocks, record_starts, scan
from ember.source.storage import StorageOptions
from ember import once

__all__ = ["read_csv", "header_fields", "read_head", "BOM", "typed_read_fallbacks"]

log = logging.getLogger("ember")

_FIELDS_REASON = "<row>: wrong number of fields"
_UTF8_REASON = "<row>: not valid UTF-8 text"
_PARSE_BLOCK = 1 << 20  # pyarrow's parse unit; grown for a block holding a longer line
_CARRY_LIMIT = 64 << 20  # newlines_in_values: an open quoted value is carried this far, then it is stray
BOM = codecs.BOM_UTF8  # spreadsheet tools start UTF-8 CSV with it; it is not part of the first name

_fallbacks: Counter[str] = Counter()  # blocks (or some of their columns) read as text, not typed, per reason
_fallbacks_lock = threading.Lock()
_SPLIT = True  # plain blocks split natively (_native.csv_split); False: pyarrow reads every block (the reference)


def typed_read_fallbacks() -> dict[str, int]:
    """Blocks of this process's CSV reads that asked for typed columns and read (some of) them
    as text instead, per reason (see the module docstring); each reason is also logged once."""
    with _fallbacks_lock:
        return dict(_fallbacks)


def _fell_back(path: str, line_no: int, reason: str) -> None:
    with _fallbacks_lock:
        first = reason not in _fallbacks
        _fallbacks[reason] += 1
    if first:
        log.info("%s row %d: block read as text, not with typed columns (%s); the same result, slower. Logged "
                 "once per reason; ember.source.csv.typed_read_fallbacks() counts them", path, line_no, reason)


def _not_split(path: str, line_no: int, reason: str) -> None:
    if once.first("csv.not_split", reason):
        log.info("%s row %d: block parsed by pyarrow, not split by ember's native splitter (%s); the same result, "
                 "slower. Logged once per reason", path, line_no, reason)


def _pool_array(n: int, dtype: type) -> np.ndarray:
    """A writable numpy array of ``n`` items in Arrow's memory pool (which reuses freed memory:
    no fresh pages to fault in for every block, as a new ~1 MB malloc may get)."""
    dt = np.dtype(dtype)
    return np.frombuffer(pa.allocate_buffer(n * dt.itemsize), dt)


def _line_blocks(path: str, block_bytes: int, consumed: list[int] | None = None,
                 storage_options: StorageOptions | None = None, reuse: bool = False) -> Iterator[bytearray]:
    """Blocks of whole lines, each ending with a newline (one is added to a last line without);
    ``consumed[0]`` follows the bytes of the file as stored (compressed or not) read so far.

    Each block is one bytearray the file is read into after the line carried over from the
    block before, then cut after its last newline in place: one buffer and one pass over a
    block's bytes (reading into bytes, prepending the carried line and cutting copied the block
    three times, each into fresh pages: ~1.5 ms and ~450 page faults per 2.3 MB block).
    ``reuse``: the caller is done with a block when it asks for the next (it keeps no part of
    it but copies), so the next is read into the same bytearray unless a view of it is still
    held (``_reuse``): a new bytearray is zero-filled first (~0.4 ms per 2.3 MB block)."""
    codec = _codec(path)
    raw = storage.open_file(path, storage_options) if storage.is_remote(path) else pa.OSFile(path)
    # an object: read ahead in ranged requests of a few MiB (raw.tell(): bytes fetched so far)
    src = pa.BufferedInputStream(raw, storage.STREAM_BUFFER) if storage.is_remote(path) else raw
    with raw, src, (pa.CompressedInputStream(src, codec) if codec else src) as f:
        rest = b""
        read = 0
        spare: bytearray | None = None
        while True:
            size = len(rest) + block_bytes
            data = spare if spare is not None and _reuse(spare, size) else bytearray(size)
            spare = None
            data[: len(rest)] = rest
            try:
                got = f.readinto(memoryview(data)[len(rest) :])
            except Exception as e:  # e.g. a truncated .gz
                failed = read_failed(path, f" (after byte {read} of its text)", e, storage_options)
                if failed is not None:
                    raise failed from e
                raise
            if consumed is not None:
                consumed[0] = raw.tell()
            if not got:
                break
            read += got
            end = len(rest) + got
            cut = data.rfind(b"\n", 0, end)
            if cut < 0:
                rest = bytes(data[:end])
                continue
            rest = bytes(data[cut + 1 : end])
            del data[cut + 1 :]
            yield data
            spare = data if reuse else None
        if rest.strip(b"\r\n"):
            # the last line ends like every other, so it parses like one (an unclosed quote in
            # it then takes that newline and shows, instead of passing at the end of the data)
            yield rest + b"\n"


def _runs(items: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending ``items`` as runs [a, b) of consecutive integers: [0, 1, 2, 5] -> [(0, 3), (5, 6)]."""
    out: list[tuple[int, int]] = []
    for i in items:
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def _reuse(buf: bytearray, size: int) -> bool:
    """Resize ``buf`` to ``size`` (>= 1) bytes in place for a new block (its memory kept, its
    bytes not: only those past its length are zero-filled); False, ``buf`` untouched, while
    something holds a view of it (a numpy array, an Arrow buffer, a memoryview), which Python
    tells by refusing to resize it."""
    try:
        if len(buf) >= size:
            del buf[size - 1 :]  # (always a resize: the refusal is checked even at the same size)
        buf.extend(bytes(size - len(buf)))
    except BufferError:
        return False
    return True


def _codec(path: str) -> str | None:
    """The compression its extension names (as ``pa.input_stream`` detects it), or None."""
    try:
        return pa.Codec.detect(path).name
    except (ValueError, TypeError):
        return None


def read_head(path: str, size: int, storage_options: StorageOptions | None = None) -> bytes:
    """The first ``size`` bytes of ``path``'s text (decompressed by its extension; local or a
    URI), for checks that look at the header and a few lines only."""
    if not storage.is_remote(path):
        with pa.input_stream(path) as f:
            return f.read(size)
    codec = _codec(path)
    with storage.open_stream(path, storage_options) as raw, \
            (pa.CompressedInputStream(raw, codec) if codec else raw) as f:
        return f.read(size)


_RENAME = "rename the copies in the file, or set csv.column_names to name every column once"


def header_fields(line: bytes, delimiter: str, errors: str = "strict") -> list[str] | None:
    """The names in a file's first line (a UTF-8 byte order mark and quotes removed), or None
    when it is not UTF-8 text (``errors="strict"``). ``preflight`` reads headers with it too."""
    try:
        text = line.removeprefix(BOM).decode("utf-8", errors)
    except UnicodeDecodeError:
        return None
    names = text.rstrip("\r\n").split(delimiter)
    return [n[1:-1] if len(n) >= 2 and n[0] == n[-1] == '"' else n for n in names]


def read_csv(
    path: str,
    columns: Sequence[str],
    *,
    delimiter: str = ",",
    header: bool | Literal["auto"] = True,
    column_names: Sequence[str] | None = None,
    block_bytes: int = 8 << 20,
    report: BadRowReport | None = None,
    consumed: list[int] | None = None,
    newlines_in_values: bool = False,
    storage_options: StorageOptions | None = None,
    types: Mapping[str, pa.DataType] | None = None,
) -> Iterator[RecordChunk]:
    """Yield ``columns`` of ``path`` as string record batches, one per block of lines.

    ``header``: True, the first line names the columns (``column_names``, when given, replace
    those names); False, there is none (``column_names`` required); ``"auto"``, the first line
    is a header exactly when its fields equal ``column_names`` (required), so files with and
    without a header line can be mixed. Lines with the wrong number of fields or that are not
    UTF-8 raise DataError (file and line named) or, when ``report.skip``, are dropped and
    counted under ``"<row>: wrong number of fields"`` / ``"<row>: not valid UTF-8 text"``.
    ``consumed``: when given, ``consumed[0]`` is kept at the bytes of the file as stored
    (compressed bytes for a compressed file) read so far (progress estimates).
    ``newlines_in_values``: a quoted value may hold line ends (:mod:`ember.source.quoted`); a
    row is then numbered by the line it starts on (``RecordChunk.lines``), and a quote that
    opens such a value but is never closed makes its line a bad row (``"<row>: quoted value
    not closed"``). ``storage_options``: how to reach ``path`` when it is a URI.
    ``types``: columns to read as these arrow types where that gives what their text gives (see
    the module docstring; the others, and all with ``newlines_in_values``, are strings; a block
    the native splitter takes has only its int64 columns typed).
    """
    report = report or BadRowReport()
    names = list(column_names) if column_names else None
    if header not in (True, False, "auto"):
        raise ValueError(f"read_csv: header must be true, false or 'auto', got {header!r}")
    if header is not True and names is None:
        raise ValueError(f"read_csv: header={header!r} needs column_names")
    # (blocks reused: each block's chunks are made, from copies of its bytes, before the next
    # is read; the quoted path carries parts of blocks, so it gets new ones)
    blocks = _line_blocks(path, block_bytes, consumed, storage_options, reuse=not newlines_in_values)
    first = next(blocks, b"")
    bom = len(BOM) if first.startswith(BOM) else 0
    head, newline, body = first[bom:].partition(b"\n")
    found = header_fields(head, delimiter)
    line_no, offset, first = 1, bom, first[bom:]  # 1-based number and byte offset of the next line to parse
    if header is True and not head.strip(b"\r") and not body.strip():
        raise DataError(f"{path}: the file is empty (csv.header is true: a header line is expected); "
                        "leave it out of the files read, or write its header line")
    if header is True or (header == "auto" and found == names):
        if found is None:
            raise DataError(f"{path} row 1 (the header): not valid UTF-8 text; re-encode the file as UTF-8 "
                            "(e.g. iconv -f latin1 -t utf-8), or set csv.header: false and csv.column_names")
        if not names:
            check_unique(path, found, columns, "the header (row 1)", _RENAME)
        names = names or found
        line_no, offset, first = 2, bom + len(head) + len(newline), body
    assert names is not None
    check_unique(path, names, columns, "csv.column_names", _RENAME)
    check_columns(path, names, columns)
    parser = _BlockParser(path, names, columns, delimiter, report, {} if newlines_in_values else types)
    if newlines_in_values:
        for block, found in quoted_blocks(_chain(first, blocks), delimiter, max(block_bytes, _CARRY_LIMIT)):
            line_no += yield from parser.records(block, found, line_no, offset)
            offset += len(block)
        return
    for block in _chain(first, blocks):
        line_no += yield from parser.chunks(block, line_no, offset)
        offset += len(block)


class _BlockParser:
    """Parses blocks of whole lines of one file into record chunks, applying the bad-row policy."""

    def __init__(self, path: str, names: list[str], columns: Sequence[str], delimiter: str,
                 report: BadRowReport, types: Mapping[str, pa.DataType] | None = None) -> None:
        self.path, self.names, self.columns = path, names, list(columns)
        self.delimiter, self.report = delimiter, report
        self.types = {c: t for c, t in (types or {}).items() if c in self.columns}
        self._hinted = False  # the newlines_in_values hint was logged for this file
        # the native splitter: each field's slot (-1: not read), a one-byte delimiter. Text columns
        # take the first slots, int64 ones (integer IDs, ``read_types``) the last: read as IDs
        # straight from the block (``_native.csv_ints``), their text never copied out
        ints = [c for c in self.columns if self.types.get(c) == pa.int64()]
        self._order = [c for c in self.columns if c not in ints] + ints
        self._n_text = len(self.columns) - len(ints)
        slot = {c: i for i, c in enumerate(self._order)}
        self._slots = np.array([slot.get(c, -1) for c in names], np.int64)
        delim = delimiter.encode("utf-8")
        self._delim = delim[0] if len(delim) == 1 and delim not in (b"\n", b"\r", b'"') else None

    def chunks(self, block: bytes, line_no: int, offset: int) -> Generator[RecordChunk, None, int]:
        """Chunks of ``block`` (line ``line_no``, byte ``offset`` of the file): each run of
        UTF-8 lines is parsed on its own, so every chunk's ``first_row`` stays exact. Returns
        the block's line count (counted once, while parsing)."""
        facts = _native.csv_bytes(block)  # its lines and bytes, in one pass (the parts' own when it is not UTF-8)
        if not facts[1] & _native.CSV_NOT_ASCII:  # ASCII is UTF-8: one part, the whole block
            return (yield from self._parse(block, line_no, facts))
        pos, first_line = 0, line_no
        for start, end, bad_at in _non_utf8_lines(block):
            line_no += yield from self._parse(block[pos:start], line_no)
            if not self.report.skip:
                self._raise_utf8(block[start:end], line_no, bad_at - start, offset + bad_at)
            self.report.add(_UTF8_REASON)
            pos, line_no = end + 1, line_no + 1
        line_no += yield from self._parse(block[pos:] if pos else block, line_no)  # a bytearray's [0:] copies
        return line_no - first_line

    def records(self, block: bytes, found: Scan, line_no: int, offset: int) -> Generator[RecordChunk, None, int]:
        """Chunks of ``block``, whole records whose quoted values may hold line ends, scanned
        as ``found`` (line ``line_no``, byte ``offset`` of the file). Each row is numbered by
        the line it starts on. Returns the block's line count."""
        newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == ord("\n"))

        def line_of(pos: np.ndarray | int) -> np.ndarray:
            return line_no + np.searchsorted(newlines, pos)

        for kind, start, end in found.units:
            if kind == "stray":
                if not self.report.skip:
                    text = block[start:end].rstrip(b"\r\n").decode("utf-8", "replace")
                    raise_bad_row(self.path, int(line_of(start)), "<row>", text[:200],
                                  "a quoted value that runs past its line end is not closed (a closing quote "
                                  "followed by the delimiter or the line end); close it, or remove the stray '\"'")
                self.report.add(UNCLOSED)
                continue
            starts = record_starts(block, start, end, found.spans)
            pos = start
            for bad_start, bad_end, bad_at in _non_utf8_records(block, start, end, starts):
                yield from self._parse_records(block, pos, bad_start, starts, line_of)
                if not self.report.skip:
                    self._raise_utf8(block[bad_start:bad_end], int(line_of(bad_start)), bad_at - bad_start,
                                     offset + bad_at)
                self.report.add(_UTF8_REASON)
                pos = bad_end
            yield from self._parse_records(block, pos, end, starts, line_of)
        return len(newlines)

    def _parse_records(self, block: bytes, start: int, end: int, all_starts: np.ndarray,
                       line_of: Callable[[np.ndarray], np.ndarray]) -> Iterator[RecordChunk]:
        """Chunks of the whole UTF-8 records in ``block[start:end]`` (``all_starts``: record
        starts of the run holding them), each row with the line it starts on."""
        if start >= end:
            return
        starts = all_starts[(all_starts >= start) & (all_starts < end)]
        lengths = np.diff(np.append(starts, end))
        table, bad = self._read(block[start:end], newlines=True, longest=int(lengths.max()))
        numbers = [n for n, _ in bad]
        if table.num_rows + len(bad) != len(starts) or any(n is None for n in numbers):  # pyarrow's records differ
            table, bad = self._read_each_record(block, starts, end)
            numbers = [n for n, _ in bad]
        lines = line_of(starts)
        keep = np.ones(len(starts), dtype=bool)
        keep[np.asarray(numbers, dtype=np.int64) - 1] = False
        if bad and not self.report.skip:
            k = numbers[0] - 1  # rows before the bad one are good: they come first
            if k:
                yield RecordChunk(_to_batch(table.slice(0, k), self.columns), self.path, int(lines[0]), lines[:k])
            raise_bad_row(self.path, int(lines[k]), "<row>", bad[0][1][:200], f"expected {len(self.names)} fields")
        self.report.add(_FIELDS_REASON, len(bad))
        if table.num_rows:
            good = lines[keep]
            yield RecordChunk(_to_batch(table, self.columns), self.path, int(good[0]), good)

    def _read_each_record(self, block: bytes, starts: np.ndarray, end: int) -> tuple[pa.Table, list[tuple[int, str]]]:
        """Each record parsed on its own (when pyarrow's records are not the scan's): the
        good rows in order, and (1-based number, text) of each record that is not one row."""
        parts: list[pa.Table] = []
        bad: list[tuple[int, str]] = []
        for i, (a, b) in enumerate(zip(starts, np.append(starts[1:], end))):
            record = block[a:b]
            table, wrong = self._read(record, newlines=True, longest=len(record))
            if wrong or table.num_rows != 1:
                bad.append((i + 1, record.rstrip(b"\r\n").decode("utf-8", "replace")))
            else:
                parts.append(table)
        empty = pa.table({c: pa.array([], pa.string()) for c in self.columns})
        return (pa.concat_tables(parts) if parts else empty), bad

    def _raise_utf8(self, line: bytes, line_no: int, at: int, file_offset: int) -> None:
        sep = self.delimiter.encode("utf-8")
        field = line[:at].count(sep)
        fields = line.rstrip(b"\r").split(sep)
        column = self.names[field] if field < len(self.names) and len(fields) == len(self.names) else "<row>"
        value = fields[field] if column != "<row>" else line
        raise_bad_row(self.path, line_no, column, value[:200],
                      f"not valid UTF-8 text (byte offset {file_offset}; re-encode the file as UTF-8, "
                      "e.g. iconv -f latin1 -t utf-8)")

    def _parse(self, lines: bytes, line_no: int, facts: tuple[int, int] | None = None) -> Generator[RecordChunk, None, int]:
        """Record chunks of whole UTF-8 ``lines`` (line ``line_no`` of the file first); returns
        their line count. ``facts``: ``_native.csv_bytes(lines)`` when known."""
        if not lines:
            return 0
        newlines, flags = _native.csv_bytes(lines) if facts is None else facts
        n_lines = newlines + (0 if lines.endswith(b"\n") else 1)
        split = self._split(lines, line_no, n_lines, flags)
        if split is not None:
            yield RecordChunk(split, self.path, line_no)
            return n_lines
        if self.types:
            typed = self._read_typed(lines, line_no, n_lines)
            if typed is not None:
                yield RecordChunk(_to_batch(typed, self.columns), self.path, line_no)
                return n_lines
        table, bad = self._read(lines)
        first = None  # (index in ``lines``, text) of the first bad line, when needed
        if table.num_rows + len(bad) == n_lines and bad and not self.report.skip:
            first = _first_bad_line(lines, bad[0])
        merged = table.num_rows + len(bad) != n_lines or _may_span_lines(lines, table, bad)
        if merged or (bad and not self.report.skip and first is None):
            # A quoted value ran past its line end (a stray '"' swallows the lines after it), or
            # a lone CR split a line: pyarrow's rows are not our lines. Parse line by line, so a
            # row is a line again and nothing is merged away uncounted.
            table, bad_at = self._read_each_line(lines)
            bad = [text for _, text in bad_at]
            first = bad_at[0] if bad_at else None
            if bad_at and self.report.skip:
                self._hint_multi_line_values(lines, line_no)
        if bad and not self.report.skip:
            assert first is not None
            idx, text = first
            # Rows before the bad line are good: hand them over first, so an earlier bad value
            # in them is reported before this line.
            if idx:
                yield RecordChunk(_to_batch(table.slice(0, idx), self.columns), self.path, line_no)
            hint = ("; a quoted value must end on its own line (quotes may not span lines; set "
                    "csv.newlines_in_values: true if values hold line ends)" if '"' in text else "")
            raise_bad_row(self.path, line_no + idx, "<row>", text[:200], f"expected {len(self.names)} fields{hint}")
        self.report.add(_FIELDS_REASON, len(bad))
        if table.num_rows:
            yield RecordChunk(_to_batch(table, self.columns), self.path, line_no)
        return n_lines

    def _split(self, lines: bytes, line_no: int, n_lines: int, flags: int) -> pa.RecordBatch | None:
        """``lines`` split by ``_native.csv_split`` into string columns (each empty field ``""``),
        what pyarrow's text read gives for them, when the block is plain: no quote, no CR but in a
        CRLF line end, and every line ``len(names)`` fields (``flags``: ``_native.csv_bytes``' of
        ``lines``). Else None (logged once per reason): pyarrow reads it, typed where asked, and
        the bad-row rules apply. One pass to split, one to copy the text fields out; columns typed int64
        (integer IDs) are read as IDs from the block instead, as the featurizer reads them from
        text (``_native.csv_ints``; a column with a field that is no ID stays text, for the
        featurizer to judge). Numbers stay text (``parse_floats``' native path parses them)."""
        if not _SPLIT or not self.columns or not lines.endswith(b"\n"):  # (every block ends with one)
            return None
        if self._delim is None:
            _not_split(self.path, line_no, f"the delimiter {self.delimiter!r} is not one byte other than a quote or a line end")
            return None
        if flags & _native.CSV_QUOTE:  # (csv_bytes')
            _not_split(self.path, line_no, "the block holds a quote")
            return None
        if len(lines) >= 2**31 - 1:  # its fields' offsets are int32
            _not_split(self.path, line_no, "the block is 2 GiB or more")
            return None
        k, n = len(self.columns), n_lines
        starts, offsets = _pool_array(k * n, np.int32), _pool_array(k * (n + 1), np.int32).reshape(k, n + 1)
        crlf = bool(flags & _native.CSV_CR)  # CRLF line ends split too; a lone CR (a line end to pyarrow) does not
        if _native.csv_split(lines, self._delim, len(self.names), self._slots, n, starts, offsets, crlf) < 0:
            _not_split(self.path, line_no, "a line holds another number of fields" + (", or a CR not before its LF" if crlf else ""))
            return None
        arrays: dict[str, pa.Array] = {}
        if self._n_text < k:  # integer ID columns: int64, unless a field is no ID (then its text)
            t = self._n_text
            values, valid, nulls = _native.csv_ints(lines, starts[t * n :], offsets[t:], n)
            for j, c in enumerate(self._order[t:]):
                if nulls[j] >= 0:
                    arrays[c] = pa.Array.from_buffers(pa.int64(), n, [pa.py_buffer(valid[j]) if nulls[j] else None,
                                                                     pa.py_buffer(values[j])], null_count=int(nulls[j]))
        text = [s for s in range(k) if self._order[s] not in arrays]
        for a, b in _runs(text):  # the text columns' fields copied out, a run of slots a call
            data = [pa.allocate_buffer(int(offsets[s, n])) for s in range(a, b)]
            _native.csv_gather(lines, starts[a * n : b * n], offsets[a:b], n, data)
            for s, buf in zip(range(a, b), data):
                arrays[self._order[s]] = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets[s]), buf])
        return pa.RecordBatch.from_arrays([arrays[c] for c in self.columns], names=self.columns)

    def _read_typed(self, lines: bytes, line_no: int, n_lines: int) -> pa.Table | None:
        """``lines`` read with the typed columns, or None (counted and logged) when the text path
        must read them: a value of a typed column does not convert, or the block is not one good
        row per line. Columns whose text the number parsers would read more loosely than the
        featurizer (``_native.csv_hazards``) are read as text in this block."""
        hazards = _native.csv_hazards(lines)
        types = self.types
        if hazards:
            loose_int = hazards & (_native.CSV_HEX | _native.CSV_LONG_DIGITS)
            types = {c: t for c, t in types.items() if not (pa.types.is_integer(t) and loose_int)
                     and not (pa.types.is_floating(t) and hazards & _native.CSV_PAREN)}
            if len(types) < len(self.types):
                _fell_back(self.path, line_no, "integer columns: the block holds an 'x' or 20+ digits in a row"
                           if loose_int else "number columns: the block holds a '('")
            if not types:
                return None
        try:
            table, bad = self._read(lines, types=types)
        except pa.ArrowInvalid:  # a value that is no number of its type: the featurizer names it
            _fell_back(self.path, line_no, "a value does not convert to its column's type")
            return None
        if bad or table.num_rows != n_lines or _may_span_lines(lines, table, bad):
            _fell_back(self.path, line_no, "a line is not one row of the expected fields")
            return None
        if any(pa.types.is_floating(t) and pc.any(pc.is_inf(table.column(c))).as_py() for c, t in types.items()):
            # a bad number (the featurizer's error quotes the value: as the text it was)
            _fell_back(self.path, line_no, "a number column holds an infinite value")
            return None
        return table

    def _hint_multi_line_values(self, lines: bytes, line_no: int) -> None:
        """Log once per file when lines skipped as bad hold quoted values that span lines the
        way CSV writers write them (a spreadsheet export?): ``csv.newlines_in_values`` reads them."""
        if self._hinted:
            return
        found = scan(lines, self.delimiter.encode("utf-8"), final=True)
        if found.spans:
            self._hinted = True
            at = line_no + lines.count(b"\n", 0, found.spans[0][0])
            log.warning("%s row %d: a quoted value spans lines; with csv.newlines_in_values: false (the default) "
                        "its lines are skipped as bad rows. If the file's values hold line breaks (e.g. a "
                        "spreadsheet export), set csv.newlines_in_values: true", self.path, at)

    def _read_each_line(self, lines: bytes) -> tuple[pa.Table, list[tuple[int, str]]]:
        """Each line parsed on its own (slow; only for blocks whose quotes span lines): the good
        rows in order, and (index, text) of each line that is not exactly one row."""
        parts: list[pa.Table] = []
        bad: list[tuple[int, str]] = []
        split = lines.split(b"\n")
        if lines.endswith(b"\n"):
            split.pop()
        for i, line in enumerate(split):
            table, wrong = self._read(line + b"\n")
            if wrong or table.num_rows != 1 or _spans_lines(table):  # e.g. '1,"x' takes its own newline
                bad.append((i, line.rstrip(b"\r").decode("utf-8")))
            else:
                parts.append(table)
        empty = pa.table({c: pa.array([], pa.string()) for c in self.columns})
        table = pa.concat_tables(parts) if parts else empty
        return table, bad

    @overload
    def _read(self, lines: bytes, *, types: Mapping[str, pa.DataType] = ...) -> tuple[pa.Table, list[str]]: ...

    @overload
    def _read(self, lines: bytes, newlines: Literal[True], longest: int) -> tuple[pa.Table, list[tuple[int, str]]]: ...

    def _read(self, lines: bytes, newlines: bool = False, longest: int = 0,
              types: Mapping[str, pa.DataType] | None = None) -> tuple[pa.Table, list[Any]]:
        """Parse whole lines with pyarrow; returns the table and the text of wrong-width lines.
        ``newlines``: quoted values may hold line ends (records up to ``longest`` bytes); each
        wrong-width record comes as (its 1-based number, text). ``types``: columns read as these
        types (an empty field null; ArrowInvalid for a value that does not convert), the others
        as strings."""
        column_types = {c: (types or {}).get(c, pa.string()) for c in self.columns}
        block_size = max(_PARSE_BLOCK, longest + 2)
        while True:
            bad: list[Any] = []

            def on_invalid(row: pacsv.InvalidRow) -> str:
                bad.append((row.number, row.text) if newlines else row.text)
                return "skip"

            try:
                table = pacsv.read_csv(
                    pa.py_buffer(lines),
                    # one thread when records are numbered: pyarrow numbers invalid rows only then
                    read_options=pacsv.ReadOptions(column_names=self.names, block_size=block_size,
                                                   use_threads=not newlines),
                    parse_options=pacsv.ParseOptions(
                        delimiter=self.delimiter, invalid_row_handler=on_invalid, ignore_empty_lines=False,
                        newlines_in_values=newlines,
                    ),
                    convert_options=pacsv.ConvertOptions(
                        include_columns=self.columns,
                        column_types=column_types,
                        null_values=[""],  # a typed column's empty field; "NA", "nan" are the featurizer's
                        strings_can_be_null=False,  # an empty field is the string "", never null
                    ),
                )
                return table, bad
            except pa.ArrowInvalid as e:
                # A line longer than pyarrow's block "straddles" blocks: parse again with blocks
                # that hold the longest line (only blocks holding such a line pay for it).
                longest = _longest_line(lines)
                if "straddl" not in str(e) or block_size > longest:
                    raise
                block_size = longest + 2


def _may_span_lines(lines: bytes, table: pa.Table, bad: list[str]) -> bool:
    """Whether a row of ``table`` holds a line end although the row count matched the lines.

    Only a quoted value can hold one. A value spanning k line ends makes k fewer rows than
    lines (caught by the count), so with the counts equal only the last row can (an unclosed
    quote that took the block's final newline), unless a lone CR (which pyarrow takes as a line
    end) made up for it: then every row is checked. Blocks without a quote cost one scan.
    """
    if b'"' not in lines:
        return False
    if any("\n" in text for text in bad):
        return True
    lone_cr = lines.count(b"\r") != lines.count(b"\r\n")
    return _spans_lines(table if lone_cr else table.slice(max(table.num_rows - 1, 0)))


def _spans_lines(table: pa.Table) -> bool:
    """Whether a value holds a line end: a quoted value that was not closed on its line."""
    return any(pc.any(pc.match_substring(col, "\n")).as_py() for col in table.columns
               if len(col) and pa.types.is_string(col.type))  # a typed column holds numbers


def _first_bad_line(lines: bytes, text: str) -> tuple[int, str] | None:
    """Index and text of the first line of ``lines`` whose text is ``text`` (as pyarrow reports
    an invalid row: without its line end), or None when no line is (rows merged across lines)."""
    for i, line in enumerate(lines.split(b"\n")):
        if line.rstrip(b"\r").decode("utf-8") == text:
            return i, text
    return None


def _longest_line(lines: bytes) -> int:
    ends = np.flatnonzero(np.frombuffer(lines, dtype=np.uint8) == ord("\n"))
    bounds = np.concatenate([[-1], ends, [len(lines)]])
    return int(np.diff(bounds).max())


def _non_utf8_lines(block: bytes) -> Iterator[tuple[int, int, int]]:
    """(line start, line end (its newline or the block's end), first bad byte) of each line
    of ``block`` that is not UTF-8, in order. The caller has found a byte >= 0x80 in it
    (``_native.csv_bytes``; an ASCII block is UTF-8 and needs no decode)."""
    view = memoryview(block)
    pos = 0
    while pos < len(block):
        try:
            codecs.utf_8_decode(view[pos:], "strict", True)
            return
        except UnicodeDecodeError as e:
            bad_at = pos + e.start
        start = block.rfind(b"\n", 0, bad_at) + 1
        end = block.find(b"\n", bad_at)
        end = len(block) if end < 0 else end
        yield start, end, bad_at
        pos = end + 1


def _non_utf8_records(block: bytes, start: int, end: int, starts: np.ndarray) -> Iterator[tuple[int, int, int]]:
    """(record start, record end, first bad byte) of each record of ``block[start:end]``
    (``starts``: record starts) that is not UTF-8, in order."""
    view = memoryview(block)
    pos = start
    while pos < end:
        try:
            codecs.utf_8_decode(view[pos:end], "strict", True)
            return
        except UnicodeDecodeError as e:
            bad_at = pos + e.start
        i = int(np.searchsorted(starts, bad_at, side="right")) - 1
        rec_end = int(starts[i + 1]) if i + 1 < len(starts) else end
        yield int(starts[i]), rec_end, bad_at
        pos = rec_end


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest


def _to_batch(table: pa.Table, columns: Sequence[str]) -> pa.RecordBatch:
    return table.select(list(columns)).combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([])
