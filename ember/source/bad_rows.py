"""Bad-row policy: raise a DataError that names file, row, column and value, or count and skip.

Example:
    >>> report = BadRowReport(policy="skip")
    >>> report.add("I3: not a number", 2)
    >>> report.counts, report.total
    ({'I3: not a number': 2}, 2)
    >>> print(report)
    skipped 2 bad rows: I3: not a number x2
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Literal

from ember.errors import DataError

__all__ = ["BadRowReport", "raise_bad_row"]

_FIX = "set data.on_bad_rows: skip to count and skip such rows, or fix the file"


def raise_bad_row(file: str, row: int, column: str, value: object, problem: str) -> None:
    """Raise the DataError for one bad row (``row`` is 1-based in the file, header counted)."""
    raise DataError(f"{file} row {row}, column '{column}': {problem}, got {value!r} ({_FIX})")


class BadRowReport:
    """Rows dropped per reason under ``on_bad_rows: skip``; complete once iteration ends.

    Thread-safe: the loader's prefetch thread adds while the trainer may read.
    """

    def __init__(self, policy: Literal["error", "skip"] = "error") -> None:
        self.policy = policy
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.rows_read = 0  # rows seen by the featurizer, good and bad

    @property
    def skip(self) -> bool:
        return self.policy == "skip"

    def add(self, reason: str, count: int = 1) -> None:
        if count:
            with self._lock:
                self._counts[reason] += int(count)

    @property
    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __str__(self) -> str:
        if not self.total:
            return "no bad rows"
        parts = ", ".join(f"{k} x{v}" for k, v in sorted(self.counts.items(), key=lambda kv: -kv[1]))
        return f"skipped {self.total} bad rows: {parts}"

    def __repr__(self) -> str:
        return f"BadRowReport(policy={self.policy!r}, counts={self.counts})"
