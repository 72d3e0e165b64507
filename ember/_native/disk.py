"""The disk tier's kernels (``ember.tiers.disk.DiskTier``): its in-RAM tags, its rows in a
memory-mapped file (gather, scatter, read-ahead), find and write."""

from __future__ import annotations

import mmap

import numpy as np

from ember import _native
from ember._native import _fallback_once
from ember._native.key_index import _STEPS, _WINDOW, _claim_rounds, _first_stop
from ember.mix import mix64


# tags uint16[S] in RAM: 0 empty, 1 deleted, else 16 hash bits of the ID in that slot; linear
# probing with wrap-around from a start position pos (int64 [n], 0 <= pos < S).

def _check_tags(tags: np.ndarray, pos: np.ndarray, tag: np.ndarray, out: np.ndarray) -> None:
    n = pos.size
    if tags.size < 1 or tag.size != n or out.size != n:
        raise ValueError("ember native tag probe: tags uint16[S], pos/out int64[n], tag uint16[n]")
    if n and (int(pos.min()) < 0 or int(pos.max()) >= tags.size):
        raise ValueError("ember native tag probe: start position out of range")


def _tag_window(tags: np.ndarray, pos: np.ndarray, done: int) -> tuple[np.ndarray, np.ndarray]:
    """Slots pos .. pos + _WINDOW - 1 (wrapping) and whether each is within the first S steps
    of a probe that has already looked at ``done`` slots."""
    ns = tags.size
    win = pos[:, None] + _STEPS
    if ns >= _WINDOW:
        win[win >= ns] -= ns
    else:
        win %= ns
    return win, _STEPS < ns - done


def gather_rows(src: np.ndarray, slots: np.ndarray, out: np.ndarray) -> None:
    """``out[:] = src[slots]`` (float32 rows [S, W] -> [k, W]), the GIL released while the rows
    are copied: rows of a memory-mapped disk tier may each be a page fault (a disk read), which
    under the GIL would stall the pipeline's other threads. Without the core (or for another
    layout), numpy's fancy indexing, which holds the GIL."""
    if _native._core is not None and _rows_ok(src, slots, out):
        return _native._core.gather_rows(src, slots, out, src.shape[1])
    return _gather_rows_py(src, slots, out)


def _gather_rows_py(src: np.ndarray, slots: np.ndarray, out: np.ndarray) -> None:
    out[...] = src[slots]


def scatter_rows(dst: np.ndarray, slots: np.ndarray, rows: np.ndarray) -> None:
    """``dst[slots] = rows`` (a later duplicate slot wins), the GIL released as in ``gather_rows``."""
    if _native._core is not None and _rows_ok(dst, slots, rows):
        return _native._core.scatter_rows(dst, slots, rows, dst.shape[1])
    return _scatter_rows_py(dst, slots, rows)


def _scatter_rows_py(dst: np.ndarray, slots: np.ndarray, rows: np.ndarray) -> None:
    dst[slots] = rows


def willneed(table: np.ndarray, slots: np.ndarray) -> int:
    """Ask the kernel to start reading the pages of rows ``slots`` (int64, sorted) of a
    memory-mapped ``table`` (float32 [S, W]) now, all at once (``madvise(MADV_WILLNEED)``), so
    the copy that follows does not take one page fault after another. Only a hint; returns the
    pages advised. Without the core, the same advice per page through the mapping's ``mmap``
    (numpy's private ``_mmap``; nothing for an array that is not a memory map)."""
    if _native._core is not None and table.dtype == np.float32 and table.ndim == 2 and table.flags.c_contiguous:
        return _native._core.willneed(table, np.ascontiguousarray(slots, dtype=np.int64), table.shape[1])
    return _willneed_py(table, slots)


