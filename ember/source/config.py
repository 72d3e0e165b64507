"""DataConfig: where the rows come from and how they are batched, shuffled and checked.

Example:
    >>> cfg = DataConfig.parse({"preset": "criteo", "train": "train.tsv"}, where="data")
    >>> cfg.format, cfg.csv.header, cfg.csv.column_names[:3], cfg.delimiter == "\\t"
    ('tsv', False, ['label', 'I1', 'I2'], True)
    >>> DataConfig.parse({"batch_sise": 8}, where="data")
    Traceback (most recent call last):
    ...
    ember.errors.ConfigError: invalid config: unknown key 'data.batch_sise' (did you mean 'batch_size'?); ...
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from ember.config_base import ConfigModel, deep_merge, removed_key
from ember.source.iceberg import IcebergOptions
from ember.source.sql import SqlOptions
from ember.source.storage import StorageOptions
from ember.source.watch import WatchOptions

__all__ = ["CsvOptions", "SyntheticOptions", "DataConfig", "PRESET_DATA_DEFAULTS", "CRITEO_COLUMNS", "SHUFFLE_BUFFER_ROWS"]

SHUFFLE_BUFFER_ROWS = 1_000_000  # data.shuffle_buffer's default; RAM per row: see DataConfig

CRITEO_COLUMNS: list[str] = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]


class CsvOptions(ConfigModel):
    """CSV/TSV layout. Text must be UTF-8 (a leading byte order mark is dropped).

    ``newlines_in_values``: false (default), one line is one row: a quote that does not close
    on its line makes that line a bad row, so a stray ``"`` never swallows the lines after it.
    True (e.g. spreadsheet exports, whose cells may hold line breaks): a quoted value may hold
    line ends when it is closed as CSV writers close it (its quote followed by the delimiter
    or the line end); a row is numbered by the line it starts on, and a quote that opens such
    a value but is never closed that way makes its line a bad row. Off by default because a
    file with stray quotes reads differently under it (and it scans every quote, slower).

    ``header`` is decided per file: ``true``, every file's first line names its columns
    (``column_names``, when set, replace those names); ``false``, no file has a header
    (``column_names`` required); ``auto``, a file's first line is a header exactly when its
    fields equal ``column_names`` (required), e.g. a train file with a header line and eval
    files without one.

    Example:
        >>> CsvOptions(header="auto", column_names=["label", "C1"]).header
        'auto'
    """

    delimiter: str | None = Field(None, min_length=1, max_length=1)
    """One character; unset: `,` for csv, tab for tsv."""
    header: bool | Literal["auto"] = True
    """`true`: each file's first line names the columns; `false`: no header line; `auto`: per file, the first
    line is a header exactly when it equals `column_names` (e.g. a train file with a header, eval files
    without)."""
    column_names: list[str] | None = None
    """Required when `header` is false or `auto` (the `criteo` preset sets them); with `header: true` they
    replace the header's names."""
    block_bytes: int = Field(8 << 20, ge=1 << 12)
    """Bytes parsed at a time: more RAM against less per-call overhead."""
    newlines_in_values: bool = False
    """Quoted values may hold delimiters and line breaks (spreadsheet exports); off, such a line is a bad row."""


MAX_SYNTHETIC_COLUMNS = 10_000
"""The most dense or sparse columns the generator makes: every generated row holds them all (Criteo has 13 and 26;
100 million would need more memory than a machine has for a single batch)."""


MAX_SYNTHETIC_BAG = 10_000
"""The longest bag a multi-hot generated feature may draw (each row holds up to this many IDs)."""


