"""Files as a source (``data.format: csv | tsv | parquet | orc``), local or in object storage:
a unit is one file (``expand_paths``: sorted, stable), opened by its format's reader; positions
count batches (an epoch resumed re-reads its files and drops the batches trained), and a
watched ``data.train`` follows new files (``ember.source.watch``).

Example:
    >>> import tempfile, os
    >>> from ember.source.config import DataConfig
    >>> d = tempfile.mkdtemp(); _ = open(os.path.join(d, "a.csv"), "w").write("y,c\\n1,x\\n0,z\\n")
    >>> src = FileSource(DataConfig(format="csv", train=d))
    >>> [os.path.basename(u.name) for u in src.units("train")], src.count("train").bytes
    (['a.csv'], 12)
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Callable, Iterator, Mapping, Sequence

from ember.errors import CheckpointError, ConfigError, DataError
from ember.source import storage
from ember.source.bad_rows import BadRowReport
from ember.source.base import RecordChunk, check_columns, read_failed
from ember.source.config import DataConfig
from ember.source.csv import header_fields, read_csv, read_head
from ember.source.files import expand_listed, with_sizes
from ember.source.orc import read_orc
from ember.source.parquet import read_parquet
from ember.source.protocol import RowCount, Split, Unit
from ember.source.watch import FileWatcher, check_watched

__all__ = ["FileSource", "names"]


def names(files: Sequence[str]) -> str:
    """A few of ``files`` for a message."""
    shown = ", ".join(files[:5])
    return f"{len(files)} file(s) ({shown}{', ...' if len(files) > 5 else ''})"


class FileSource:
    """CSV / TSV / Parquet / ORC files of ``data.train`` / ``data.eval`` (see the module docstring)."""

    def __init__(self, data: DataConfig) -> None:
        self.data = data
        self._listed: dict[str, list[tuple[str, int | None]]] = {}  # split -> its files (sizes where listed)

    def _listing(self, split: Split) -> list[tuple[str, int | None]]:
        """``split``'s files, each with its size where the listing gave it: listed once per
        source (a run), so a run's checks, its size estimate and every epoch see one file list
        and an object store is listed once, not once per use (new files mid-run: ``data.watch``)."""
        if split not in self._listed:
            self._listed[split] = expand_listed(self.data.paths(split), self.data.format, self.data.storage_options,
                                                f"data.{split}")
        return self._listed[split]

    def sized(self, split: Split) -> list[tuple[str, int]]:
        """``split``'s files (the run's one listing) with their sizes in bytes: the listing's,
        else asked of each file (a distributed run's file check, a CSV's byte count)."""
        return with_sizes(self._listing(split), self.data.storage_options)

    def _files(self, split: Split) -> list[str]:
        files = [f for f, _ in self._listing(split)]
        if not files:
            raise ConfigError(f"data.{split} is not set; give the {split} files (format {self.data.format})")
        return files

    def units(self, split: Split, at: Any = None) -> list[Unit]:
        return [Unit(f) for f in self._files(split)]

    def open(self, unit: Unit, columns: Sequence[str], report: BadRowReport | None = None, at: Any = None,
             consumed: list[int] | None = None, types: Mapping[str, Any] | None = None) -> Iterator[RecordChunk]:
        data, path = self.data, unit.name
        if data.format in ("csv", "tsv"):
            return read_csv(path, columns, delimiter=data.delimiter, header=data.csv.header, consumed=consumed,
                            column_names=data.csv.column_names, block_bytes=data.csv.block_bytes, report=report,
                            newlines_in_values=data.csv.newlines_in_values, storage_options=data.storage_options,
                            types=types)
        if data.format == "parquet":
            return read_parquet(path, columns, read_rows=data.read_rows, storage_options=data.storage_options)
        return read_orc(path, columns, read_rows=data.read_rows, storage_options=data.storage_options)

    def check(self, split: Split, columns: Sequence[str]) -> list[Unit]:
        data = self.data
        if not data.paths(split):
            return []
        if split == "train" and data.watch is not None:  # files appear later: each is checked as it is read
            check_watched(data.paths(split), data.storage_options)
            return []
        files = self._files(split)
        rows = 0
        for path in files:
            found, has_rows = self.header(path)
            check_columns(path, found, columns)
            rows += has_rows
        if not rows:
            raise DataError(f"data.{split}: {names(files)} hold no data rows (header or metadata only); "
                            f"give data.{split} files with rows")
        return [Unit(f) for f in files]

    def header(self, path: str) -> tuple[list[str], int]:
        """Column names of ``path`` and its row count (CSV: 1 when a data line follows the header)."""
        data = self.data
        try:
            if data.format in ("csv", "tsv"):
                head = read_head(path, 1 << 16, data.storage_options)
                lines = [ln for ln in head.split(b"\n") if ln.strip(b"\r")]
                found = header_fields(lines[0], data.delimiter, errors="replace") or [] if lines else []  # BOM removed
                given = data.csv.column_names or []
                has_header = data.csv.header is True or (data.csv.header == "auto" and found == given)
                if data.csv.header is True and not lines:
                    raise DataError(f"{path}: the file is empty (csv.header is true: a header line is expected); "
                                    "remove it from the data paths")
                return (given or found if has_header else given), int(len(lines) > int(has_header))
            if data.format == "parquet":
                import pyarrow.parquet as pq

                with storage.opened(path, data.storage_options) as source:
                    meta = pq.read_metadata(source)
                return list(meta.schema.to_arrow_schema().names), meta.num_rows
            import pyarrow.orc as orc

            with storage.opened(path, data.storage_options) as source:
                f = orc.ORCFile(source)
                return list(f.schema.names), f.nrows
        except (ConfigError, DataError):
            raise
        except Exception as e:
            failed = read_failed(path, " (header/footer)", e, data.storage_options)
            if failed is not None:
                raise failed from e
            raise

    def count(self, split: Split, estimate: bool = False) -> RowCount:
        data = self.data
        if split == "train" and data.watch is not None or not data.paths(split):
            return RowCount()  # a stream: no size
        if data.format in ("parquet", "orc"):
            files = self._files(split)
            return RowCount(rows=sum(self.header(f)[1] for f in files))  # (footers only; a damaged one named)
        sized = self.sized(split)
        files, sizes = [f for f, _ in sized], [size for _, size in sized]
        if not estimate:
            return RowCount(bytes=sum(sizes))
        rows = 0
        for f, size in zip(files, sizes):
            head = read_head(f, 1 << 16, data.storage_options)
            rows += head.count(b"\n") * max(size, len(head)) // max(len(head), 1)
        return RowCount(rows=rows, bytes=sum(sizes))

    def start(self, split: Split, at: Any, ordered: bool, resumed: bool) -> Any:
        return None  # files are re-read in the epoch's order: the batch index is the position

    def key(self, split: Split, ordered: bool) -> str | None:
        return None

    def after(self, at: Any, value: Any) -> Any:
        return None

    def follow(self, resume: str | None, taken: set[str], stop: Callable[[], bool]) -> Iterator[Unit]:
        data = self.data
        if resume is not None and not storage.is_file(resume, data.storage_options):
            raise CheckpointError(f"the checkpoint's stream position is in {resume}, which no longer exists; restore "
                                  "the file, or start a new run from the checkpoint's weights (train.init_from)")
        if data.watch is not None:
            rest: Iterator[str] = FileWatcher(data.paths("train"), data.format, data.watch, taken,
                                              storage_options=data.storage_options).files(stop)
        else:
            rest = (f for f in self._files("train") if f not in taken)
        return (Unit(f) for f in chain([resume] if resume is not None else [], rest))
