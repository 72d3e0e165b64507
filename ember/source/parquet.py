"""Stream a Parquet file as record batches of ``read_rows`` rows (one row group in RAM at most).

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

from ember.source.base import RecordChunk, check_columns

__all__ = ["read_parquet"]


def read_parquet(path: str, columns: Sequence[str], *, read_rows: int = 65536) -> Iterator[RecordChunk]:
    """Yield ``columns`` of ``path`` in file order; ``first_row`` is 1-based."""
    with pq.ParquetFile(path) as pf:
        check_columns(path, pf.schema_arrow.names, columns)
        row = 1
        for batch in pf.iter_batches(batch_size=read_rows, columns=list(columns), use_threads=True):
            if batch.num_rows:
                yield RecordChunk(batch, path, row)
                row += batch.num_rows
