"""What every reader yields: an arrow record batch plus where its rows came from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pyarrow as pa

from ember.errors import SchemaError

__all__ = ["RecordChunk", "check_columns"]


@dataclass(frozen=True)
class RecordChunk:
    """``batch`` rows came from ``file``; row 0 is row ``first_row`` of the file (1-based,
    a CSV header line counted), so messages can name the exact line."""

    batch: pa.RecordBatch
    file: str
    first_row: int


def check_columns(file: str, available: Sequence[str], wanted: Sequence[str]) -> None:
    """Raise SchemaError naming the missing columns and the ones the file has."""
    missing = [c for c in wanted if c not in available]
    if missing:
        raise SchemaError(
            f"{file}: column(s) {missing} not found; the file has {list(available)} "
            "(fix the schema's column names, or csv.column_names / csv.header for CSV)"
        )