class SyntheticOptions(ConfigModel):
    """The built-in Criteo-shaped generator (see :mod:`ember.source.synthetic`)."""

    num_dense: int = Field(13, ge=0, le=MAX_SYNTHETIC_COLUMNS)
    """Dense columns `I1..` (at most 10,000: every row holds them all)."""
    num_sparse: int = Field(26, ge=1, le=MAX_SYNTHETIC_COLUMNS)
    """Sparse columns `C1..` (at most 10,000)."""
    rows: int = Field(1_000_000, ge=1)
    """Training rows."""
    eval_rows: int = Field(100_000, ge=1)
    """Evaluation rows."""
    vocab_size: int | list[int] = 100_000
    """Distinct IDs per sparse feature: one value for all, or a list with one each."""
    zipf: float = Field(1.1, gt=0.0)
    """Exponent of the Zipf distribution the IDs are drawn from."""
    multi_hot: dict[str, int] = Field(default_factory=dict)
    """Feature name to maximum bag length, e.g. `{C1: 5}` (at most 10,000); the others are single-hot."""
    signal_features: int = Field(8, ge=0)
    """Sparse features that carry a hidden per-ID effect on the label."""
    seed: int = Field(0, ge=0, lt=2**63)
    """Generator seed: batch k depends only on (seed, split, k)."""

    @model_validator(mode="after")
    def _check(self) -> "SyntheticOptions":
        names = {f"C{i}" for i in range(1, self.num_sparse + 1)}
        vs = self.vocab_size
        if isinstance(vs, list) and len(vs) != self.num_sparse:
            raise ValueError(f"vocab_size has {len(vs)} entries; give one per sparse feature ({self.num_sparse})")
        if any(v < 1 for v in (vs if isinstance(vs, list) else [vs])):
            raise ValueError("vocab_size must be >= 1")
        bad = sorted(set(self.multi_hot) - names)
        if bad:
            raise ValueError(f"multi_hot names unknown features {bad}; features are C1..C{self.num_sparse}")
        if any(not 1 <= v <= MAX_SYNTHETIC_BAG for v in self.multi_hot.values()):
            raise ValueError(f"multi_hot lengths must be in [1, {MAX_SYNTHETIC_BAG:,}], got {self.multi_hot}")
        return self

    def vocab(self, index: int) -> int:
        """Vocabulary size of sparse feature ``index`` (0-based)."""
        return self.vocab_size[index] if isinstance(self.vocab_size, list) else self.vocab_size


PRESET_DATA_DEFAULTS: dict[str, dict[str, Any]] = {
    "criteo": {"format": "tsv", "csv": {"header": False, "column_names": CRITEO_COLUMNS}},
    "synthetic": {"format": "synthetic"},
}


