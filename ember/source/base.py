"""What every reader yields (an arrow record batch plus where its rows came from), and the
checks every reader shares: columns present, file readable."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa

from ember.errors import ConfigError, DataError, MissingColumnsError
from ember.source.storage import StorageOptions, is_remote, is_storage_error, storage_error

__all__ = ["RecordChunk", "check_columns", "check_unique", "repeated", "is_damage", "damaged_file", "read_failed"]


@dataclass(frozen=True)
class RecordChunk:
    """``batch`` rows came from ``file``; row 0 is row ``first_row`` of the file (1-based,
    a CSV header line counted), so messages can name the exact line. ``lines``: where rows
    may span lines (CSV values holding line ends), the line each row starts on."""

    batch: pa.RecordBatch
    file: str
    first_row: int
    lines: np.ndarray | None = None

    @property
    def row_numbers(self) -> int | np.ndarray:
        """What messages number rows by: ``first_row`` (rows follow one another), or ``lines``."""
        return self.first_row if self.lines is None else self.lines


def check_columns(file: str, available: Sequence[str], wanted: Sequence[str]) -> None:
    """Raise MissingColumnsError (a SchemaError) naming the missing columns and the ones the file
    has, or DataError when a wanted column is there twice (``check_unique``)."""
    missing = [c for c in wanted if c not in available]
    if missing:
        raise MissingColumnsError(
            f"{file}: column(s) {missing} not found; the file has {list(available)} "
            "(fix the schema's column names, or csv.column_names / csv.header for CSV)", missing, list(available)
        )
    if len(set(available)) != len(available):
        check_unique(file, available, wanted, "its schema", "name every column once in the file (or the query)")


def check_unique(path: str, names: Sequence[str], columns: Sequence[str], where: str, fix: str) -> None:
    """Raise DataError when a column read (``columns``) is named twice in ``names`` (``where``:
    what names them): which of them holds the data would be a guess. A repeated name nothing
    reads is harmless."""
    found = repeated(names, columns)
    if found is not None:
        c, at = found
        raise DataError(f"{path}: {where} names column '{c}' {len(at)} times (fields {', '.join(map(str, at))}); {fix}")


def repeated(names: Sequence[str], columns: Sequence[str]) -> tuple[str, list[int]] | None:
    """The first of ``columns`` named more than once in ``names``, with its positions (1-based),
    or None: the one check of a column read twice, for the sources and the featurizer."""
    for c in dict.fromkeys(columns):
        at = [i + 1 for i, n in enumerate(names) if n == c]
        if len(at) > 1:
            return c, at
    return None


def is_damage(error: BaseException) -> bool:
    """Whether pyarrow's ``error`` says a file's bytes are bad (truncated, garbage, checksum
    mismatch, a column name in the footer that is not UTF-8: pyarrow decodes it in Python), as
    opposed to a file that is missing or not readable by this user."""
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError)) or is_storage_error(error):
        return False
    return isinstance(error, (pa.ArrowException, OSError, UnicodeDecodeError))


def damaged_file(file: str, where: str, error: BaseException) -> DataError:
    """The DataError for a file whose bytes cannot be decoded; ``where`` locates the damage
    (e.g. ``" row group 3 (rows 1-5000, byte offset 4)"``, or ``""`` for the whole file)."""
    return DataError(
        f"{file}{where}: cannot be read, the file is truncated, damaged or not in the configured format "
        f"({error}); restore or re-create the file, or leave it out of the files read (data.train / data.eval, "
        "or predict's --input)"
    )


def read_failed(file: str, where: str, error: BaseException,
                storage_options: StorageOptions | None = None) -> ConfigError | DataError | None:
    """The error to raise for ``error`` while reading ``file``: the remote store's failure named
    (denied, missing, unreachable: ``ember.source.storage``), a damaged file's DataError, or
    None (raise ``error`` itself)."""
    if is_remote(file) and (is_storage_error(error) or isinstance(error, (FileNotFoundError, PermissionError))):
        return storage_error(file, "reading", error, storage_options)
    return damaged_file(file, where, error) if is_damage(error) else None
