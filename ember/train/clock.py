"""The clock of a run's time-based cadences (``checkpoint.every_s``,
``eval.window_every_s``): one name, so that tests replace it for every cadence at once."""

from __future__ import annotations

import time

__all__ = ["now"]

monotonic = time.monotonic  # tests replace this


def now() -> float:
    """Seconds on the run's monotonic clock."""
    return monotonic()