class DataConfig(ConfigModel):
    """Data source, batching, shuffling and bad-row policy. A ``preset`` fills defaults that
    explicit keys override (see :mod:`ember.featurize.presets` for its schema).

    ``shuffle_buffer`` (training files only; eval keeps file order): rows are pooled until
    ``2 * shuffle_buffer`` are held, then a random half leaves, and the file order is shuffled,
    both from ``(seed, epoch)``. On by default, because files are often sorted (by time, by
    user) and SGD on sorted rows learns worse: ``SHUFFLE_BUFFER_ROWS`` (1,000,000) rows. RAM:
    a featurized Criteo-shaped row (13 floats, 26 IDs with their offsets, a label) is ~470 B,
    and the buffer's peak, pool plus the copies made while reshuffling, measured 3.3 GB
    (3.9 GB RSS) at 1,000,000 rows, i.e. ~3.3 KB per buffered row: it fits a 24 GiB box beside
    the tables. It grows with the IDs per row (~16 B per ID times ~7); lower it for wide
    multi-hot rows or small boxes. The first batch waits until the pool is full (~7 s here for
    2 M Parquet rows). 0 = file order (exact file order for tests or pre-shuffled data).
    """

    preset: Literal["criteo", "synthetic"] | None = None
    """`criteo` (Kaggle TSV layout) or `synthetic`: fills `format`, the CSV layout and the schema; explicit keys
    win."""
    format: Literal["synthetic", "csv", "tsv", "parquet", "orc", "sql", "iceberg"] = "synthetic"
    """`synthetic` (the built-in generator), `csv`, `tsv`, `parquet`, `orc`, `sql` (a database query: `sql`) or
    `iceberg` (an Apache Iceberg table: `iceberg`)."""
    train: list[str] | str | None = None
    """Training data: a path, glob or directory, or a list of them (read in sorted order); each may be a URI of
    object storage (`s3://bucket/prefix/`, `s3://bucket/day=*/*.parquet`; `gs://`, `hdfs://`, `abfs://`),
    reached with `storage_options`."""
    eval: list[str] | str | None = None
    """Evaluation data, as `train`; always read in file order."""
    storage_options: StorageOptions = StorageOptions()
    """How to reach data paths given as URIs (`s3://...`): endpoint, credentials, region, retries; unset keys come
    from the standard environment variables (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `AWS_REGION`, ...)."""
    batch_size: int = Field(4096, ge=1)
    """Training rows per batch (the global batch under distributed training)."""
    eval_batch_size: int | None = Field(None, ge=1)
    """Rows per evaluation batch; unset: `batch_size`."""
    drop_last: bool = False
    """Drop a final partial training batch."""
    shuffle_buffer: int = Field(SHUFFLE_BUFFER_ROWS, ge=0)
    """Training rows held for shuffling (the file order is shuffled too); 0 = file order. On by default since
    files are often sorted (by time, by user). RAM: ~3.3 KB per buffered Criteo-shaped row at the peak (pool
    of up to 2× the buffer plus the reshuffle's copies: 3.3 GB at the default, measured), more with more IDs
    per row; the first batch waits for the pool to fill. Evaluation always reads in file order."""
    seed: int = Field(0, ge=0, lt=2**63)
    """Shuffle seed (reshuffled per epoch)."""
    on_bad_rows: Literal["error", "skip"] = "error"
    """`error`: stop, naming file, row, column and value; `skip`: drop the row and count it per reason."""
    shard: Literal["rows", "files"] = "rows"
    """How the ranks of a distributed run split the training data. `rows`: every rank reads each global batch and
    trains its slice (results do not depend on the world size). `files`: rank r reads only training files r,
    r+N, r+2N, ... in batches of `batch_size / N` rows of its own: each rank reads and featurizes only its
    files (faster), but the batches, and so the results, depend on the world size. Needs files (not
    `synthetic`), at least N of them, and `train.mode: offline`; one process ignores it."""
    read_rows: int = Field(65536, ge=1)
    """Rows per record batch read from Parquet, ORC or the generator."""
    prefetch: None = None
    """Removed: reading ahead is the pipeline's job (`pipeline.depth.read`); setting it is an error that says so."""
    csv: CsvOptions = CsvOptions()
    """How CSV / TSV files are laid out."""
    sql: SqlOptions | None = None
    """`format: sql`: the database (ADBC driver and URI), the training query, its key column and the evaluation
    query; in place of `train` / `eval`."""
    iceberg: IcebergOptions | None = None
    """`format: iceberg`: the catalog, the training and evaluation tables, row filters and snapshots; in place of
    `train` / `eval`. With `data.watch` (and `train.mode: online`), each data file new snapshots append trains once."""
    synthetic: SyntheticOptions = SyntheticOptions()
    """The built-in generator (`format: synthetic`): Criteo-shaped rows, nothing of vocabulary size allocated."""
    watch: WatchOptions | None = None
    """Watch `data.train` for new files (or, `format: iceberg`, the table for new snapshots) and train on them as
    they appear (needs `train.mode: online`)."""

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") in PRESET_DATA_DEFAULTS:
            return deep_merge(PRESET_DATA_DEFAULTS[data["preset"]], data)
        return data

    _no_prefetch = removed_key("prefetch", "data.prefetch was removed: reading ahead is the pipeline's job; use "
                               "pipeline.enabled (true/false) and pipeline.depth.featurize (batches ready ahead) instead")

    @model_validator(mode="after")
    def _check(self) -> "DataConfig":
        if self.format == "sql" or self.sql is not None:
            return self._check_sql()
        if self.format == "iceberg" or self.iceberg is not None:
            return self._check_iceberg()
        if self.format != "synthetic" and self.train is None and self.eval is None:
            raise ValueError(f"format '{self.format}' needs data.train and/or data.eval paths")
        if self.watch is not None and (self.format == "synthetic" or self.train is None):
            raise ValueError("data.watch watches the data.train directories or globs of a file format (csv, tsv, "
                             "parquet, orc): set data.format and data.train")
        if self.shard == "files" and self.format == "synthetic":
            raise ValueError("data.shard: files gives each rank its own training files; synthetic data has none "
                             "(use data.shard: rows, or write the data to files with `ember generate`)")
        if self.format in ("csv", "tsv") and self.csv.header is not True and not self.csv.column_names:
            raise ValueError(f"csv.header is {str(self.csv.header).lower()}: set csv.column_names "
                             "(or preset: criteo)")
        return self

    def _check_sql(self) -> "DataConfig":
        if self.format != "sql":
            raise ValueError(f"data.sql is set but data.format is '{self.format}': set data.format: sql, or remove data.sql")
        if self.sql is None:
            raise ValueError("data.format: sql needs data.sql: {driver: postgresql | sqlite | <ADBC driver>, uri: ..., "
                             "query: 'SELECT ...', key: <unique column>}")
        if self.train is not None or self.eval is not None:
            raise ValueError("data.format: sql reads data.sql.query and data.sql.eval_query; remove data.train / "
                             "data.eval (they name files)")
        if self.watch is not None:
            raise ValueError("data.watch follows new files; data.format: sql reads a query (rows added later with keys "
                             "above the last trained are read by a resumed run): remove data.watch")
        if self.shard == "files":
            raise ValueError("data.shard: files gives each rank its own files; a SQL query is one stream: use "
                             "data.shard: rows")
        return self

    def _check_iceberg(self) -> "DataConfig":
        if self.format != "iceberg":
            raise ValueError(f"data.iceberg is set but data.format is '{self.format}': set data.format: iceberg, or "
                             "remove data.iceberg")
        if self.iceberg is None:
            raise ValueError("data.format: iceberg needs data.iceberg: {catalog: {type: sql | rest | hive, uri: ...}, "
                             "table: namespace.table}")
        if self.train is not None or self.eval is not None:
            raise ValueError("data.format: iceberg reads data.iceberg.table and data.iceberg.eval_table; remove "
                             "data.train / data.eval (they name files)")
        if self.watch is not None and self.iceberg.table is None:
            raise ValueError("data.watch follows data.iceberg.table's new snapshots: set data.iceberg.table")
        return self

    def holds(self, split: Literal["train", "eval"]) -> bool:
        """Whether ``split`` has rows configured (paths, a SQL query, a table, or the synthetic generator)."""
        if self.format == "synthetic":
            return True
        if self.format == "sql":
            return self.sql is not None and self.sql.query_of(split) is not None
        if self.format == "iceberg":
            return self.iceberg is not None and self.iceberg.table_of(split) is not None
        return bool(self.paths(split))

    def streams(self) -> bool:
        """Whether the training data can be read as an online stream (files, or an Iceberg table's appends)."""
        return self.format in ("csv", "tsv", "parquet", "orc") and self.train is not None or \
            self.format == "iceberg" and self.iceberg is not None and self.iceberg.table is not None

    @property
    def delimiter(self) -> str:
        if self.csv.delimiter is not None:
            return self.csv.delimiter
        return "\t" if self.format == "tsv" else ","

    def paths(self, split: Literal["train", "eval"]) -> list[str]:
        """The configured path patterns of a split (not yet expanded)."""
        p = self.train if split == "train" else self.eval
        if p is None:
            return []
        return [p] if isinstance(p, str) else list(p)

    def split_batch_size(self, split: Literal["train", "eval"]) -> int:
        return self.batch_size if split == "train" else (self.eval_batch_size or self.batch_size)
