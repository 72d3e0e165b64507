"""Arrays that grow in place: a memory tier's arena and slot metadata keep their address as rows
are added once they are large.

A tier that doubles its arrays copies every row it holds, and while it does it needs three times
their memory (the old arrays and new ones twice as large; with ember's allocator tunables the
freed ones also stay in the process): a 10 GB host table needs 30 GB for a moment, and stalls for
the copy. Once an array reaches ``SMALL_BYTES``, a ``Growable`` reserves the address range of the
largest array it may become (an anonymous private mapping that commits no memory: the kernel
backs a page, a 2 MB transparent huge page where the system allows, only when it is first
written), copies its rows there once, and from then on grows by widening its view: no copy, no
transient, rows keep their address. Below that size it grows as an ordinary array (the heap
recycles small arrays' memory, with no page fault). Where the reservation is refused (strict
overcommit, an address-space limit) it keeps reallocating and copying, and says so once.

Example:
    >>> g = Growable(4, width=3, dtype=np.float32, max_rows=10_000_000)
    >>> g.array[1] = 7.0
    >>> big = g.grow(2_000_000)  # 24 MB: reserved, the rows copied there once
    >>> at = big.ctypes.data
    >>> bigger = g.grow(4_000_000)
    >>> bigger.shape, float(bigger[1, 0]), bigger.ctypes.data == at or not g.reserved
    ((4000000, 3), 7.0, True)
"""

from __future__ import annotations

import logging
import mmap
import os
import sys

import numpy as np

from ember import once

__all__ = ["Growable", "max_rows_in_memory", "RESERVE_AT_MOST"]

log = logging.getLogger("ember.tiers")

_MAP_NORESERVE = 0x4000 if sys.platform.startswith("linux") else 0  # not in Python's mmap module before 3.13
SMALL_BYTES = 16 << 20
"""Arrays below this size grow by copying on the heap; at it, into a reservation (huge pages
advised: by then a 2 MB page wastes little, and it takes 512 times fewer page faults)."""


RESERVE_AT_MOST = 64 << 30
"""Bytes of rows an unbounded tier reserves at most (a larger one copies when it grows past
them): many tables on a machine with much memory must not exhaust the 128 TiB address space."""


def max_rows_in_memory(row_bytes: int) -> int:
    """The most rows of ``row_bytes`` an unbounded tier reserves: what this machine's memory
    could hold (a tier larger than memory belongs on a disk tier), at most ``RESERVE_AT_MOST``
    bytes of them."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = RESERVE_AT_MOST
    return max(1, min(ram, RESERVE_AT_MOST) // max(1, row_bytes))


class Growable:
    """A numpy array of ``rows`` rows (each ``width`` items of ``dtype``, or one item when
    ``width`` is None), zero-filled, that grows in place up to ``max_rows`` rows once it holds
    ``SMALL_BYTES``.

    ``array`` is the current view; ``grow(rows)`` widens it (and returns it). Below
    ``SMALL_BYTES``, past ``max_rows``, or where the platform refuses the reservation
    (``reserved`` stays False), growing reallocates and copies. A reservation lives as long as
    any view of it.
    """

    def __init__(self, rows: int, width: int | None, dtype: np.dtype | type, max_rows: int) -> None:
        self.dtype = np.dtype(dtype)
        self.width = width
        self._row_bytes = (1 if width is None else width) * self.dtype.itemsize
        self._map: mmap.mmap | None = None
        self.max_rows = max(rows, max_rows, 1)
        self.array = np.zeros(self._shape(0), self.dtype)
        if rows * self._row_bytes >= SMALL_BYTES:
            self._reserve()  # a large first size: its pages stay uncommitted until written
        if self._map is not None:
            self.array = self._view(rows)
        else:
            self.array = np.zeros(self._shape(rows), self.dtype)

    @property
    def reserved(self) -> bool:
        """Whether this array grows in place (its address range is reserved)."""
        return self._map is not None

    def _shape(self, rows: int) -> tuple[int, ...]:
        return (rows,) if self.width is None else (rows, self.width)

    def _view(self, rows: int) -> np.ndarray:
        assert self._map is not None
        count = rows * (1 if self.width is None else self.width)
        return np.frombuffer(self._map, dtype=self.dtype, count=count).reshape(self._shape(rows))

    def _reserve(self) -> None:
        """Move the rows into a reservation of ``max_rows`` rows (once), or stay as is when refused."""
        if not _MAP_NORESERVE or self.max_rows < max(self.array.shape[0], 1):
            return
        try:
            self._map = mmap.mmap(-1, self.max_rows * self._row_bytes,
                                  flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE,
                                  prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError, OverflowError) as e:
            if once.first("growable.reserve", type(e).__name__):
                log.info("memory tiers grow by copying (the address range of %d rows could not be reserved: %s); "
                         "a table briefly needs 3x its rows' memory when it doubles", self.max_rows, e)
            self.max_rows = 0  # grow by copying from now on
            return
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self._map.madvise(mmap.MADV_HUGEPAGE)
            except OSError:  # transparent huge pages off: 4 KB pages
                pass
        view = self._view(self.array.shape[0])
        view[:] = self.array
        self.array = view

    def grow(self, rows: int) -> np.ndarray:
        """The array widened to ``rows`` rows (rows kept, new ones zero): in place within a
        reservation, else a copy (which reserves once the array is large enough)."""
        if rows <= self.array.shape[0]:
            return self.array
        if self._map is not None and rows <= self.max_rows:
            self.array = self._view(rows)
            return self.array
        if self._map is None and rows * self._row_bytes >= SMALL_BYTES and rows <= self.max_rows:
            self._reserve()
            if self._map is not None:
                self.array = self._view(rows)
                return self.array
        bigger = np.empty(self._shape(rows), self.dtype)  # small, refused, or past the reservation: a copy
        held = self.array.shape[0]
        bigger[:held] = self.array
        bigger[held:] = 0  # only the new rows zeroed: the old ones are written once, not twice
        self.array, self._map = bigger, None
        return bigger
