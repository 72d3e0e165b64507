"""Stream CSV/TSV files in blocks of whole lines, parsed by pyarrow; exact row numbers.

The file is read ``block_bytes`` at a time and cut at the last newline, so memory stays at a
few blocks however large the file, and the line number of every row is known (pyarrow's own
streaming reader does not report line numbers of bad lines). Consequence: quoted values may
not contain newlines. Every column is read as a string, an empty field as ``""`` (a CSV has no
null): the featurizer decides what it means (a missing number; for a categorical column the
category ``""`` unless the schema lists it in ``missing_values``) and converts numbers itself
so it can name the row and value that fail. Compressed files
(``.gz``, ``.bz2``, ...) are decompressed on the fly.

Example:
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "t.csv")
    >>> _ = open(path, "w").write("y,a\\n1,x\\n0,\\n")
    >>> [(c.first_row, c.batch.to_pydict()) for c in read_csv(path, ["y", "a"])]
    [(2, {'y': ['1', '0'], 'a': ['x', '']})]
"""

from __future__ import annotations

from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.csv as pacsv

from ember.source.bad_rows import BadRowReport, raise_bad_row
from ember.source.base import RecordChunk, check_columns

__all__ = ["read_csv"]

_FIELDS_REASON = "<row>: wrong number of fields"


def _line_blocks(path: str, block_bytes: int) -> Iterator[bytes]:
    """Blocks of whole lines (each ends with a newline, except maybe the file's last one)."""
    with pa.input_stream(path) as f:
        rest = b""
        while True:
            data = f.read(block_bytes)
            if not data:
                break
            data = rest + data
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                continue
            rest = data[cut + 1 :]
            yield data[: cut + 1]
        if rest.strip(b"\r\n"):
            yield rest


def _split_header(line: bytes, delimiter: str) -> list[str]:
    names = line.decode("utf-8").rstrip("\r\n").split(delimiter)
    return [n[1:-1] if len(n) >= 2 and n[0] == n[-1] == '"' else n for n in names]


def read_csv(
    path: str,
    columns: Sequence[str],
    *,
    delimiter: str = ",",
    header: bool = True,
    column_names: Sequence[str] | None = None,
    block_bytes: int = 8 << 20,
    report: BadRowReport | None = None,
) -> Iterator[RecordChunk]:
    """Yield ``columns`` of ``path`` as string record batches, one per block of lines.

    Lines with the wrong number of fields raise DataError (file and line named) or, when
    ``report.skip``, are dropped and counted under ``"<row>: wrong number of fields"``.
    """
    report = report or BadRowReport()
    blocks = _line_blocks(path, block_bytes)
    line_no = 1  # 1-based number of the next line to parse
    names = list(column_names) if column_names else None
    if header:
        first = next(blocks, b"")
        head, _, body = first.partition(b"\n")
        names = names or _split_header(head, delimiter)
        line_no = 2
        blocks = _chain(body, blocks)
    if names is None:
        raise ValueError("read_csv: header=False needs column_names")
    check_columns(path, names, columns)
    for block in blocks:
        n_lines = block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
        bad: list[str] = []

        def on_invalid(row: pacsv.InvalidRow) -> str:
            bad.append(row.text)
            return "skip"

        table = pacsv.read_csv(
            pa.py_buffer(block),
            read_options=pacsv.ReadOptions(column_names=names, block_size=1 << 20),
            parse_options=pacsv.ParseOptions(
                delimiter=delimiter, invalid_row_handler=on_invalid, ignore_empty_lines=False
            ),
            convert_options=pacsv.ConvertOptions(
                include_columns=list(columns),
                column_types={c: pa.string() for c in columns},
                strings_can_be_null=False,  # an empty field is the string "", never null
            ),
        )
        if bad and not report.skip:
            lines = block.split(b"\n")
            idx = next(i for i, ln in enumerate(lines) if ln.rstrip(b"\r").decode("utf-8", "replace") == bad[0])
            # Rows before the bad line are good: hand them over first, so an earlier bad value
            # in them is reported before this line.
            if idx:
                yield RecordChunk(_to_batch(table.slice(0, idx), columns), path, line_no)
            raise_bad_row(path, line_no + idx, "<row>", bad[0][:200], f"expected {len(names)} fields")
        report.add(_FIELDS_REASON, len(bad))
        if table.num_rows:
            yield RecordChunk(_to_batch(table, columns), path, line_no)
        line_no += n_lines


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest


def _to_batch(table: pa.Table, columns: Sequence[str]) -> pa.RecordBatch:
    return table.select(list(columns)).combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([])
