"""Raw records in: CSV/TSV, Parquet, ORC readers, SQL queries through ADBC, Iceberg tables through
pyiceberg (streamed arrow record batches) and the built-in synthetic generator, each behind one
protocol (``ember.source.protocol``: units of work, opened as record batches from a position) and
one registry by ``data.format``. Nothing here knows about features; see ``ember.featurize``."""

from ember.source.bad_rows import BadRowReport
from ember.source.base import RecordChunk
from ember.source.config import CsvOptions, DataConfig, SyntheticOptions
from ember.source.csv import read_csv
from ember.source.files import expand_paths
from ember.source.orc import read_orc
from ember.source.parquet import read_parquet
from ember.source.protocol import RowCount, Source, Unit, register_source, source_for
from ember.source.sql import SqlOptions, sql_chunks
from ember.source.synthetic import synthetic_records, synthetic_score
from ember.source.writer import write_synthetic

__all__ = [
    "BadRowReport",
    "RecordChunk",
    "CsvOptions",
    "DataConfig",
    "SyntheticOptions",
    "read_csv",
    "read_parquet",
    "read_orc",
    "RowCount",
    "Source",
    "Unit",
    "register_source",
    "source_for",
    "SqlOptions",
    "sql_chunks",
    "expand_paths",
    "synthetic_records",
    "synthetic_score",
    "write_synthetic",
]
