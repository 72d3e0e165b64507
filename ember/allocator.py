"""Host memory allocator settings for large batches.

With glibc's default malloc, a step at batch 16,384 pays tens of thousands of page faults: every
activation of 32 MiB or more is mapped fresh from the kernel and unmapped again when freed (the
mmap threshold cannot be raised past 32 MiB at run time), and freed heap tops are given back, so
the next step faults every page in again. Three glibc tunables stop that: large blocks come from
the heap (``mmap_threshold``), the heap is not trimmed (``trim_threshold``), and the heap uses
transparent huge pages (``hugetlb=1``: a 2 MiB page faults once instead of 512 times).
Measured on the DLRM of bench/bench_dlrm.py at batch 16,384: ~90,000 page faults per step
without them, tens with them (``python bench/bench_dlrm.py --batch 16384`` prints both).

glibc reads tunables only when a process starts, so the ``ember`` command line re-runs itself
once with them set (``exec``, same process ID) unless ``GLIBC_TUNABLES`` is already set (your
choice wins) or ``EMBER_MALLOC=default``. Scripts that ``import ember`` set the variable
before starting Python: ``export GLIBC_TUNABLES=`` followed by :data:`TUNABLES`.
"""

from __future__ import annotations

import logging
import os
import platform
import sys

__all__ = ["TUNABLES", "tuned", "reexec_tuned", "advise"]

log = logging.getLogger(__name__)

TUNABLES = ("glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=4294967296"
            ":glibc.malloc.trim_threshold=4294967296")
_REEXEC_MARK = "EMBER_MALLOC_REEXEC"  # set in the re-run process: never exec twice
_advised = False


def _glibc() -> bool:
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def tuned() -> bool:
    """Whether this process started with allocator tunables (ember's or the user's own)."""
    return "GLIBC_TUNABLES" in os.environ


def reexec_tuned(command: list[str]) -> None:
    """Re-run ``python <command>`` (e.g. ``["-m", "ember", "train", ...]`` or a script and its
    arguments) with :data:`TUNABLES` set, in place of this process.

    Returns (doing nothing) when tunables are set already, ``EMBER_MALLOC=default``, the C
    library is not glibc, or this is the re-run itself.
    """
    if tuned() or os.environ.get("EMBER_MALLOC") == "default" or _REEXEC_MARK in os.environ or not _glibc():
        return
    env = {**os.environ, "GLIBC_TUNABLES": TUNABLES, _REEXEC_MARK: "1"}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *command], env)
    except OSError as e:  # e.g. an interpreter that cannot be exec'd again: run untuned, say so
        log.warning("could not re-run with allocator tunables (%s); large batches will pay page faults per "
                    "step; set GLIBC_TUNABLES=%s before starting", e, TUNABLES)


def advise(batch_size: int) -> None:
    """Log once, for batches of 8,192 rows or more, when the process runs without tunables."""
    global _advised
    if _advised or batch_size < 8192 or tuned() or not _glibc():
        return
    _advised = True
    log.warning("batch %d without allocator tunables: each step pays page faults for its large "
                "activations; set GLIBC_TUNABLES=%s before starting Python (the ember command line "
                "does this itself; see ember.allocator)", batch_size, TUNABLES)
