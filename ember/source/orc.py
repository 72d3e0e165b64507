"""Stream an ORC file stripe by stripe, sliced into record batches of ``read_rows`` rows.

RAM holds one stripe of the selected columns (ORC writers default to 64 MB stripes). A file
that cannot be decoded (truncated, garbage) raises DataError naming the file and the stripe.
A URI (``s3://...``) is read by ranged requests (footer, then stripe by stripe).

Example:
    >>> import tempfile, os, pyarrow as pa, pyarrow.orc as orc
    >>> path = os.path.join(tempfile.mkdtemp(), "t.orc")
    >>> orc.write_table(pa.table({"y": [1, 0, 1], "a": ["x", "y", "z"]}), path)
    >>> [(c.first_row, c.batch.num_rows) for c in read_orc(path, ["a"], read_rows=2)]
    [(1, 2), (3, 1)]
"""

from __future__ import annotations

from typing import Iterator, Sequence

import pyarrow.orc as orc

from ember.source import storage
from ember.source.base import RecordChunk, check_columns, damaged_file, read_failed
from ember.source.storage import StorageOptions

__all__ = ["read_orc"]


def read_orc(path: str, columns: Sequence[str], *, read_rows: int = 65536,
             storage_options: StorageOptions | None = None) -> Iterator[RecordChunk]:
    """Yield ``columns`` of ``path`` in file order; ``first_row`` is 1-based. ``storage_options``:
    how to reach ``path`` when it is a URI."""
    with storage.opened(path, storage_options) as source:
        try:
            f = orc.ORCFile(source)
            names = f.schema.names
        except Exception as e:
            failed = read_failed(path, " (footer)", e, storage_options)
            if failed is not None:
                raise failed from e
            raise
        check_columns(path, names, columns)
        row = 1
        for i in range(f.nstripes):
            try:
                stripe = f.read_stripe(i, columns=list(columns))
            except Exception as e:
                failed = read_failed(path, f" stripe {i} (from row {row})", e, storage_options)
                if failed is not None:
                    raise failed from e
                raise
            for start in range(0, stripe.num_rows, read_rows):
                batch = stripe.slice(start, read_rows)
                yield RecordChunk(batch, path, row)
                row += batch.num_rows
        if row - 1 != f.nrows:  # stripes that decode but hold other than the rows the footer lists
            raise damaged_file(path, "", ValueError(f"its stripes hold {row - 1} rows, the footer lists {f.nrows}"))
