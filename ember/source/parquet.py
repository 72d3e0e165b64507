"""Stream a Parquet file as record batches of ``read_rows`` rows (one row group in RAM at most).

Page checksums (CRC-32, written by ember's own writers) are verified when a file has them, so
a flipped bit on disk is an error, not a silently different value. A file that cannot be
decoded (truncated, garbage, checksum mismatch) raises DataError naming the file, the row
group, its rows and its byte offset. A URI (``s3://...``) is read by ranged requests (the
footer, then each row group's column chunks, coalesced), never downloaded whole.

Example:
    >>> import tempfile, os, pyarrow as pa, pyarrow.parquet as pq
    >>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
    >>> pq.write_table(pa.table({"y": [1, 0, 1], "a": ["x", "y", "z"]}), path)
    >>> [(c.first_row, c.batch.num_rows) for c in read_parquet(path, ["a"], read_rows=2)]
    [(1, 2), (3, 1)]
"""

from __future__ import annotations

from typing import Iterator, Sequence

import pyarrow.parquet as pq

from ember.source import storage
from ember.source.base import RecordChunk, check_columns, damaged_file, is_damage, read_failed
from ember.source.storage import StorageOptions

__all__ = ["read_parquet"]


def read_parquet(path: str, columns: Sequence[str], *, read_rows: int = 65536,
                 storage_options: StorageOptions | None = None) -> Iterator[RecordChunk]:
    """Yield ``columns`` of ``path`` in file order, row group by row group; ``first_row`` is
    1-based. ``storage_options``: how to reach ``path`` when it is a URI."""
    with storage.opened(path, storage_options) as source:
        try:
            # remote: a row group's column chunks in a few coalesced ranged reads, not one per page
            pf = pq.ParquetFile(source, page_checksum_verification=True, pre_buffer=storage.is_remote(path))
        except Exception as e:
            failed = read_failed(path, " (footer)", e, storage_options)
            if failed is not None:
                raise failed from e
            raise
        with pf:
            check_columns(path, pf.schema_arrow.names, columns)
            meta = pf.metadata
            row = 1
            for g in range(pf.num_row_groups):
                start, group_rows = row, meta.row_group(g).num_rows
                batches = pf.iter_batches(batch_size=read_rows, row_groups=[g], columns=list(columns), use_threads=True)
                try:
                    yield from _group(path, meta, g, start, group_rows, batches, storage_options)
                finally:  # no pyarrow reader outlives this one (an error downstream, the reader abandoned)
                    batches.close()
                row += group_rows


def _group(path: str, meta: pq.FileMetaData, g: int, start: int, group_rows: int, batches: Iterator,
           options: StorageOptions | None = None) -> Iterator[RecordChunk]:
    """The chunks of row group ``g`` (rows ``start`` on); damage raises DataError naming it."""
    row = start
    while True:
        try:
            batch = next(batches, None)
        except Exception as e:
            if storage.is_remote(path) and (storage.is_storage_error(e) or isinstance(e, FileNotFoundError)):
                raise storage.storage_error(path, f"reading row group {g}", e, options) from e
            if not is_damage(e):
                raise
            where = (f" row group {g} (rows {start}-{start + group_rows - 1}, "
                     f"byte offset {_row_group_offset(meta, g)})")
            raise damaged_file(path, where, e) from e
        if batch is None:
            break
        if batch.num_rows:
            yield RecordChunk(batch, path, row)
            row += batch.num_rows
    if row - start != group_rows:  # pages that decode but hold fewer rows than the footer lists
        raise damaged_file(path, f" row group {g} (rows {start}-{start + group_rows - 1})",
                           ValueError(f"its pages hold {row - start} rows, the footer lists {group_rows}"))


def _row_group_offset(meta: pq.FileMetaData, group: int) -> int:
    """Byte offset in the file where row group ``group``'s first page starts."""
    rg = meta.row_group(group)
    offsets = []
    for j in range(rg.num_columns):
        col = rg.column(j)
        offsets.append(col.data_page_offset)
        if col.has_dictionary_page:
            offsets.append(col.dictionary_page_offset)
    return min(offsets) if offsets else 0

