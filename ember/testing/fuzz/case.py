"""What a reliability case is (``Case``: its files or fault, the bad rows planted) and what ember
owes it (``Outcome``, ``OUTCOMES``, ``RIGHT``); the schema every data case is read with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ember.featurize.schema import Schema


SCHEMA = Schema.parse({
    "labels": ["y"],
    "dense": [{"name": "I1", "log1p": True}, {"name": "I2"}],
    "sparse": [{"name": "C1"}, {"name": "C2", "separator": "|"}],
})
COLUMNS = ["y", "I1", "I2", "C1", "C2"]

OUTCOMES = ["clear_error", "counted_skip", "clean_read", "recovered", "silent_drop", "crash", "data_lost",
            "unclear_error", "accepted_bad", "undetected_change"]
RIGHT = {"clear_error", "counted_skip", "clean_read", "recovered"}


@dataclass
class Case:
    """One input and what ember owes it.

    ``rows``: data rows in the files (good and bad); ``bad``: rows planted bad (what a skip
    must count); ``bad_rows``: their 1-based row numbers (a CSV header counted), one of which
    an error must name; ``must_fail``: no outcome but a clear error is right (a missing
    column, an empty file, a wrong column type); ``original``: for damaged files, the bytes
    before the damage (their read is the reference); ``column``: a column the error must name.
    """

    kind: str
    seed: tuple[int, ...] = ()
    format: str = "csv"
    files: list[tuple[str, bytes]] = field(default_factory=list)
    policy: str = "error"
    data: dict[str, Any] = field(default_factory=dict)
    rows: int = 0
    bad: int = 0
    bad_rows: list[int] = field(default_factory=list)
    must_fail: bool = False
    original: bytes | None = None
    column: str | None = None
    checksummed: bool = True  # damage cases: whether the format can notice changed values
    fault: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    kind: str  # the case kind
    outcome: str  # one of OUTCOMES
    detail: str = ""