def _willneed_py(table: np.ndarray, slots: np.ndarray) -> int:
    mm = getattr(table, "_mmap", None)
    if mm is None or not hasattr(mm, "madvise") or table.size == 0:
        return 0
    row = table.shape[1] * table.itemsize
    start = np.asarray(slots, dtype=np.int64) * row + getattr(table, "offset", 0) % mmap.ALLOCATIONGRANULARITY
    pages = np.unique(np.concatenate([start // mmap.PAGESIZE, (start + row - 1) // mmap.PAGESIZE]))
    for p in pages.tolist():
        mm.madvise(mmap.MADV_WILLNEED, p * mmap.PAGESIZE, mmap.PAGESIZE)
    return int(pages.size)


def willneed_cold(table: np.ndarray, slots: np.ndarray) -> int:
    """``willneed`` for the pages of rows ``slots`` (int64, sorted) that are not in the page cache
    only: the core asks ``mincore`` first, over windows spanning nearby rows, and advises the
    cold pages in runs; returns the pages advised. When the tier's file is in memory this costs
    a syscall per window instead of one per page (~1 us each; 6 of a 12 ms tiered step on a
    2-vCPU EPYC). Without the core (Python has no ``mincore``), ``willneed``'s fallback advises
    every page, logged once: the same hint for a superset of the pages, the same rows read."""
    if _native._core is not None and table.dtype == np.float32 and table.ndim == 2 and table.flags.c_contiguous:
        return _native._core.willneed_cold(table, np.ascontiguousarray(slots, dtype=np.int64), table.shape[1])
    _fallback_once("willneed_cold")
    return _willneed_cold_py(table, slots)


def _willneed_cold_py(table: np.ndarray, slots: np.ndarray) -> int:
    return _willneed_py(table, slots)


def disk_find(tags: np.ndarray, table: np.ndarray, ids: np.ndarray, out_slot: np.ndarray, out_rows: np.ndarray | None) -> int:
    """The disk tier's probe (``ember.tiers.disk``): ``out_slot[i]`` (int64) = the slot of the
    memory-mapped ``table`` (float32 [S, W]: ``[id as two words | record]``) holding ``ids[i]``,
    or -1, found through the uint16 ``tags`` [S] (home slot and tag from ``mix64``, linear
    probing, the stored ID checked against tag collisions); the found rows' records go to
    ``out_rows`` [n, W-2] when it is given (the others are left as they are). Returns the slots
    whose stored ID was read. The core does it in one pass with the GIL released, reading the
    candidates in file order after advising their pages not in memory (``willneed_cold``), in
    ranges of the IDs on several threads when there are many (``part_count``: each range waits
    on its own page faults); the fallback in rounds of numpy ``tag_find`` + row gathers, logged
    once."""
    n = ids.size
    w = table.shape[1]
    if out_slot.shape != (n,) or out_slot.dtype != np.int64 or (out_rows is not None and out_rows.shape != (n, w - 2)):
        raise ValueError(f"disk_find: out_slot int64 [{n}] and out_rows [{n}, {w - 2}] or None")
    if (_native._core is not None and table.dtype == np.float32 and table.ndim == 2 and table.flags.c_contiguous
            and tags.dtype == np.uint16 and tags.flags.c_contiguous and out_slot.flags.c_contiguous
            and (out_rows is None or (out_rows.dtype == np.float32 and out_rows.flags.c_contiguous))):
        rows = np.empty((0, w - 2), np.float32) if out_rows is None else out_rows
        return _native._core.disk_find(tags, table, np.ascontiguousarray(ids, dtype=np.int64), out_slot, rows, w,
                                       _native.part_count(n))
    _fallback_once("disk_find")
    return _disk_find_py(tags, table, ids, out_slot, out_rows)


def _disk_find_py(tags: np.ndarray, table: np.ndarray, ids: np.ndarray, out_slot: np.ndarray, out_rows: np.ndarray | None) -> int:
    ids = np.asarray(ids, dtype=np.int64)
    n_slots = tags.size
    h = mix64(ids.view(np.uint64))
    pos = (((h >> np.uint64(32)) * np.uint64(n_slots)) >> np.uint64(32)).astype(np.int64)
    tag = ((h & np.uint64(0xFFFF)) % np.uint64(65534) + np.uint64(2)).astype(np.uint16)
    out_slot[...] = -1
    active = np.arange(ids.size)
    read = 0
    while active.size:
        at = np.empty(active.size, dtype=np.int64)  # first tag match from pos, or -1 at an empty slot
        tag_find(tags, pos, tag.take(active), at)
        cand = np.flatnonzero(at >= 0)
        if cand.size == 0:
            break
        cslots = at[cand]
        order = np.argsort(cslots, kind="stable")  # file order: locality on a cold file
        ordered = np.ascontiguousarray(cslots[order], dtype=np.int64)
        willneed_cold(table, ordered)
        got = np.empty((cslots.size, table.shape[1]), dtype=np.float32)
        gather_rows(table, ordered, got)
        data = np.empty_like(got)
        data[order] = got
        read += cslots.size
        keys = np.ascontiguousarray(data[:, :2]).view(np.int64)[:, 0]
        q = active[cand]
        ok = keys == ids[q]
        out_slot[q[ok]] = cslots[ok]
        if out_rows is not None:
            out_rows[q[ok]] = data[ok, 2:]
        fp = cand[~ok]  # a tag collided with another ID: keep probing after it
        active = active[fp]
        pos = at[fp] + 1
        pos[pos == n_slots] = 0
    return read


def disk_write(table: np.ndarray, slots: np.ndarray, ids: np.ndarray, recs: np.ndarray, unique: bool = False) -> None:
    """The disk tier's write: row ``slots[i]`` of the memory-mapped ``table`` (float32 [S, W])
    becomes ``[ids[i] as two words | recs[i]]`` (``recs`` float32 [k, W-2]), in file order after
    advising the pages not in memory (``willneed_cold``); a later duplicate slot wins. The core
    does it in one pass with the GIL released, in ranges of the rows on several threads when
    the slots are ``unique`` (no two ranges then write one slot) and many (``part_count``); the
    fallback builds the rows in numpy and scatters them (``scatter_rows``), logged once."""
    if (_native._core is not None and table.dtype == np.float32 and table.ndim == 2 and table.flags.c_contiguous
            and recs.dtype == np.float32 and recs.flags.c_contiguous):
        return _native._core.disk_write(table, np.ascontiguousarray(slots, dtype=np.int64),
                                        np.ascontiguousarray(ids, dtype=np.int64), recs, table.shape[1],
                                        _native.part_count(slots.size) if unique else 1)
    _fallback_once("disk_write")
    return _disk_write_py(table, slots, ids, recs)


def _disk_write_py(table: np.ndarray, slots: np.ndarray, ids: np.ndarray, recs: np.ndarray) -> None:
    block = np.empty((slots.size, table.shape[1]), dtype=np.float32)
    block[:, :2] = np.ascontiguousarray(ids, dtype=np.int64).view(np.float32).reshape(-1, 2)
    block[:, 2:] = recs
    order = np.argsort(slots, kind="stable")
    ordered = np.ascontiguousarray(slots[order], dtype=np.int64)
    willneed_cold(table, ordered)
    scatter_rows(table, ordered, block[order])


def _rows_ok(table: np.ndarray, slots: np.ndarray, rows: np.ndarray) -> bool:
    """The layout the compiled row copies take: C-contiguous float32 [S, W] and [k, W], int64 slots."""
    return (table.dtype == np.float32 and rows.dtype == np.float32 and slots.dtype == np.int64 and table.ndim == 2
            and rows.shape == (slots.size, table.shape[1]) and table.flags.c_contiguous and rows.flags.c_contiguous
            and slots.flags.c_contiguous)


def tag_find(tags: np.ndarray, pos: np.ndarray, tag: np.ndarray, out: np.ndarray) -> None:
    """``out[i]`` (int64) = the first slot from ``pos[i]`` whose tag equals ``tag[i]``, or -1
    when an empty slot (or a whole turn) comes first. The caller verifies the ID stored in that
    slot (tags collide) and calls again from the slot after it."""
    if _native._core is not None:
        return _native._core.tag_find(tags, pos, tag, out)
    return _tag_find_py(tags, pos, tag, out)


def _tag_find_py(tags: np.ndarray, pos: np.ndarray, tag: np.ndarray, out: np.ndarray) -> None:
    _check_tags(tags, pos, tag, out)
    res = np.full(pos.size, -1, dtype=np.int64)
    active = np.arange(pos.size)
    at = np.asarray(pos, dtype=np.int64)
    want = np.asarray(tag, dtype=np.uint16)
    done = 0
    while active.size and done < tags.size:
        win, valid = _tag_window(tags, at, done)
        t = tags.take(win)
        match = (t == want.take(active)[:, None]) & valid
        stopped, hit, where = _first_stop(match | ((t == 0) & valid), match, win)
        res[active[hit]] = where[hit]
        active = active[~stopped]
        at = win[~stopped, -1] + 1
        at[at >= tags.size] = 0
        done += _WINDOW
    out[...] = res


def tag_claim(tags: np.ndarray, pos: np.ndarray, tag: np.ndarray, out: np.ndarray) -> int:
    """Claim for each of n absent, unique IDs the first free (empty or deleted) slot from
    ``pos[i]``, writing its tag ``tag[i]`` into ``tags``; ``out[i]`` (int64) = that slot. Returns
    the number of empty slots used. The caller keeps the load below 1 (a full table raises
    RuntimeError). As ``place``: the compiled loop claims in ID order, the fallback in rounds;
    the same slots end up taken, two IDs of one call may swap theirs."""
    if _native._core is not None:
        return _native._core.tag_claim(tags, pos, tag, out)
    return _tag_claim_py(tags, pos, tag, out)


def _tag_claim_py(tags: np.ndarray, pos: np.ndarray, tag: np.ndarray, out: np.ndarray) -> int:
    _check_tags(tags, pos, tag, out)
    want = np.asarray(tag, dtype=np.uint16)
    used = 0

    def claim(at: np.ndarray, winners: np.ndarray) -> None:
        nonlocal used
        used += int(np.count_nonzero(tags[at] == 0))
        tags[at] = want[winners]
        out[winners] = at

    _claim_rounds(np.asarray(pos), tags.size, lambda win: tags.take(win) <= 1, claim, "tag_claim: no free slot (table full)")
    return used
