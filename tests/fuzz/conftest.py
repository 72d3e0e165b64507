"""Sizes of the fuzz tests. The default suite runs each a little; the ``slow`` ones run more,
still within ``make test``'s budget; ``EMBER_FUZZ_SCALE=k`` multiplies the slow sizes by k for a
long hunt (``bench/fuzz_reliability.py`` is the full study)."""

from __future__ import annotations

import os


def fuzz_scale() -> int:
    """``EMBER_FUZZ_SCALE`` (default 1), read at call time."""
    return max(1, int(os.environ.get("EMBER_FUZZ_SCALE", "1")))


def fuzz_derandomize() -> bool:
    """Whether the property tests draw the same examples every run (the default, so that the
    suite is reproducible: a new failure never appears by chance in CI); ``EMBER_FUZZ_RANDOM=1``
    draws new ones each run, for a hunt (with ``EMBER_FUZZ_SCALE`` for more of them)."""
    return os.environ.get("EMBER_FUZZ_RANDOM", "") != "1"
