"""Write the synthetic generator's rows to CSV/TSV, Parquet or ORC, streamed chunk by chunk.

Example:
    >>> import tempfile, os, pyarrow.parquet as pq
    >>> path = os.path.join(tempfile.mkdtemp(), "s.parquet")
    >>> write_synthetic(path, "parquet", 10, SyntheticOptions(num_dense=1, num_sparse=2), chunk_rows=4) == [path]
    True
    >>> pq.read_metadata(path).num_rows
    10
"""

from __future__ import annotations

import os
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.orc as orc
import pyarrow.parquet as pq

from ember.errors import ConfigError
from ember.source.config import SyntheticOptions
from ember.source.synthetic import split_rows, synthetic_records

__all__ = ["write_synthetic", "MULTI_HOT_SEPARATOR"]

MULTI_HOT_SEPARATOR = "|"


def _for_csv(batch: pa.RecordBatch) -> pa.RecordBatch:
    """List columns become ``|``-joined strings (CSV has no lists)."""
    cols = []
    for col in batch.columns:
        if pa.types.is_list(col.type):
            col = pc.binary_join(col.cast(pa.list_(pa.string())), MULTI_HOT_SEPARATOR)
        cols.append(col)
    return pa.record_batch(cols, names=batch.schema.names)


def write_synthetic(
    path: str,
    format: Literal["csv", "tsv", "parquet", "orc"],
    rows: int | None,
    options: SyntheticOptions,
    split: Literal["train", "eval"] = "train",
    chunk_rows: int = 65536,
    header: bool = True,
    compression: str | None = None,
) -> list[str]:
    """Write rows ``[0, rows)`` of ``split`` (default: the split's configured size) to ``path``.

    Memory holds one chunk of ``chunk_rows`` rows. CSV/TSV get a header line (unless
    ``header=False``) and multi-hot features as ``|``-joined IDs, which the synthetic preset
    schema reads back. Parquet pages carry CRC-32 checksums, and the schema metadata
    ``ember.output: generate`` (what lets ``ember generate --overwrite`` replace the file, and
    nothing else). ``compression`` (CSV/TSV: gzip, bz2, zstd, lz4) compresses the text stream.
    Returns the files written.
    """
    if format not in ("csv", "tsv", "parquet", "orc"):
        raise ConfigError(f"write_synthetic: format must be csv, tsv, parquet or orc, got {format!r}")
    total = split_rows(options, split) if rows is None else rows
    if compression is not None and format not in ("csv", "tsv"):
        raise ConfigError(f"write_synthetic: compression applies to csv/tsv, not {format}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    writer = None
    sink = pa.CompressedOutputStream(path, compression) if compression is not None else path
    try:
        for start in range(0, total, chunk_rows):
            batch = synthetic_records(options, split, start, min(start + chunk_rows, total))
            if format in ("csv", "tsv"):
                batch = _for_csv(batch)
                if writer is None:
                    opts = pacsv.WriteOptions(include_header=header, delimiter="\t" if format == "tsv" else ",")
                    writer = pacsv.CSVWriter(sink, batch.schema, write_options=opts)
                writer.write_batch(batch)
            elif format == "parquet":
                # page checksums let every reader (ours verifies them) catch a flipped bit on disk
                schema = batch.schema.with_metadata({b"ember.output": b"generate"})  # see ember.outputs
                writer = writer or pq.ParquetWriter(path, schema, write_page_checksum=True)
                writer.write_batch(batch)
            else:
                writer = writer or orc.ORCWriter(path)
                writer.write(pa.Table.from_batches([batch]))
    finally:
        if writer is not None:
            writer.close()
        if not isinstance(sink, str):
            sink.close()
    return [path]
