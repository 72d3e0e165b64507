"""The single import site of ember's compiled core, and the one place that decides whether it runs.

Every kernel of the extension (``ember/_csrc/ember_native.c``) has exactly one public wrapper
here, of the same name and semantics, with its pure numpy/torch fallback ``_<name>_py`` written
right below it: same arguments, same results (where an insert lands in a hash table may differ
between the two, never what a lookup finds; each says so). The wrapper runs the compiled kernel
when the extension imports and the fallback otherwise, and splits a large call over threads
where the kernel releases the GIL. Callers (KeyIndex, the tiers, the initialisers, the sparse
gradients and optimizer) call the wrappers and keep no native/numpy branches of their own.

One switch: ``EMBER_NATIVE=0`` in the environment (read once, when this module is imported)
means the extension is never imported, for the whole process: ``is_available()`` is False,
``require()`` raises, and every wrapper runs its fallback. ``make test`` runs the embedding,
tiers, optim and checkpoint tests a second time that way. ``import ember`` never needs the
extension: without a C compiler it is simply not built (``require()`` then names the fix).

Kernels take explicit buffers: numpy arrays of the documented dtypes, C-contiguous; outputs
are written in place. ``ember/_ember_native.pyi`` types the extension's functions and
``tests/native/test_stub.py`` checks it against the C method table.

Example:
    >>> import numpy as np
    >>> uniq, inverse, counts = unique_segments(np.array([5, 3, 5, 7, 7]), np.array([0, 3, 5]))
    >>> uniq.tolist(), inverse.tolist(), counts.tolist()
    ([5, 3, 7], [0, 1, 0, 2, 2], [2, 1])
"""

from __future__ import annotations

import logging
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Callable, Sequence, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ember.mix import mix64
from ember import once

__all__ = [
    "arrow_hash_ints", "arrow_hash_strings", "arrow_parse_ints", "chunks", "csv_gather", "csv_hazards", "csv_split", "dense_floats", "featurize_ids",
    "index_add_features", "index_add_rows", "is_available", "place", "probe", "probe_rows", "read_rows", "record_width",
    "bf16_pack_sr", "cms", "even_chunks", "gather_rows", "gc_insert", "gc_release", "gc_requeue", "gc_reserve", "gc_scan", "gc_scores", "gc_select", "pair_find", "scatter_rows", "willneed", "willneed_cold", "disk_find", "disk_write", "require", "rowwise_adagrad_", "run_chunks", "tag_claim", "tag_find", "uniform01", "fresh_uniform", "unique_segments", "victim_keys",
    "write_rows",
]

# EMBER_NATIVE=0 when ember is imported: the extension is never imported (any other value, or
# none, imports it when it was built).
_DISABLED = os.environ.get("EMBER_NATIVE", "").strip() == "0"

_core: ModuleType | None
_import_error: ImportError | None
if _DISABLED:
    _core, _import_error = None, None
else:
    try:
        from ember import _ember_native as _core  # optional extension
    except ImportError as _e:  # built without a compiler, or not built yet
        _core, _import_error = None, _e
    else:
        _import_error = None


def is_available() -> bool:
    """True when the compiled core was built, imports, and ``EMBER_NATIVE=0`` did not turn it off."""
    return _core is not None


def require() -> ModuleType:
    """The compiled core, or an ImportError that says why it is missing and how to get it."""
    if _core is None:
        if _DISABLED:
            raise ImportError(
                "ember native core (ember._ember_native) is turned off: EMBER_NATIVE=0 was set in the "
                "environment when ember was imported (unset it to use the compiled kernels)"
            )
        raise ImportError(
            "ember native core (ember._ember_native) is not available "
            f"({_import_error}); reinstall with a C compiler present: pip install -e ."
        )
    return _core


# ---- running a kernel on several threads ---------------------------------------------------
# The kernels release the GIL, so independent parts of one call (tables, segments, row ranges)
# run on as many threads as torch may use (torch.get_num_threads(): the user's CPU budget).

MIN_PARALLEL_ROWS = 16384  # below this a hand-off to another thread (~30-50 us) does not pay
PROBE_PARALLEL_KEYS = 8192  # a probe waits on ~3 random reads per key: smaller shares pay
SCAN_PARALLEL_SLOTS = 1 << 17  # a victim scan's share of slots per thread (~0.3 ms of streaming)
_pool: tuple[int, int, ThreadPoolExecutor] | None = None  # (pid, workers, pool)
T = TypeVar("T")


def chunks(weights: Sequence[int] | np.ndarray, cuts: Sequence[bool] | None = None, min_rows: int | None = None) -> list[tuple[int, int]]:
    """Split items ``0..len(weights)`` into contiguous [lo, hi) ranges of about equal total weight,
    one per thread torch may use (one range when the total is below ``min_rows``, default
    ``MIN_PARALLEL_ROWS``).

    ``cuts[i]`` False forbids a range boundary before item i (items that must stay together).
    """
    w = np.asarray(weights, dtype=np.int64)
    n, total = w.size, int(w.sum())
    least = MIN_PARALLEL_ROWS if min_rows is None else min_rows
    k = min(torch.get_num_threads(), n, max(1, total // max(least, 1)))
    if k <= 1:
        return [(0, n)]
    ends = np.cumsum(w)
    bounds = [0]
    for j in range(1, k):
        i = int(np.searchsorted(ends, total * j / k)) + 1  # first item after the j-th share
        while cuts is not None and i < n and not cuts[i]:
            i += 1
        if bounds[-1] < i < n:
            bounds.append(i)
    bounds.append(n)
    return list(zip(bounds[:-1], bounds[1:]))


def even_chunks(n: int, min_rows: int) -> list[tuple[int, int]]:
    """Items ``0..n`` of equal weight in equal ranges of at least ``min_rows``, one per thread
    torch may use (``chunks`` of unit weights, computed without an array of them)."""
    k = min(torch.get_num_threads(), n, max(1, n // max(min_rows, 1)))
    bounds = [n * j // k for j in range(k + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def row_chunks(n: int) -> list[tuple[int, int]]:
    """Rows ``0..n`` of a row-by-row kernel in equal ranges, one per thread when there are at
    least ``2 * MIN_PARALLEL_ROWS`` of them, else one range."""
    return even_chunks(n, MIN_PARALLEL_ROWS) if n >= 2 * MIN_PARALLEL_ROWS else [(0, n)]


def run_chunks(fn: Callable[[int, int], T], parts: list[tuple[int, int]]) -> list[T]:
    """``[fn(lo, hi) for lo, hi in parts]``, the first on this thread, the others on a pool."""
    if len(parts) == 1:
        return [fn(*parts[0])]
    global _pool
    workers = max(1, torch.get_num_threads() - 1)
    if _pool is None or _pool[0] != os.getpid() or _pool[1] != workers:  # a forked child needs its own
        _pool = (os.getpid(), workers, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ember-kernel"))
    futures = [_pool[2].submit(fn, lo, hi) for lo, hi in parts[1:]]
    first = fn(*parts[0])
    return [first] + [f.result() for f in futures]


# ---- the key index (ember.tiers.key_index.KeyIndex) -------------------------------------------
# keys int64[cap], slots int32[cap] (-1 empty, -2 deleted), cap a power of two; the home bucket
# of an ID is mix64(id) & (cap - 1); linear probing. The numpy fallbacks work in rounds over
# all still-unresolved IDs of a batch, each looking at a window of _WINDOW buckets per ID.

_EMPTY, _DELETED = -1, -2
_WINDOW = 8
_STEPS = np.arange(_WINDOW, dtype=np.int64)


def _check_table(keys: np.ndarray, slots: np.ndarray) -> int:
    cap = keys.size
    if cap <= 0 or cap & (cap - 1) or slots.size != cap or keys.dtype != np.int64 or slots.dtype != np.int32:
        raise ValueError("ember native: keys/slots must be int64/int32 arrays of one power-of-two length")
    return cap - 1


def _home(ids: np.ndarray, mask: int) -> np.ndarray:
    return (mix64(np.asarray(ids, dtype=np.int64).view(np.uint64)) & np.uint64(mask)).astype(np.int64)


def _first_stop(stop: np.ndarray, match: np.ndarray, win: np.ndarray) -> tuple[np.ndarray, ...]:
    """For each row of probe windows [A, W]: whether the probe stopped in it, whether it stopped
    on a match, and the bucket where it stopped (the first ``stop`` of the row)."""
    first = stop.argmax(axis=1)
    r = np.arange(stop.shape[0])
    stopped = stop[r, first]
    return stopped, stopped & match[r, first], win[r, first]


def probe(keys: np.ndarray, slots: np.ndarray, ids: np.ndarray, out_bucket: np.ndarray, out_slot: np.ndarray) -> int:
    """Find each ID of ``ids`` (int64 [n], duplicates allowed) in the table ``keys``/``slots``:
    ``out_bucket`` (int64 [n]) gets its bucket, ``out_slot`` (int32 [n]) its slot, both -1 where
    absent. Returns the number found."""
    if _core is not None:
        return _core.probe(keys, slots, ids, out_bucket, out_slot)
    return _probe_py(keys, slots, ids, out_bucket, out_slot)


def _probe_py(keys: np.ndarray, slots: np.ndarray, ids: np.ndarray, out_bucket: np.ndarray, out_slot: np.ndarray) -> int:
    """numpy ``probe``. Round one checks each ID's home bucket (most IDs end there); later rounds
    check a window of ``_WINDOW`` consecutive buckets per ID, so linear probing's long tail costs
    a few rounds instead of one round per bucket."""
    mask = _check_table(keys, slots)
    ids = np.asarray(ids, dtype=np.int64)
    n = ids.size
    if out_bucket.size != n or out_slot.size != n:
        raise ValueError("ember native probe: output lengths do not match ids")
    bucket = out_bucket  # filled in place
    bucket[...] = -1
    home = _home(ids, mask)
    s = slots.take(home)
    hit = (s >= 0) & (keys.take(home) == ids)
    bucket[hit] = home[hit]
    active = np.flatnonzero(~hit & (s != _EMPTY))
    pos = home.take(active) + 1
    while active.size:
        win = (pos[:, None] + _STEPS) & mask  # [A, W]
        s = slots.take(win)
        hit = (s >= 0) & (keys.take(win) == ids.take(active)[:, None])
        stopped, is_hit, at = _first_stop(hit | (s == _EMPTY), hit, win)
        bucket[active[is_hit]] = at[is_hit]
        active = active[~stopped]
        pos = (pos[~stopped] + _WINDOW) & mask
    found = bucket >= 0
    out_slot[...] = -1
    out_slot[found] = slots.take(bucket[found])
    return int(np.count_nonzero(found))



def probe_rows(tables: Sequence[tuple[np.ndarray, np.ndarray]], ids: np.ndarray, bounds: np.ndarray,
               out_slot: np.ndarray, remove: bool = False) -> int:
    """Several tiers' probe in one pass (a table group's write): tier j's (keys, slots) over its
    segment ``ids[bounds[j]:bounds[j+1]]``; ``out_slot`` (int64 [n]) gets each ID's slot, -1 where
    absent. Counts no access. ``remove``: each found ID leaves its tier's index (its bucket
    marked deleted; a segment's IDs unique); the caller frees the slots. Returns the number found."""
    if _core is not None:
        return _core.probe_rows(tables, ids, bounds, out_slot, bool(remove))
    return _probe_rows_py(tables, ids, bounds, out_slot, remove)


def _probe_rows_py(tables: Sequence[tuple[np.ndarray, np.ndarray]], ids: np.ndarray, bounds: np.ndarray,
                   out_slot: np.ndarray, remove: bool = False) -> int:
    b = np.asarray(bounds, dtype=np.int64)
    n = ids.size
    if b.size != len(tables) + 1 or b[0] != 0 or b[-1] != n or (np.diff(b) < 0).any() or out_slot.size != n:
        raise ValueError("ember native probe_rows: bounds [T+1] over ids, out_slot [n]")
    found = 0
    for j, (keys, slots) in enumerate(tables):
        seg = ids[b[j] : b[j + 1]]
        bucket, s32 = np.empty(seg.size, np.int64), np.empty(seg.size, np.int32)
        found += _probe_py(keys, slots, seg, bucket, s32)
        out_slot[b[j] : b[j + 1]] = s32
        if remove:
            slots[bucket[bucket >= 0]] = _DELETED
    return found

def place(keys: np.ndarray, slots: np.ndarray, ids: np.ndarray, new_slots: np.ndarray) -> int:
    """Insert ``ids[i] -> new_slots[i]`` (int64 [n] absent, unique IDs; int32 [n]) into the table,
    each into the first free (empty or deleted) bucket from its home. Returns the number of
    empty buckets used (deleted ones reused do not count). The caller keeps the load below 1;
    a full table raises RuntimeError.

    The compiled loop places the IDs one after another; the fallback in rounds (one winner per
    contested bucket). Both fill the same set of buckets and either finds every ID the other
    placed, but two IDs of one call that compete for a bucket may end up swapped."""
    if _core is not None:
        return _core.place(keys, slots, ids, new_slots)
    return _place_py(keys, slots, ids, new_slots)


def _place_py(keys: np.ndarray, slots: np.ndarray, ids: np.ndarray, new_slots: np.ndarray) -> int:
    mask = _check_table(keys, slots)
    ids = np.asarray(ids, dtype=np.int64)
    if new_slots.size != ids.size:
        raise ValueError("ember native place: len(slots) != len(ids)")
    used = 0

    def claim(buckets: np.ndarray, winners: np.ndarray) -> None:
        nonlocal used
        used += int(np.count_nonzero(slots[buckets] == _EMPTY))
        slots[buckets] = new_slots[winners]
        keys[buckets] = ids[winners]

    # empty or deleted buckets are free: the IDs are known absent
    _claim_rounds(_home(ids, mask), mask + 1, lambda win: slots[win] < 0, claim, "place: index full (reserve room first)")
    return used


def _claim_rounds(pos: np.ndarray, size: int, is_free: Callable[[np.ndarray], np.ndarray],
                  claim: Callable[[np.ndarray, np.ndarray], None], full: str) -> None:
    """The fallbacks' linear-probing insert: ID i takes the first free bucket from ``pos[i]`` of a
    table of ``size`` buckets (wrapping around), in rounds over windows of ``_WINDOW`` buckets:
    one winner per contested bucket (the first ID), ``claim(buckets, winners)`` takes them;
    losers retry the same window, IDs whose window is full move on. ``is_free(win)``: bool [A, W]."""
    at = np.array(pos, dtype=np.int64)  # a copy: advanced per ID
    done = np.zeros(at.size, dtype=np.int64)  # buckets passed over, taken, per ID
    active = np.arange(at.size)
    while active.size:
        if int(done[active].max()) >= size:
            raise RuntimeError(f"ember native {full}")
        win = (at[active, None] + _STEPS) % size
        free = is_free(win) & (_STEPS < size - done[active, None])  # never look at a bucket twice
        first = free.argmax(axis=1)
        r = np.arange(active.size)
        has = free[r, first]
        target = win[r, first]
        cand = np.flatnonzero(has)
        won = np.zeros(active.size, dtype=bool)
        if cand.size:
            ub, pick = np.unique(target[cand], return_index=True)
            claim(ub, active[cand[pick]])
            won[cand[pick]] = True
        moved = active[~has]
        at[moved] = (at[moved] + _WINDOW) % size
        done[moved] += _WINDOW
        active = active[~won]


# ---- the disk tier's tags (ember.tiers.disk.DiskTier) ---------------------------------------
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


def bf16_pack_sr(records: np.ndarray, ids: np.ndarray, seeds: np.ndarray, steps: np.ndarray, dim: int,
                 out: np.ndarray) -> None:
    """A bf16 table's records (float32 [N, W], C-contiguous) packed into ``out`` (float32
    [N, (dim+1)//2 + W - dim]): the first ``dim`` columns rounded to bf16 stochastically with
    the noise of (``seeds[i]``, ``steps[i]``, ``ids[i]``, column) (int64 [N] each), two per word;
    the rest copied. One pass in the compiled core; bit-identical to the fallback here and to
    ``ember.embedding.codec``'s torch path (which runs on other devices)."""
    if _core is not None:
        core = _core

        def part(lo: int, hi: int) -> None:  # rows lo..hi-1, on several threads when there are many
            core.bf16_pack_sr(records[lo:hi], ids[lo:hi], seeds[lo:hi], steps[lo:hi], out[lo:hi], dim, records.shape[1])

        if not records.shape[0] == out.shape[0] == seeds.size == steps.size == ids.size:  # the core names what is wrong
            return core.bf16_pack_sr(records, ids, seeds, steps, out, dim, records.shape[1])
        run_chunks(part, row_chunks(ids.size))
        return None
    return _bf16_pack_sr_py(records, ids, seeds, steps, dim, out)


def _bf16_pack_sr_py(records: np.ndarray, ids: np.ndarray, seeds: np.ndarray, steps: np.ndarray, dim: int,
                     out: np.ndarray) -> None:
    n, width = records.shape
    half = (dim + 1) // 2
    if not 0 < dim <= width or out.shape != (n, half + width - dim) or not (ids.size == seeds.size == steps.size == n):
        raise ValueError("ember native bf16_pack_sr: records [N, width], ids/seeds/steps int64 [N], "
                         "out [N, (dim+1)//2 + width - dim], 0 < dim <= width")
    golden, m1 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9)
    key = mix64(mix64(seeds.view(np.uint64) * np.uint64(2) + np.uint64(0x5352)) ^ (steps.view(np.uint64) * golden))
    key = mix64(key ^ (ids.view(np.uint64) * m1))
    lanes = (dim + 3) // 4
    z = mix64(key[:, None] + np.arange(1, lanes + 1, dtype=np.uint64) * golden)  # [N, lanes]
    shifts = np.arange(4, dtype=np.uint64) * np.uint64(16)
    noise = ((z[:, :, None] >> shifts) & np.uint64(0xFFFF)).reshape(n, lanes * 4)[:, :dim].astype(np.uint32)
    v = _bf16_round_py(np.ascontiguousarray(records[:, :dim]).view(np.uint32), noise)
    if dim % 2:
        out[:, half - 1] = 0.0
    out.view(np.uint16)[:, :dim] = v
    out[:, half:] = records[:, dim:]


def _bf16_round_py(b: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """The bf16 bit patterns (uint16) of float32 bits ``b`` (uint32): the magnitude plus ``noise``
    (uint32, broadcast) truncated to its top 16 bits, the sign kept; NaN stays NaN (quiet, sign
    kept). The numpy form of the C core's ``bf16_round``: noise ``0x7FFF`` + the kept part's
    lowest bit rounds to nearest even, 16 random bits stochastically."""
    sign, mag = b & np.uint32(0x80000000), b & np.uint32(0x7FFFFFFF)
    v = ((sign | ((mag + noise) & np.uint32(0x7FFF0000))) >> np.uint32(16)).astype(np.uint16)
    nan = mag > np.uint32(0x7F800000)
    v[nan] = ((sign[nan] >> np.uint32(16)) | np.uint32(0x7FC0)).astype(np.uint16)
    return v


def _bf16_widen_py(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) -> their exact float32 values: the numpy form of the C core's
    ``widen_row``."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def gather_rows(src: np.ndarray, slots: np.ndarray, out: np.ndarray) -> None:
    """``out[:] = src[slots]`` (float32 rows [S, W] -> [k, W]), the GIL released while the rows
    are copied: rows of a memory-mapped disk tier may each be a page fault (a disk read), which
    under the GIL would stall the pipeline's other threads. Without the core (or for another
    layout), numpy's fancy indexing, which holds the GIL."""
    if _core is not None and _rows_ok(src, slots, out):
        return _core.gather_rows(src, slots, out, src.shape[1])
    return _gather_rows_py(src, slots, out)


def _gather_rows_py(src: np.ndarray, slots: np.ndarray, out: np.ndarray) -> None:
    out[...] = src[slots]


def scatter_rows(dst: np.ndarray, slots: np.ndarray, rows: np.ndarray) -> None:
    """``dst[slots] = rows`` (a later duplicate slot wins), the GIL released as in ``gather_rows``."""
    if _core is not None and _rows_ok(dst, slots, rows):
        return _core.scatter_rows(dst, slots, rows, dst.shape[1])
    return _scatter_rows_py(dst, slots, rows)


def _scatter_rows_py(dst: np.ndarray, slots: np.ndarray, rows: np.ndarray) -> None:
    dst[slots] = rows


def willneed(table: np.ndarray, slots: np.ndarray) -> int:
    """Ask the kernel to start reading the pages of rows ``slots`` (int64, sorted) of a
    memory-mapped ``table`` (float32 [S, W]) now, all at once (``madvise(MADV_WILLNEED)``), so
    the copy that follows does not take one page fault after another. Only a hint; returns the
    pages advised. Without the core, the same advice per page through the mapping's ``mmap``
    (numpy's private ``_mmap``; nothing for an array that is not a memory map)."""
    if _core is not None and table.dtype == np.float32 and table.ndim == 2 and table.flags.c_contiguous:
        return _core.willneed(table, np.ascontiguousarray(slots, dtype=np.int64), table.shape[1])
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
    if _core is not None and table.dtype == np.float32 and table.ndim == 2 and table.flags.c_contiguous:
        return _core.willneed_cold(table, np.ascontiguousarray(slots, dtype=np.int64), table.shape[1])
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
    candidates in file order after advising their pages not in memory (``willneed_cold``);
    the fallback in rounds of numpy ``tag_find`` + row gathers, logged once."""
    n = ids.size
    w = table.shape[1]
    if out_slot.shape != (n,) or out_slot.dtype != np.int64 or (out_rows is not None and out_rows.shape != (n, w - 2)):
        raise ValueError(f"disk_find: out_slot int64 [{n}] and out_rows [{n}, {w - 2}] or None")
    if (_core is not None and table.dtype == np.float32 and table.ndim == 2 and table.flags.c_contiguous
            and tags.dtype == np.uint16 and tags.flags.c_contiguous and out_slot.flags.c_contiguous
            and (out_rows is None or (out_rows.dtype == np.float32 and out_rows.flags.c_contiguous))):
        rows = np.empty((0, w - 2), np.float32) if out_rows is None else out_rows
        return _core.disk_find(tags, table, np.ascontiguousarray(ids, dtype=np.int64), out_slot, rows, w)
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


def disk_write(table: np.ndarray, slots: np.ndarray, ids: np.ndarray, recs: np.ndarray) -> None:
    """The disk tier's write: row ``slots[i]`` of the memory-mapped ``table`` (float32 [S, W])
    becomes ``[ids[i] as two words | recs[i]]`` (``recs`` float32 [k, W-2]), in file order after
    advising the pages not in memory (``willneed_cold``); a later duplicate slot wins. The core
    does it in one pass with the GIL released; the fallback builds the rows in numpy and
    scatters them (``scatter_rows``), logged once."""
    if (_core is not None and table.dtype == np.float32 and table.ndim == 2 and table.flags.c_contiguous
            and recs.dtype == np.float32 and recs.flags.c_contiguous):
        return _core.disk_write(table, np.ascontiguousarray(slots, dtype=np.int64),
                                np.ascontiguousarray(ids, dtype=np.int64), recs, table.shape[1])
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
    if _core is not None:
        return _core.tag_find(tags, pos, tag, out)
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
    if _core is not None:
        return _core.tag_claim(tags, pos, tag, out)
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


# ---- memory tiers, several in one call (ember.tiers.host.HostTier, a table group) -------------
# ``tables`` lists one tuple of numpy arrays per tier, its rows of ``ids`` are
# ``ids[bounds[j]:bounds[j+1]]``. read_rows: (keys, slots, arena, last, count); write_rows:
# (keys, slots, arena, last, count, slot_ids, held), with keys/slots a KeyIndex's arrays
# (int64/int32 [cap]), arena float32 [rows, r], last int64 [rows], count int32 [rows],
# slot_ids int64 [rows] and held bool [rows]. Tiers are independent: the wrappers split a call
# into runs of tiers of about equal rows, one per thread torch may use (``chunks``).
# ``dim`` > 0: the arenas hold a bf16 table's packed rows (``bf16_pack_sr``'s layout) and the
# caller's buffer their fp32 records, [n, dim + r - (dim+1)//2]: read_rows widens them (the
# codec's decode), write_rows packs them with tier j's rounding noise (``seeds[j]``, ``steps[j]``),
# so no packed copy of the batch is made.


def record_width(r: int, dim: int) -> int:
    """Floats per record in the caller's buffer of read_rows / write_rows: ``r`` words (``dim``
    0), or the decoded width of a bf16 row of ``r`` words holding ``dim`` weights; ValueError
    when ``dim`` weights do not fit ``r`` words."""
    if dim < 0 or (dim + 1) // 2 > r:
        raise ValueError(f"ember native: dim must be in [0, {2 * r}] for records of {r} words, got {dim}")
    return r if dim == 0 else dim + r - (dim + 1) // 2

def _check_segments(t: int, ids: np.ndarray, bounds: np.ndarray) -> None:
    if bounds.size != t + 1 or bounds[0] != 0 or bounds[t] != ids.size or bool((np.diff(bounds) < 0).any()):
        raise ValueError("bounds")


def _rows_of(buf: np.ndarray, n: int, r: int, what: str) -> np.ndarray:
    """``buf`` (C-contiguous, n * r floats) as a [n, r] view; a copy would lose the writes."""
    if not buf.flags.c_contiguous or buf.size != n * r:
        raise ValueError(f"ember native: {what} must be a C-contiguous float32 buffer of {n} x {r}")
    return buf.reshape(n, r)


def _split_tiers(kernel: Callable[..., int], tables: Sequence[tuple], ids: np.ndarray, bounds: np.ndarray,
                 per_row: tuple[np.ndarray, ...], per_tier: tuple[np.ndarray, ...], r: int, dim: int) -> int:
    """``kernel(tables, ids, bounds, *per_row, *per_tier, r, dim)`` on runs of tiers, several threads."""
    parts = chunks(np.diff(bounds))
    if len(parts) == 1:
        return kernel(tables, ids, bounds, *per_row, *per_tier, r, dim)

    def part(lo: int, hi: int) -> int:  # tiers lo..hi-1: rows a..b-1
        a, b = int(bounds[lo]), int(bounds[hi])
        return kernel(tables[lo:hi], ids[a:b], bounds[lo : hi + 1] - a, *(x[a:b] for x in per_row),
                      *(x[lo:hi] for x in per_tier), r, dim)

    return sum(run_chunks(part, parts))


def read_rows(tables: Sequence[tuple[np.ndarray, ...]], ids: np.ndarray, bounds: np.ndarray, out: np.ndarray,
              out_slot: np.ndarray, clocks: np.ndarray, out_hits: np.ndarray, r: int, dim: int = 0) -> int:
    """A memory tier's read for every tier j over its segment of ``ids`` (int64 [n]; ``bounds``
    int64 [T+1] from 0 to n): find each ID, copy its record from the arena into ``out``
    (float32 [n, r]; ``dim`` > 0: a bf16 table's packed rows widened into fp32 records
    [n, dim + r - (dim+1)//2], see above; rows of absent IDs are left as they are), note its slot in ``out_slot``
    (int64 [n], -1 absent) and count the access (``last[slot] = clocks[j]``,
    ``count[slot] += 1``, once per occurrence; not when ``clocks[j] < 0``: a tier that never
    evicts keeps no statistics). ``out_hits[j]`` (int64 [T]) = IDs of tier j found; returns
    the IDs found in all. ``tables[j] = (keys, slots, arena, last, count)``.

    Runs on several threads (runs of whole tiers) when the call is large enough."""
    if _core is not None:
        return _split_tiers(_core.read_rows, tables, ids, bounds, (_rows_of(out, ids.size, record_width(r, dim), "out"),
                            out_slot), (clocks, out_hits), r, dim)
    return _read_rows_py(tables, ids, bounds, out, out_slot, clocks, out_hits, r, dim)


def _read_rows_py(tables: Sequence[tuple[np.ndarray, ...]], ids: np.ndarray, bounds: np.ndarray, out: np.ndarray,
                  out_slot: np.ndarray, clocks: np.ndarray, out_hits: np.ndarray, r: int, dim: int = 0) -> int:
    t, n = len(tables), ids.size
    try:
        if r <= 0 or out_slot.size != n or clocks.size != t or out_hits.size != t:
            raise ValueError
        _check_segments(t, ids, bounds)
        rows_out = _rows_of(out, n, record_width(r, dim), "out")
    except ValueError:
        raise ValueError("ember native read_rows: bounds [T+1] over ids, out [n, W], out_slot [n], clocks/out_hits [T], "
                         "0 <= (dim+1)/2 <= R") from None
    if dim:  # the words into a scratch buffer, then the found rows widened (the others left as they are)
        words = np.zeros((n, r), dtype=np.float32)
        found = _read_rows_py(tables, ids, bounds, words, out_slot, clocks, out_hits, r)
        hit = np.flatnonzero(out_slot >= 0)
        half = (dim + 1) // 2
        rows_out[hit, :dim] = _bf16_widen_py(words[hit].view(np.uint16)[:, :dim])
        rows_out[hit, dim:] = words[hit, half:]
        return found
    for j, tb in enumerate(tables):
        if not isinstance(tb, tuple) or len(tb) != 5:
            raise ValueError(f"ember native: tables[{j}] must be a tuple of 5 arrays")
        keys, slots, arena, last, count = tb
        _check_table(keys, slots)
        if arena.size % r or last.size < arena.size // r or count.size < arena.size // r:
            raise ValueError(f"ember native read_rows: tier {j}: arena [rows, R], last/count [rows]")
    found = 0
    for j, (keys, slots, arena, last, count) in enumerate(tables):
        a, b = int(bounds[j]), int(bounds[j + 1])
        nrows = arena.size // r
        slot = np.empty(b - a, dtype=np.int32)
        _probe_py(keys, slots, ids[a:b], np.empty(b - a, dtype=np.int64), slot)
        if b > a and int(slot.max()) >= nrows:
            raise IndexError("ember native read_rows: a slot lies outside the arena")
        out_slot[a:b] = slot
        hit = np.flatnonzero(slot >= 0)
        s = slot.take(hit)
        rows_out[a + hit] = arena.reshape(nrows, r)[s]
        if clocks[j] >= 0:
            last[s] = clocks[j]
            np.add.at(count, s, 1)  # an ID read twice counts twice
        out_hits[j] = hit.size
        found += hit.size
    return found


def write_rows(tables: Sequence[tuple[np.ndarray, ...]], ids: np.ndarray, bounds: np.ndarray, slot: np.ndarray,
               records: np.ndarray, next: np.ndarray, clocks: np.ndarray, used: np.ndarray, free_at: np.ndarray,
               r: int, dim: int = 0, seeds: np.ndarray | None = None, steps: np.ndarray | None = None) -> int:
    """A memory tier's put for every tier j over its segment of ``ids`` (int64 [n]; ``bounds``
    int64 [T+1] from 0 to n): rows with ``slot[i] >= 0`` (int64 [n]) are overwritten; rows with
    ``slot[i] < 0`` (absent, unique IDs) get the slot ``free[free_at[j]]`` (then ``free_at[j]
    += 1``) while tier j's free list lasts (int32: slots of removed rows, taken from its front as
    ``HostTier._allocate`` takes them), then ``next[j]`` (then ``next[j] += 1``; written back to
    ``slot[i]``), an index bucket (``place``), ``slot_ids = ID``, ``held = 1``,
    ``last = clocks[j]``, ``count = 1``; then ``arena[slot[i]] = records[i]`` (float32 [n, r]).
    ``used[j]`` (int64 [T]) = empty index buckets consumed; returns the rows inserted in all.
    ``tables[j] = (keys, slots, arena, last, count, slot_ids, held, free)``.

    The caller reserved room (``next[j]`` + new rows beyond the free list <= arena rows, index
    load below 1); else ValueError before anything is written. Runs on several threads (runs
    of whole tiers) when the call is large enough. The fallback places new IDs as ``_place_py``
    does: the same buckets are taken, either implementation reads the other's tables.
    ``dim`` > 0: ``records`` are a bf16 table's fp32 records [n, dim + r - (dim+1)//2], packed
    into the arenas with tier j's noise (``seeds[j]``, ``steps[j]``, int64 [T]) as
    ``bf16_pack_sr`` packs them."""
    empty = np.empty(0, dtype=np.int64)
    seeds = empty if seeds is None else seeds
    steps = empty if steps is None else steps
    if dim and (seeds.size != len(tables) or steps.size != len(tables)):  # before a split could write a part
        raise ValueError("ember native write_rows: seeds/steps [T] when dim > 0")
    if _core is not None:
        return _split_tiers(_core.write_rows, tables, ids, bounds,
                            (slot, _rows_of(records, ids.size, record_width(r, dim), "records")),
                            (next, clocks, used, free_at) + ((seeds, steps) if dim else (empty, empty)), r, dim)
    return _write_rows_py(tables, ids, bounds, slot, records, next, clocks, used, free_at, r, dim, seeds, steps)


def _write_rows_py(tables: Sequence[tuple[np.ndarray, ...]], ids: np.ndarray, bounds: np.ndarray, slot: np.ndarray,
                   records: np.ndarray, next: np.ndarray, clocks: np.ndarray, used: np.ndarray, free_at: np.ndarray,
                   r: int, dim: int = 0, seeds: np.ndarray | None = None, steps: np.ndarray | None = None) -> int:
    t, n = len(tables), ids.size
    try:
        if r <= 0 or slot.size != n or next.size != t or clocks.size != t or used.size != t or free_at.size != t:
            raise ValueError
        _check_segments(t, ids, bounds)
        recs = _rows_of(records, n, record_width(r, dim), "records")
        if dim and (seeds is None or steps is None or seeds.size != t or steps.size != t):
            raise ValueError
    except ValueError:
        raise ValueError("ember native write_rows: bounds [T+1] over ids, slot [n], records [n, W], "
                         "next/clocks/used/free_at [T], seeds/steps [T] when dim > 0, 0 <= (dim+1)/2 <= R") from None
    if dim:  # packed first (the noise of each row's tier), then written as words
        sizes = np.diff(bounds)
        words = np.empty((n, r), dtype=np.float32)
        _bf16_pack_sr_py(recs, np.ascontiguousarray(ids, dtype=np.int64), np.repeat(np.asarray(seeds, np.int64), sizes),
                         np.repeat(np.asarray(steps, np.int64), sizes), dim, words)
        return _write_rows_py(tables, ids, bounds, slot, words, next, clocks, used, free_at, r)
    for j, tb in enumerate(tables):  # room and sizes, before writing anything
        if not isinstance(tb, tuple) or len(tb) != 8:
            raise ValueError(f"ember native: tables[{j}] must be a tuple of 8 arrays")
        keys, slots, arena, last, count, slot_ids, held, free = tb
        _check_table(keys, slots)
        nrows = arena.size // r
        seg = slot[bounds[j] : bounds[j + 1]]
        if seg.size and int(seg.max()) >= nrows:
            raise IndexError("ember native write_rows: a slot lies outside the arena")
        fresh = int(np.count_nonzero(seg < 0))
        if free_at[j] < 0 or free_at[j] > free.size:
            raise ValueError(f"ember native write_rows: tier {j}'s free_at lies outside its free list")
        reuse = free[int(free_at[j]) : int(free_at[j]) + fresh]
        if reuse.size and (int(reuse.min()) < 0 or int(reuse.max()) >= nrows):
            raise IndexError("ember native write_rows: a free slot lies outside the arena")
        beyond = fresh - reuse.size
        if (arena.size % r or min(last.size, count.size, slot_ids.size, held.size) < nrows
                or next[j] < 0 or next[j] + beyond > nrows):
            raise ValueError(f"ember native write_rows: tier {j} has no room for {fresh} new rows")
    inserted = 0
    for j, (keys, slots, arena, last, count, slot_ids, held, free) in enumerate(tables):
        a, b = int(bounds[j]), int(bounds[j + 1])
        seg = slot[a:b]  # a view: new slots are written back
        new = np.flatnonzero(seg < 0)
        used[j] = 0
        if new.size:
            reuse = free[int(free_at[j]) : int(free_at[j]) + new.size].astype(np.int64)
            v = np.concatenate([reuse, int(next[j]) + np.arange(new.size - reuse.size, dtype=np.int64)])
            x = ids[a:b].take(new)
            used[j] = _place_py(keys, slots, x, v.astype(np.int32))
            slot_ids[v] = x
            held[v] = 1
            last[v] = clocks[j]
            count[v] = 1
            seg[new] = v
            free_at[j] += reuse.size
            next[j] += new.size - reuse.size
            inserted += new.size
        _rows_of(arena, arena.size // r, r, "arena")[seg] = recs[a:b]
    return inserted


# ---- deduplication (ember.embedding.collection) ---------------------------------------------

def unique_segments(ids: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Deduplicate each segment ``ids[bounds[j]:bounds[j+1]]`` on its own.

    Returns ``(uniq, inverse, counts)``: the unique IDs of every segment one after another
    (first-occurrence order within a segment), the index of each ID in ``uniq`` (already
    shifted by the uniques of earlier segments), and the number of uniques per segment.
    Runs on several threads (runs of whole segments) when the call is large enough.

    Args:
        ids: int64 [N].
        bounds: int64 [S+1], non-decreasing, from 0 to N.
    """
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    bounds = np.ascontiguousarray(bounds, dtype=np.int64)
    core = _core
    if core is None:
        return _unique_segments_py(ids, bounds)
    uniq = np.empty_like(ids)
    inverse = np.empty_like(ids)
    counts = np.empty(bounds.size - 1, dtype=np.int64)

    def part(lo: int, hi: int) -> int:  # segments lo..hi-1, numbered from their first value
        a, b = int(bounds[lo]), int(bounds[hi])
        return core.unique_segments(ids[a:b], bounds[lo : hi + 1] - a, uniq[a:b], inverse[a:b], counts[lo:hi])

    parts = chunks(np.diff(bounds))
    totals = run_chunks(part, parts)
    if len(parts) == 1:
        return uniq[: totals[0]], inverse, counts
    pieces, shift = [], 0  # each part's uniques were written from its first value: close the gaps
    for (lo, hi), total in zip(parts, totals):
        a, b = int(bounds[lo]), int(bounds[hi])
        pieces.append(uniq[a : a + total])
        if shift:
            inverse[a:b] += shift
        shift += total
    return np.concatenate(pieces), inverse, counts


def _unique_segments_py(ids: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    bounds = np.ascontiguousarray(bounds, dtype=np.int64)
    uniqs, inverses, counts = [], [], []
    total = 0
    for j in range(bounds.size - 1):
        seg = torch.from_numpy(ids[bounds[j] : bounds[j + 1]])
        u, inv = torch.unique(seg, sorted=True, return_inverse=True)
        # first-occurrence order, as the native kernel: rank the sorted uniques by first position
        first = torch.full((u.numel(),), seg.numel(), dtype=torch.int64).scatter_reduce_(
            0, inv, torch.arange(seg.numel()), reduce="amin"
        )
        order = torch.argsort(first)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel())
        uniqs.append(u[order].numpy())
        inverses.append((rank[inv] + total).numpy())
        counts.append(u.numel())
        total += u.numel()
    cat = lambda parts: np.concatenate(parts) if parts else np.empty(0, np.int64)  # noqa: E731
    return cat(uniqs), cat(inverses), np.asarray(counts, dtype=np.int64)


# ---- hashing categorical values from Arrow buffers (ember.featurize.hashing) ------------------
# An Arrow array's buffers as they are (pyarrow.Buffer, or any bytes-like object): validity a
# bitmap (bit off+i set = value i present; b"" = no nulls), string offsets int32 (width 4) or
# int64 (width 8) and their bytes, or fixed-width integers. Nothing passes through Python
# objects. A null is hashed as 0 / "" and flagged in out_valid; the hash is hashing.py's.

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MASK64 = (1 << 64) - 1
_LONG_BYTES = 4096  # strings longer than this are hashed one by one (see hash_utf8_buffers)


def _mix64_int(z: int) -> int:
    """``mix64`` of one Python int (for the word loop of a single long string)."""
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & _MASK64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def hash_utf8_buffers(offsets: np.ndarray, data: np.ndarray, salt: np.uint64, long_bytes: int = _LONG_BYTES) -> np.ndarray:
    """Hash each string ``data[offsets[i]:offsets[i+1]]`` with numpy: ``h = mix64(salt ^
    (len+1)*golden)``, then ``h = mix64(h ^ word)`` over its little-endian 8-byte words (the last
    zero-padded). The reference of the string kernel (and ``hash_strings``'s own path).

    Strings are hashed side by side, one numpy step per word position, so the steps number the
    longest string's words. A string over ``long_bytes`` (a 2 MiB token in a CSV line) would make
    that hundreds of thousands of steps for one value: those are hashed one by one with Python
    ints instead (same result, about 1 s per 4 MiB), and the shared steps stop at ``long_bytes``.
    """
    starts = offsets[:-1].astype(np.int64)
    lens = (offsets[1:] - offsets[:-1]).astype(np.int64)
    h = mix64(salt ^ ((lens.astype(np.uint64) + np.uint64(1)) * _GOLDEN))
    if lens.size == 0:
        return h.view(np.int64)
    long = lens > long_bytes
    nwords = np.where(long, 0, (lens + 7) // 8)
    padded = np.concatenate([data, np.zeros(8, dtype=np.uint8)])
    # words[i] is the little-endian uint64 made of bytes i..i+7: an unaligned strided view, so
    # gathering one word per string is a single fancy-index.
    words = np.ndarray((padded.size - 7,), dtype="<u8", buffer=padded, strides=(1,))
    for j in range(int(nwords.max())):
        active = np.flatnonzero(nwords > j) if j else np.flatnonzero(nwords > 0)
        word = words[starts[active] + 8 * j].astype(np.uint64)
        remaining = lens[active] - 8 * j
        short = remaining < 8  # bytes past the end of the string belong to the next one
        if short.any():
            keep = (np.uint64(1) << (remaining[short].astype(np.uint64) * np.uint64(8))) - np.uint64(1)
            word[short] &= keep
        h[active] = mix64(h[active] ^ word)
    for i in np.flatnonzero(long):
        a, n = int(starts[i]), int(lens[i])
        chunk = np.zeros(-(-n // 8) * 8, dtype=np.uint8)
        chunk[:n] = data[a : a + n]
        z = int(h[i])
        for w in chunk.view("<u8").tolist():
            z = _mix64_int(z ^ w)
        h[i] = np.uint64(z)
    return h.view(np.int64)


def _present(validity: object, off: int, n: int) -> np.ndarray:
    """bool [n]: the validity bitmap's bits off..off+n-1 (all True for an empty bitmap)."""
    bits = np.frombuffer(validity, np.uint8)  # type: ignore[call-overload]
    if bits.size == 0:
        return np.ones(n, dtype=bool)
    if bits.size * 8 < off + n:
        raise ValueError("arrow hash: the validity bitmap is shorter than off + n bits")
    return np.unpackbits(bits, count=off + n, bitorder="little")[off:].astype(bool)


def _check_out(n: int, out: np.ndarray, out_valid: np.ndarray) -> None:
    if out.dtype != np.int64 or out.shape != (n,) or out_valid.dtype != np.bool_ or out_valid.shape != (n,):
        raise ValueError("arrow hash: out must be int64 [n] and out_valid bool [n]")


def arrow_hash_strings(offsets: object, data: object, validity: object, off: int, n: int, width: int, salt: int,
                       out: np.ndarray, out_valid: np.ndarray) -> int:
    """Hash the n strings of an Arrow (large_)string or binary array from its buffers into
    ``out`` (int64 [n]) and flag its present values in ``out_valid`` (bool [n]); returns the
    number of nulls. ``offsets``: int32 (``width`` 4) or int64 (8) offsets, from element ``off``;
    ``data``: the bytes (b"" when there are none); ``validity``: the bitmap or b"".
    Runs on several threads when the call is large enough."""
    _check_out(n, out, out_valid)
    core = _core
    if core is None:
        return _arrow_hash_strings_py(offsets, data, validity, off, n, width, salt, out, out_valid)

    def part(lo: int, hi: int) -> int:
        return core.arrow_hash_strings(offsets, data, validity, off + lo, hi - lo, width, salt, out[lo:hi], out_valid[lo:hi])

    return sum(run_chunks(part, row_chunks(n)))


def _arrow_hash_strings_py(offsets: object, data: object, validity: object, off: int, n: int, width: int, salt: int,
                           out: np.ndarray, out_valid: np.ndarray) -> int:
    # the reference: each distinct value hashed once (dictionary encoding), with numpy
    _check_out(n, out, out_valid)
    present = _present(validity, off, n)
    arr = _binary_from_buffers("arrow_hash_strings", offsets, data, off, n, width)
    key = np.uint64(salt)
    if not present.all():  # a null is hashed as ""
        arr = pc.if_else(pa.array(present), arr, pa.scalar(b"", arr.type))
    enc = pc.dictionary_encode(arr)
    dic = enc.dictionary
    bufs = dic.buffers()
    doffs = np.frombuffer(bufs[1], np.int64 if width == 8 else np.int32)[dic.offset : dic.offset + len(dic) + 1].astype(np.int64)
    ddata = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    if len(dic):
        ddata, doffs = ddata[int(doffs[0]) : int(doffs[-1])], doffs - doffs[0]
    ids = hash_utf8_buffers(doffs, ddata, key)
    out[:] = ids[enc.indices.to_numpy(zero_copy_only=False)] if n else 0
    out_valid[:] = present
    return int(n - present.sum())


def arrow_hash_ints(values: object, validity: object, off: int, n: int, width: int, signed: bool, salt: int,
                    out: np.ndarray, out_valid: np.ndarray) -> int:
    """Hash the n integers of an Arrow integer array (``width`` 1, 2, 4 or 8 bytes, ``signed``
    or not; sign- or zero-extended to 64 bits) from its buffers: ``mix64(v ^ salt)`` into
    ``out`` (int64 [n]), present values flagged in ``out_valid``; returns the number of nulls."""
    _check_out(n, out, out_valid)
    core = _core
    if core is None:
        return _arrow_hash_ints_py(values, validity, off, n, width, signed, salt, out, out_valid)

    def part(lo: int, hi: int) -> int:
        return core.arrow_hash_ints(values, validity, off + lo, hi - lo, width, signed, salt, out[lo:hi], out_valid[lo:hi])

    return sum(run_chunks(part, row_chunks(n)))


def _arrow_hash_ints_py(values: object, validity: object, off: int, n: int, width: int, signed: bool, salt: int,
                        out: np.ndarray, out_valid: np.ndarray) -> int:
    _check_out(n, out, out_valid)
    if width not in (1, 2, 4, 8):
        raise ValueError("arrow_hash_ints: width must be 1, 2, 4 or 8 bytes")
    present = _present(validity, off, n)
    v = np.frombuffer(values, np.dtype(f"{'i' if signed else 'u'}{width}"), count=off + n)[off:]  # type: ignore[call-overload]
    v = np.where(present, v.astype(np.int64), 0)  # sign- or zero-extended; uint64 keeps its bits
    out[:] = mix64(v.view(np.uint64) ^ np.uint64(salt)).view(np.int64)
    out_valid[:] = present
    return int(n - present.sum())


_INT_TOKEN = r"^-?\d{1,19}$"


def arrow_parse_ints(offsets: object, data: object, validity: object, off: int, n: int, width: int, out: np.ndarray,
                     state: np.ndarray) -> int:
    """Decimal integer IDs from an Arrow string array's buffers (as ``arrow_hash_strings`` takes
    them) into ``out`` (int64 [n]), with ``state`` (uint8 [n]) 0 for an ID (``-?`` and 1-19
    digits, within int64), 1 for a missing value (null or empty), 2 for a bad one (``out`` 0
    then). Returns the number of bad values, or -1 when a present value holds a byte other than
    a digit or ``-`` (blanks, ``+``, ...): the caller then parses the column its general way."""
    if out.dtype != np.int64 or out.shape != (n,) or state.dtype != np.uint8 or state.shape != (n,):
        raise ValueError("arrow_parse_ints: out must be int64 [n] and state uint8 [n]")
    if _core is None:
        return _arrow_parse_ints_py(offsets, data, validity, off, n, width, out, state)
    return _core.arrow_parse_ints(offsets, data, validity, off, n, width, out, state)


def _arrow_parse_ints_py(offsets: object, data: object, validity: object, off: int, n: int, width: int, out: np.ndarray,
                         state: np.ndarray) -> int:
    present = _present(validity, off, n)
    arr = _binary_from_buffers("arrow_parse_ints", offsets, data, off, n, width)
    plain = np.asarray(pc.match_substring_regex(arr, r"^[-0-9]*$"), dtype=bool)
    if (present & ~plain).any():
        return -1
    missing = ~present | (np.asarray(pc.binary_length(arr), dtype=np.int64) == 0)
    ok = np.asarray(pc.match_substring_regex(arr, _INT_TOKEN), dtype=bool) & ~missing
    for i in np.flatnonzero(ok & (np.asarray(pc.binary_length(arr), dtype=np.int64) >= 19)):
        ok[i] = -(2**63) <= int(arr[int(i)].as_py()) < 2**63  # 19 digits may pass int64's range
    text = pc.if_else(pa.array(ok), arr, pa.scalar(b"0", arr.type)).cast(pa.large_string() if width == 8 else pa.string())
    out[:] = np.asarray(pc.cast(text, pa.int64()), dtype=np.int64)
    state[:] = np.where(missing, 1, np.where(ok, 0, 2))
    return int((state == 2).sum())


def featurize_ids(columns: list[tuple], n: int, out_values: np.ndarray, out_lengths: np.ndarray,
                  out_offsets: np.ndarray, out_counts: np.ndarray) -> int:
    """The single-valued sparse columns of one record batch in one pass over their Arrow buffers
    (``ember.featurize.featurizer``). Each column is ``(kind, values, data, validity, off, width,
    signed, hash, salt, listed)``: kind 0 an integer array (``values`` its ``width``-byte
    integers, ``signed`` or not, ``data`` b""), kind 1 a hashed (large_)string or binary array,
    kind 2 a string array of decimal integer IDs, not hashed (``values`` its int32/int64 offsets,
    ``width`` 4 or 8, ``data`` its bytes); ``validity`` the bitmap or b"", ``off`` the array's
    offset. A value is kept unless null, ``listed`` (a tuple of bytes for kinds 1 and 2; of
    integers for kind 0, compared as the 64-bit pattern of the sign- or zero-extended value) or,
    for kind 2, empty; it becomes ``hash`` ? its ID (``arrow_hash_strings`` / ``arrow_hash_ints``
    with ``salt``) : the integer (kind 2: as ``arrow_parse_ints`` reads it). Column c's kept
    values go to ``out_values`` (int64 [>= C * n]) after those of the columns before it,
    ``out_counts[c]`` of them; ``out_lengths`` (int64 [C * n]) gets each row's 0 or 1,
    ``out_offsets`` (int64 [C, n + 1]) their running sums. A kind 2 column with a value that is
    no ID (a byte other than 0-9 and ``-``, or a bad ID; listed values aside) is declined:
    ``out_counts[c]`` = -1, nothing of it kept (its lengths and offsets are left undefined), for
    the caller's general path. Returns the values kept."""
    c = len(columns)
    if (out_values.dtype != np.int64 or out_values.size < c * n or out_lengths.dtype != np.int64
            or out_lengths.shape != (c * n,) or out_offsets.dtype != np.int64 or out_offsets.shape != (c, n + 1)
            or out_counts.dtype != np.int64 or out_counts.shape != (c,)):
        raise ValueError("featurize_ids: out_values int64 [>= C * n], out_lengths int64 [C * n], "
                         "out_offsets int64 [C, n + 1], out_counts int64 [C]")
    if _core is None:
        return _featurize_ids_py(columns, n, out_values, out_lengths, out_offsets, out_counts)
    return int(_core.featurize_ids(columns, n, out_values, out_lengths, out_offsets, out_counts))


def _featurize_ids_py(columns: list[tuple], n: int, out_values: np.ndarray, out_lengths: np.ndarray,
                      out_offsets: np.ndarray, out_counts: np.ndarray) -> int:
    total = 0
    ids, valid = np.empty(n, np.int64), np.empty(n, np.bool_)
    for c, (kind, values, data, validity, off, width, signed, hashed, salt, listed) in enumerate(columns):
        if kind == 2:
            if hashed:
                raise ValueError("featurize_ids: a column of integer IDs as text (kind 2) is not hashed")
            present = _present(validity, off, n)
            arr = _binary_from_buffers("featurize_ids", values, data, off, n, width)
            listed_mask = np.zeros(n, bool)
            if listed:
                listed_mask = np.asarray(pc.fill_null(pc.is_in(arr, value_set=pa.array(list(listed), arr.type)), False), dtype=bool)
            empty = np.asarray(pc.binary_length(arr), dtype=np.int64) == 0
            asked = present & ~listed_mask & ~empty
            if not asked.any():
                valid[:] = False
                ids[:] = 0
            else:
                ok = np.asarray(pc.fill_null(pc.match_substring_regex(arr, _INT_TOKEN), False), dtype=bool)
                for i in np.flatnonzero(ok & asked & (np.asarray(pc.binary_length(arr), dtype=np.int64) >= 19)):
                    ok[i] = -(2**63) <= int(arr[int(i)].as_py()) < 2**63  # 19 digits may pass int64's range
                if (asked & ~ok).any():  # not an ID: the caller's general path judges the column
                    out_counts[c] = -1
                    continue
                text = pc.if_else(pa.array(asked), arr, pa.scalar(b"0", arr.type))
                ids[:] = np.asarray(pc.cast(text.cast(pa.large_string() if width == 8 else pa.string()), pa.int64()),
                                    dtype=np.int64)
                valid[:] = asked
        elif kind == 1:
            if not hashed:
                raise ValueError("featurize_ids: a string column (kind 1) must be hashed")
            _arrow_hash_strings_py(values, data, validity, off, n, width, salt, ids, valid)
            if listed:
                arr = _binary_from_buffers("featurize_ids", values, data, off, n, width)
                valid &= ~np.asarray(pc.fill_null(pc.is_in(arr, value_set=pa.array(list(listed), arr.type)), False), dtype=bool)
        elif kind == 0:
            if width not in (1, 2, 4, 8):
                raise ValueError("featurize_ids: an integer column's width must be 1, 2, 4 or 8 bytes")
            present = _present(validity, off, n)
            v = np.frombuffer(values, np.dtype(f"{'i' if signed else 'u'}{width}"), count=off + n)[off:]  # type: ignore[call-overload]
            bits = v.astype(np.int64).view(np.uint64)  # sign- or zero-extended; uint64 keeps its bits
            valid[:] = present
            if listed:
                valid &= ~np.isin(bits, np.array([x & (2**64 - 1) for x in listed], np.uint64))
            ids[:] = mix64(bits ^ np.uint64(salt)).view(np.int64) if hashed else bits.view(np.int64)
        else:
            raise ValueError(f"featurize_ids: column kind must be 0 (integers), 1 (hashed strings) or 2 (integer IDs as "
                             f"text), got {kind}")
        kept = ids[valid]
        out_values[total : total + kept.size] = kept
        out_lengths[c * n : (c + 1) * n] = valid
        out_offsets[c, 0] = 0
        np.cumsum(valid, out=out_offsets[c, 1:])
        out_counts[c] = kept.size
        total += kept.size
    return total


def dense_floats(columns: list[tuple], n: int, out: np.ndarray, out_done: np.ndarray) -> int:
    """Integer columns, and string columns of plain integers and empty fields (CSV counts), as
    float64 in one call, as ``parse_floats`` reads them: each column ``(kind, values, data,
    validity, off, width, signed, row)``: kind 0 an integer array (``values`` its
    ``width``-byte integers, ``data`` b""), kind 1 a string array (its offsets of ``width`` 4
    or 8 and bytes, as ``arrow_parse_ints`` takes them); ``row``: its row of ``out`` (float64
    [R, n]). An integer is rounded to float64 (numpy's ``astype``); a string ``-?`` and 1-19
    digits within int64 likewise (``-0`` is -0.0, as a decimal parse makes it); a null or empty
    value is NaN. A string column holding any other value is not done (``out_done[c]`` = 0, its
    row undefined), for the caller's general parse. Returns the columns done."""
    if out.dtype != np.float64 or out.ndim != 2 or out.shape[1] != n or not out.flags.c_contiguous \
            or out_done.dtype != np.uint8 or out_done.shape != (len(columns),):
        raise ValueError("dense_floats: out float64 [R, n] (C-contiguous), out_done uint8 [C]")
    if _core is None:
        return _dense_floats_py(columns, n, out, out_done)
    return int(_core.dense_floats(columns, n, out, out_done))


def _dense_floats_py(columns: list[tuple], n: int, out: np.ndarray, out_done: np.ndarray) -> int:
    x, state = np.empty(n, np.int64), np.empty(n, np.uint8)
    for c, (kind, offsets, data, validity, off, width, signed, row) in enumerate(columns):
        if kind == 0:
            v = np.frombuffer(offsets, np.dtype(f"{'i' if signed else 'u'}{width}"), count=off + n)[off:]  # type: ignore[call-overload]
            out[row] = np.where(_present(validity, off, n), v.astype(np.float64), np.nan)
            out_done[c] = 1
            continue
        if _arrow_parse_ints_py(offsets, data, validity, off, n, width, x, state) < 0 or (state == 2).any():
            out_done[c] = 0
            continue
        values = x.astype(np.float64)
        values[state == 1] = np.nan
        zeros = np.flatnonzero((x == 0) & (state == 0))
        if zeros.size:  # "-0": -0.0
            starts = np.frombuffer(offsets, np.int64 if width == 8 else np.int32, count=off + n + 1)[off + zeros]  # type: ignore[call-overload]
            values[zeros[np.frombuffer(data, np.uint8)[starts] == ord("-")]] = -0.0  # type: ignore[call-overload]
        out[row] = values
        out_done[c] = 1
    return int(out_done.sum())


CSV_HEX, CSV_PAREN, CSV_LONG_DIGITS = 1, 2, 4  # csv_hazards' flags


def csv_hazards(data: bytes) -> int:
    """What in a block of CSV text pyarrow's typed CSV read would take differently from ember's
    text path (``ember.source.csv``), as flags: ``CSV_HEX`` an ``x`` or ``X`` byte (Arrow reads
    ``0x1f`` as an integer, the text path as no integer), ``CSV_PAREN`` a ``(`` (Arrow reads
    ``nan(1)`` as NaN even beside a blank-padded number, the text path then as no number),
    ``CSV_LONG_DIGITS`` a run of 20 or more ASCII digits (Arrow reads zero-padded integers of any
    length, the text path at most 19 digits). One pass over the bytes."""
    if _core is None:
        return _csv_hazards_py(data)
    return int(_core.csv_hazards(data))


def _csv_hazards_py(data: bytes) -> int:
    flags = (CSV_HEX if b"x" in data or b"X" in data else 0) | (CSV_PAREN if b"(" in data else 0)
    b = np.frombuffer(data, dtype=np.uint8)
    other = np.flatnonzero((b - np.uint8(ord("0"))) > 9)  # uint8 wraps: every byte but a digit
    bounds = np.concatenate([[-1], other, [b.size]])
    if b.size and int(np.diff(bounds).max()) - 1 >= 20:
        flags |= CSV_LONG_DIGITS
    return flags


def csv_split(data: object, delimiter: int, ncols: int, slots: np.ndarray, n: int, out_starts: np.ndarray,
              out_offsets: np.ndarray) -> int:
    """The fields of a block of ``n`` CSV lines without quotes or CRs (``ember.source.csv``),
    split as pyarrow splits such text: each line ends with ``\\n`` and holds ``ncols`` fields
    separated by the ``delimiter`` byte. ``slots`` (int64 [ncols]): each field's output slot, -1
    for none; field i of slot s starts at ``out_starts[s * n + i]`` (int32) in ``data``, and
    ``out_offsets[s]`` (int32 [k, n + 1]) gets the running sums of its fields' lengths from 0.
    Returns ``n``, or -1 when a line holds another number of fields, there are not ``n`` lines,
    or ``data`` does not end with ``\\n``. One pass, eight bytes a step between separators."""
    if out_starts.dtype != np.int32 or out_offsets.dtype != np.int32 or slots.dtype != np.int64:
        raise ValueError("csv_split: slots int64 [ncols], out_starts int32 [k * n], out_offsets int32 [k, n + 1]")
    if _core is None:
        return _csv_split_py(data, delimiter, ncols, slots, n, out_starts, out_offsets)
    return int(_core.csv_split(data, delimiter, ncols, slots, n, out_starts, out_offsets))


def _csv_split_py(data: object, delimiter: int, ncols: int, slots: np.ndarray, n: int, out_starts: np.ndarray,
                  out_offsets: np.ndarray) -> int:
    b = np.frombuffer(data, np.uint8)  # type: ignore[call-overload]
    ends = np.flatnonzero((b == delimiter) | (b == ord("\n")))
    if ends.size != n * ncols or (n and ends[-1] != b.size - 1) or (not n and b.size):
        return -1
    ends = ends.reshape(n, ncols)
    is_newline = b[ends] == ord("\n")
    if not is_newline[:, -1].all() or is_newline[:, :-1].any():
        return -1
    begins = np.empty_like(ends)
    begins.reshape(-1)[1:] = ends.reshape(-1)[:-1] + 1
    if begins.size:
        begins.reshape(-1)[0] = 0
    lengths = ends - begins
    starts, offsets = out_starts.reshape(-1), out_offsets.reshape(-1)
    k = int(slots.max()) + 1 if slots.size else 0
    starts[: k * n] = 0  # a slot no field fills: no fields, all empty
    offsets[: k * (n + 1)] = 0
    for col, s in enumerate(slots.tolist()):
        if s >= 0:
            starts[s * n : (s + 1) * n] = begins[:, col]
            offsets[s * (n + 1)] = 0
            np.cumsum(lengths[:, col], out=offsets[s * (n + 1) + 1 : (s + 1) * (n + 1)], dtype=np.int32)
    return n


def csv_gather(data: object, starts: np.ndarray, offsets: np.ndarray, n: int, outs: list) -> None:
    """``csv_split``'s fields copied out: ``outs[s]`` (a writable buffer of offsets[s, n] bytes) gets field i of slot s
    (``starts[s * n + i]`` in ``data``) at ``offsets[s, i]``: the data buffer of an Arrow string
    array whose offsets are ``offsets[s]``."""
    if _core is None:
        return _csv_gather_py(data, starts, offsets, n, outs)
    _core.csv_gather(data, starts, offsets, n, outs)


def _csv_gather_py(data: object, starts: np.ndarray, offsets: np.ndarray, n: int, outs: list) -> None:
    b = np.frombuffer(data, np.uint8)  # type: ignore[call-overload]
    offs = offsets.reshape(len(outs), n + 1).astype(np.int64)
    st = starts.reshape(-1).astype(np.int64)
    for s, buf in enumerate(outs):
        out = np.frombuffer(buf, np.uint8)  # type: ignore[call-overload]  # any writable buffer
        o = offs[s]
        if out.size != o[n]:
            raise ValueError("csv_gather: out s must hold offsets[s, n] bytes")
        lens = np.diff(o)
        out[:] = b[np.repeat(st[s * n : (s + 1) * n] - o[:-1], lens) + np.arange(int(o[n]))]


# ---- row initialisers (ember.embedding.init) ---------------------------------------------------


def _binary_from_buffers(fn: str, offsets: object, data: object, off: int, n: int, width: int) -> "pa.Array":
    """The (large_)binary Arrow array of a string column's offsets and data buffers, checked
    (the fallbacks' view of what the native kernels read in place)."""
    if width not in (4, 8):
        raise ValueError(f"{fn}: width must be 4 (int32 offsets) or 8 (int64)")
    arr = pa.Array.from_buffers(pa.large_binary() if width == 8 else pa.binary(), n,
                                [None, pa.py_buffer(offsets), pa.py_buffer(data)], offset=off)
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid as e:
        raise ValueError(f"{fn}: offsets out of the data's range ({e})") from None
    return arr



def cms(table: np.ndarray, ids: np.ndarray, counts: np.ndarray | None, seeds: np.ndarray, out: np.ndarray) -> None:
    """Count-min sketch ``table`` (uint16 [depth, width], width a power of two): with ``counts``
    (int64 [n], >= 0) add ``counts[i]`` to every row's cell of ``ids[i]`` (saturating at 65,535),
    all IDs first; then ``out[i]`` = the estimate of ``ids[i]`` (the minimum over the rows). Row
    r's cell is ``mix64(id ^ seeds[r]) & (width - 1)``. One pass in C; ``_cms_py`` otherwise."""
    core = _core
    if core is None:
        return _cms_py(table, ids, counts, seeds, out)
    c = np.empty(0, dtype=np.int64) if counts is None else np.ascontiguousarray(counts, dtype=np.int64)
    core.cms(table.reshape(-1), np.ascontiguousarray(ids, dtype=np.int64), c,
             np.ascontiguousarray(seeds, dtype=np.uint64), table.shape[1], out)


def _cms_py(table: np.ndarray, ids: np.ndarray, counts: np.ndarray | None, seeds: np.ndarray, out: np.ndarray) -> None:
    x = np.ascontiguousarray(ids, dtype=np.int64).view(np.uint64)
    mask = np.uint64(table.shape[1] - 1)
    cells = [(mix64(x ^ sd) & mask).astype(np.int64) for sd in seeds]
    if counts is not None:
        c = np.asarray(counts, dtype=np.int64)
        for row, cell in zip(table, cells):
            if int(row.take(cell).max(initial=0)) + int(c.sum()) <= 65535:  # cannot saturate: add in place
                np.add.at(row, cell, c.astype(np.uint16))
                continue
            at, inv = np.unique(cell, return_inverse=True)  # near the ceiling: per-cell sums, saturated
            inc = np.bincount(inv, weights=c, minlength=at.size).astype(np.int64)
            row[at] = np.minimum(row[at].astype(np.int64) + inc, 65535).astype(np.uint16)
    est = table[0].take(cells[0]).astype(np.int64)
    for row, cell in zip(table[1:], cells[1:]):
        np.minimum(est, row.take(cell), out=est)
    out[:] = est


def pair_find(keys: np.ndarray, slots: np.ndarray, ids: np.ndarray, salt: np.ndarray, slot_id: np.ndarray,
              count: np.ndarray | None, last: np.ndarray | None, held: np.ndarray | None, clock: int,
              out: np.ndarray) -> int:
    """A group cache's probe of unique (table, ID) pairs: ``out[i]`` = the slot of key
    ``ids[i] ^ salt[i]`` in the index (``keys``/``slots``) when ``slot_id[slot] == ids[i]``, -2
    when the key is another pair's, -1 when absent; for each hit ``count[slot] += 1``,
    ``last[slot] = clock``, ``held[slot] += 1`` (each when given). Returns the hits.

    The pairs of one call are unique (a lookup's IDs per table), so no slot is touched twice:
    many keys are probed on several threads (ranges of ``ids``), each its own hits' counters.
    The probe waits on memory (random buckets and slot records), so more threads keep more
    reads in flight."""
    core = _core
    if core is None:
        return _pair_find_py(keys, slots, ids, salt, slot_id, count, last, held, clock, out)
    empty64, empty32 = np.empty(0, np.int64), np.empty(0, np.int32)
    c, la, h = empty64 if count is None else count, empty64 if last is None else last, empty32 if held is None else held
    n = ids.size
    if not (salt.size == out.size == n) or n < 2 * PROBE_PARALLEL_KEYS:  # (the core names what is wrong)
        return core.pair_find(keys, slots, ids, salt, slot_id, c, la, h, int(clock), out)

    def part(lo: int, hi: int) -> int:
        return core.pair_find(keys, slots, ids[lo:hi], salt[lo:hi], slot_id, c, la, h, int(clock), out[lo:hi])

    return sum(run_chunks(part, even_chunks(n, PROBE_PARALLEL_KEYS)))


def _pair_find_py(keys: np.ndarray, slots: np.ndarray, ids: np.ndarray, salt: np.ndarray, slot_id: np.ndarray,
                  count: np.ndarray | None, last: np.ndarray | None, held: np.ndarray | None, clock: int,
                  out: np.ndarray) -> int:
    bucket = np.empty(ids.size, np.int64)
    raw32 = np.empty(ids.size, np.int32)
    probe(keys, slots, ids ^ salt, bucket, raw32)
    raw = raw32.astype(np.int64)
    ok = (raw >= 0) & (slot_id[np.maximum(raw, 0)] == ids)
    out[:] = np.where(ok, raw, np.where(raw >= 0, -2, -1))
    hs = raw[ok]
    if count is not None:
        count[hs] += 1
    if last is not None:
        last[hs] = clock
    if held is not None:
        held[hs] += 1
    return int(hs.size)


# ---- a group cache's bookkeeping passes (ember.tiers.group_cache) ------------------------
# The host half of a training lookup runs on two pipeline threads that share the GIL; these
# passes over its slot arrays run in C with the GIL released. Without the core, each says once
# in the log that its numpy reference runs instead.

_NEVER = np.iinfo(np.int64).max


def _fallback_once(name: str) -> None:
    """Log once per kernel that its numpy fallback runs (the core is off or not built)."""
    if once.first("native.fallback", name):
        why = "EMBER_NATIVE=0" if _DISABLED else f"the native core is not available: {_import_error}"
        logging.getLogger("ember").info("ember._native.%s runs its numpy fallback (%s)", name, why)


def victim_keys(last: np.ndarray, count: np.ndarray, lru: bool, out: np.ndarray | None = None) -> np.ndarray:
    """int64 eviction score per row, lowest evicted first (LRU: ``last``; LFU: ``count << 32 |
    last & 0xFFFFFFFF``): the numpy form of the C scans' score, and
    ``ember.tiers.policy.victim_score``. ``out`` (int64, the rows' length): written in place and
    returned (a scan of a whole cache need not allocate its temporaries)."""
    if out is None:
        if lru:
            return last.astype(np.int64)
        return (count.astype(np.int64) << 32) | (last.astype(np.int64) & 0xFFFFFFFF)
    if lru:
        np.copyto(out, last)
        return out
    np.left_shift(count.astype(np.int64, copy=False), 32, out=out)
    out |= last.astype(np.int64, copy=False) & 0xFFFFFFFF
    return out


def gc_scan(last: np.ndarray, count: np.ndarray, live: np.ndarray, held: np.ndarray, lru: bool,
            score: np.ndarray, out_slot: np.ndarray, out_score: np.ndarray) -> int:
    """A group cache's victim scan: ``score[v]`` = slot v's eviction score (LRU: ``last[v]``;
    LFU: ``count[v] << 32 | last[v] & 0xFFFFFFFF``), int64 max where not ``live`` or ``held``;
    then the ``k = len(out_slot)`` lowest (score, slot) pairs in ascending order into
    ``out_slot`` / ``out_score`` (ties: the lower slot first). Returns how many were found
    (fewer than k when fewer slots qualify). last/count/score int64 [m], live bool [m], held
    int32 [m]. The scores in slot ranges on several threads (``gc_scores``: a pass over every
    slot's arrays, waiting on memory), then one radix select (``gc_select``)."""
    m = last.size
    parts = even_chunks(m, SCAN_PARALLEL_SLOTS) if _core is not None and score.size == m else [(0, m)]
    ranges = run_chunks(lambda lo, hi: gc_scores(last, count, live, held, lru, score, lo, hi), parts)
    valid = sum(r[0] for r in ranges)
    return gc_select(score, valid, min(r[1] for r in ranges), max(r[2] for r in ranges), out_slot, out_score)


def _gc_scan_py(last: np.ndarray, count: np.ndarray, live: np.ndarray, held: np.ndarray, lru: bool,
                score: np.ndarray, out_slot: np.ndarray, out_score: np.ndarray) -> int:
    """``gc_scan`` in numpy alone (the reference of the compiled passes)."""
    valid, lo, hi = _gc_scores_py(last, count, live, held, lru, score, 0, last.size)
    return _gc_select_py(score, valid, lo, hi, out_slot, out_score)


def gc_scores(last: np.ndarray, count: np.ndarray, live: np.ndarray, held: np.ndarray, lru: bool,
              score: np.ndarray, start: int, stop: int) -> tuple[int, int, int]:
    """The victim scan's first pass over slots ``start..stop-1``: their ``score`` (as ``gc_scan``).
    Returns (how many qualify, their lowest score, their highest score); lowest > highest when
    none. In C; ``_gc_scores_py`` otherwise."""
    core = _core
    if core is None:
        _fallback_once("gc_scan")
        return _gc_scores_py(last, count, live, held, lru, score, start, stop)
    return core.gc_scores(last, count, live, held, bool(lru), score, int(start), int(stop))


def _gc_scores_py(last: np.ndarray, count: np.ndarray, live: np.ndarray, held: np.ndarray, lru: bool,
                  score: np.ndarray, start: int, stop: int) -> tuple[int, int, int]:
    if not (0 <= start <= stop <= last.size):
        raise ValueError("ember native gc_scores: the range is not within the slots")
    sc = victim_keys(last[start:stop], count[start:stop], lru, out=score[start:stop])
    np.putmask(sc, ~live[start:stop], _NEVER)
    np.putmask(sc, held[start:stop] > 0, _NEVER)
    ok = sc[sc != _NEVER]
    if ok.size == 0:
        return 0, _NEVER, np.iinfo(np.int64).min
    return int(ok.size), int(ok.min()), int(ok.max())


def gc_select(score: np.ndarray, valid: int, lo: int, hi: int, out_slot: np.ndarray, out_score: np.ndarray) -> int:
    """The victim scan's selection over the scores ``gc_scores`` wrote (``valid`` of them below
    int64 max, within [lo, hi]): the ``len(out_slot)`` lowest (score, slot) pairs, ascending
    (ties: the lower slot), into ``out_slot`` / ``out_score``; returns how many. One radix
    select in C; ``_gc_select_py`` otherwise."""
    core = _core
    if core is None:
        return _gc_select_py(score, valid, lo, hi, out_slot, out_score)
    return core.gc_select(score, int(valid), int(lo), int(hi), out_slot, out_score)


def _gc_select_py(score: np.ndarray, valid: int, lo: int, hi: int, out_slot: np.ndarray, out_score: np.ndarray) -> int:
    sc = score
    k = min(out_slot.size, valid)
    if k <= 0:
        return 0
    if k < valid:  # the k-th lowest score t: every slot below it, and the lowest slots scoring t
        t = sc[np.argpartition(sc, k - 1)[k - 1]]
        below = np.flatnonzero(sc < t)
        sel = np.sort(np.concatenate([below, np.flatnonzero(sc == t)[: k - below.size]]))
    else:
        sel = np.flatnonzero(sc != _NEVER)
    sel = sel[np.argsort(sc[sel], kind="stable")]
    out_slot[:k] = sel
    out_score[:k] = sc[sel]
    return k


def gc_requeue(last: np.ndarray, count: np.ndarray, live: np.ndarray, held: np.ndarray, lru: bool,
               q_slot: np.ndarray, q_score: np.ndarray) -> int:
    """The victims queued by a group cache's last scan (``q_slot``, with the scores they had,
    int64 [n]) that still qualify (live, not held, score unchanged): moved, in order, to the
    front of ``q_slot`` / ``q_score``. Returns how many. In C; ``_gc_requeue_py`` otherwise."""
    core = _core
    if core is None:
        _fallback_once("gc_requeue")
        return _gc_requeue_py(last, count, live, held, lru, q_slot, q_score)
    return core.gc_requeue(last, count, live, held, bool(lru), q_slot, q_score)


def _gc_requeue_py(last: np.ndarray, count: np.ndarray, live: np.ndarray, held: np.ndarray, lru: bool,
                   q_slot: np.ndarray, q_score: np.ndarray) -> int:
    still = (victim_keys(last[q_slot], count[q_slot], lru) == q_score) & live[q_slot] & (held[q_slot] <= 0)
    kept = int(np.count_nonzero(still))
    q_slot[:kept] = q_slot[still]
    q_score[:kept] = q_score[still]
    return kept


def gc_reserve(free: np.ndarray, nfree: int, new: np.ndarray, tables: np.ndarray, est: np.ndarray, clock: int,
               owner: np.ndarray, count: np.ndarray, last: np.ndarray, held: np.ndarray, w_slots: np.ndarray) -> None:
    """A group cache's admitted misses (positions ``new`` of the lookup, int64 [n]) reserve the
    top n slots of its free stack ``free[:nfree]`` (the i-th takes ``free[nfree - 1 - i]``):
    ``owner`` (int32) = ``tables``, ``count`` = ``est``, ``last`` = ``clock``, ``held`` (int32)
    += 1, and ``w_slots[new]`` = the slots. The caller pops them off the stack. In C;
    ``_gc_reserve_py`` otherwise."""
    core = _core
    if core is None:
        _fallback_once("gc_reserve")
        return _gc_reserve_py(free, nfree, new, tables, est, clock, owner, count, last, held, w_slots)
    i64 = [np.ascontiguousarray(x, dtype=np.int64) for x in (new, tables, est)]
    core.gc_reserve(free, int(nfree), *i64, int(clock), owner, count, last, held, w_slots)


def _gc_reserve_py(free: np.ndarray, nfree: int, new: np.ndarray, tables: np.ndarray, est: np.ndarray, clock: int,
                   owner: np.ndarray, count: np.ndarray, last: np.ndarray, held: np.ndarray, w_slots: np.ndarray) -> None:
    reserved = free[nfree - new.size : nfree][::-1]
    owner[reserved] = tables
    count[reserved] = est
    last[reserved] = clock
    held[reserved] += 1
    w_slots[new] = reserved


def gc_insert(keys: np.ndarray, slots: np.ndarray, ids: np.ndarray, tables: np.ndarray, at: np.ndarray,
              mix: np.ndarray, slot_id: np.ndarray, owner: np.ndarray, live: np.ndarray, rows_of: np.ndarray) -> int:
    """Admitted rows enter a group cache: key ``ids[i] ^ mix[tables[i]]`` -> slot ``at[i]`` into
    the index (``keys``/``slots``; absent and unique, room reserved by the caller), and
    ``slot_id[at] = ids``, ``owner[at] = tables``, ``live[at] = True``, ``rows_of[tables] += 1``.
    Returns the empty buckets used (``KeyIndex.placed``). ids/tables/at int64 [n], mix/rows_of
    int64 [T], slot_id int64 [m], owner int32 [m], live bool [m]. In C; ``_gc_insert_py``
    otherwise (the same buckets: ``place``)."""
    core = _core
    if core is None:
        _fallback_once("gc_insert")
        return _gc_insert_py(keys, slots, ids, tables, at, mix, slot_id, owner, live, rows_of)
    i64 = [np.ascontiguousarray(x, dtype=np.int64) for x in (ids, tables, at)]
    return core.gc_insert(keys, slots, *i64, mix, slot_id, owner, live, rows_of)


def _gc_insert_py(keys: np.ndarray, slots: np.ndarray, ids: np.ndarray, tables: np.ndarray, at: np.ndarray,
                  mix: np.ndarray, slot_id: np.ndarray, owner: np.ndarray, live: np.ndarray, rows_of: np.ndarray) -> int:
    used = place(keys, slots, ids ^ mix[tables], at.astype(np.int32))
    slot_id[at] = ids
    owner[at] = tables
    live[at] = True
    rows_of += np.bincount(tables, minlength=rows_of.size)
    return used


def gc_release(held: np.ndarray, at: np.ndarray) -> None:
    """``held[at] -= 1`` (int32 [m]; ``at`` int64 [n], unique slots): a group cache's lookup
    gives back the slots it held. In C; ``_gc_release_py`` otherwise."""
    core = _core
    if core is None:
        _fallback_once("gc_release")
        return _gc_release_py(held, at)
    core.gc_release(held, np.ascontiguousarray(at, dtype=np.int64))


def _gc_release_py(held: np.ndarray, at: np.ndarray) -> None:
    held[at] -= 1


def uniform01(ids: np.ndarray, keys: np.ndarray, dim: int, out: np.ndarray, mul: float | np.ndarray = 1.0,
              add: float | np.ndarray = 0.0) -> None:
    """``out[i, c] = u * mul_i + add_i`` (float32 ops, in that order; out float32 [n, dim]) with the
    counter-based uniform ``u = (mix64(mix64(ids[i] ^ key_i) + (c + 1) * GOLDEN) >> 40) * 2**-24``
    in [0, 1); ``key_i`` = ``keys[0]`` or ``keys[i]`` (uint64 [1 or n]: one key per row lets the
    tables of a group initialise their new rows in one call); ``mul``/``add``: numbers, or
    float32 [n] (a scale per row: tables of different init scales in one call). Runs on several
    threads (row ranges) when the call is large enough."""
    core = _core
    if core is None:
        return _uniform01_py(ids, keys, dim, out, mul, add)
    n = ids.size
    rows = _rows_of(out, n, dim, "out")
    per_row = isinstance(mul, np.ndarray)
    if per_row:
        mul = np.ascontiguousarray(mul, dtype=np.float32)
        add = np.ascontiguousarray(add, dtype=np.float32)

    def part(lo: int, hi: int) -> None:  # rows lo..hi-1
        m, a = (mul[lo:hi], add[lo:hi]) if per_row else (mul, add)  # type: ignore[index]
        core.uniform01(ids[lo:hi], keys if keys.size == 1 else keys[lo:hi], dim, rows[lo:hi], m, a)

    run_chunks(part, chunks(np.full(n, dim), min_rows=2 * MIN_PARALLEL_ROWS))


def _uniform01_py(ids: np.ndarray, keys: np.ndarray, dim: int, out: np.ndarray, mul: float | np.ndarray = 1.0,
                  add: float | np.ndarray = 0.0) -> None:
    ids = np.asarray(ids, dtype=np.int64)
    keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
    n = ids.size
    if dim < 0 or out.size != n * dim or keys.size not in (1, n):
        raise ValueError("ember native uniform01: keys uint64 [1 or len(ids)], out float32 [len(ids), dim]")
    base = mix64(ids.view(np.uint64) ^ keys)
    cols = np.arange(1, dim + 1, dtype=np.uint64) * _GOLDEN
    bits = mix64(base[:, None] + cols[None, :])
    u = (bits >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))
    if isinstance(mul, np.ndarray):
        u *= np.asarray(mul, dtype=np.float32).reshape(n, 1)
        u += np.asarray(add, dtype=np.float32).reshape(n, 1)
    elif not (mul == 1.0 and add == 0.0):
        u *= np.float32(mul)
        u += np.float32(add)
    _rows_of(out, n, dim, "out")[...] = u


def fresh_uniform(ids: np.ndarray, keys: np.ndarray, at: np.ndarray, out: np.ndarray, dim: int,
                  mul: float | np.ndarray, add: float | np.ndarray, fill: np.ndarray, bf16: bool) -> None:
    """New rows of a uniform initialiser written in place: ``out[at[i], :dim]`` = ``uniform01``'s
    row i (``u * mul_i + add_i``), rounded to the nearest bf16 when ``bf16`` (ties to even: the
    bits of ``ember.embedding.codec._bf16_bits``), and ``out[at[i], dim:] = fill`` (an
    optimizer's constant initial state, float32 [width - dim]). ``out``: float32 [rows, width],
    C-contiguous; ``at``: distinct rows. Runs on several threads (ranges of ``at``) when the call
    is large enough."""
    core = _core
    if core is None:
        return _fresh_uniform_py(ids, keys, at, out, dim, mul, add, fill, bf16)
    if out.ndim != 2 or not out.flags.c_contiguous or out.dtype != np.float32:
        raise ValueError("ember native fresh_uniform: out must be a C-contiguous float32 [rows, width] array")
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    at = np.ascontiguousarray(at, dtype=np.int64)
    fill = np.ascontiguousarray(fill, dtype=np.float32)
    per_row = isinstance(mul, np.ndarray)
    if per_row:
        mul = np.ascontiguousarray(mul, dtype=np.float32)
        add = np.ascontiguousarray(add, dtype=np.float32)
    width = out.shape[1]

    def part(lo: int, hi: int) -> None:  # rows at[lo..hi-1]
        m, a = (mul[lo:hi], add[lo:hi]) if per_row else (mul, add)  # type: ignore[index]
        core.fresh_uniform(ids[lo:hi], keys if keys.size == 1 else keys[lo:hi], at[lo:hi], out, width, dim, m, a,
                           fill, bool(bf16))

    run_chunks(part, chunks(np.full(ids.size, width), min_rows=2 * MIN_PARALLEL_ROWS))


def _fresh_uniform_py(ids: np.ndarray, keys: np.ndarray, at: np.ndarray, out: np.ndarray, dim: int,
                      mul: float | np.ndarray, add: float | np.ndarray, fill: np.ndarray, bf16: bool) -> None:
    n = np.asarray(ids).size
    if out.ndim != 2 or out.dtype != np.float32 or np.asarray(fill).size != out.shape[1] - dim or np.asarray(at).size != n:
        raise ValueError("ember native fresh_uniform: out float32 [rows, width], at [len(ids)], fill [width - dim]")
    at = np.asarray(at, dtype=np.int64)
    if n and (int(at.min()) < 0 or int(at.max()) >= out.shape[0]):
        raise IndexError("ember native fresh_uniform: a position lies outside out")
    w = np.empty((n, dim), dtype=np.float32)
    _uniform01_py(ids, keys, dim, w, mul, add)
    if bf16:  # round to nearest even (codec._bf16_bits)
        b = w.view(np.uint32)
        w = _bf16_widen_py(_bf16_round_py(b, np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))))
    out[at, :dim] = w
    out[at, dim:] = np.asarray(fill, dtype=np.float32)


# ---- sparse gradients and the optimizer (ember.embedding.collection, ember.optim) -------------

def _row_view(t: torch.Tensor) -> tuple[np.ndarray, int] | None:
    """A [n, d] CPU float32 tensor with unit column stride as (flat numpy view over its rows, row
    stride), for kernels that take row-strided buffers; None when it is not one."""
    if t.device.type != "cpu" or t.dtype != torch.float32 or t.dim() != 2 or t.requires_grad:
        return None
    n, d = t.shape
    if n and d and t.stride(1) != 1 and d > 1:
        return None
    stride = t.stride(0) if n > 1 else d
    if n > 1 and stride < d:
        return None
    return t.as_strided(((n - 1) * stride + d if n else 0,), (1,)).numpy(), stride


def rowwise_adagrad_(rows: torch.Tensor, state: torch.Tensor, grads: torch.Tensor, lr: float, eps: float) -> bool:
    """Row-wise Adagrad on rows [n, D], state [n, 1], grads [n, D] in place:
    ``G += mean_j(g_j^2)``; ``w -= lr * g / (sqrt(G) + eps)``.

    The compiled kernel (CPU float32 tensors with unit column stride, e.g. the weight and
    accumulator views of one records buffer; on several threads when large) makes one pass per
    row instead of six over the batch; same formula, the mean of squares summed in double (may
    round apart from torch's by an ulp; the squares of tiny gradients would be float denormals,
    ~20x slower on x86). Other tensors, or no core: the torch ops, ``_rowwise_adagrad_py``.

    Returns True: the update is always done (the bool stays for callers written when False
    meant "not done, run the torch ops yourself").
    """
    views = None
    if _core is not None and rows.shape == grads.shape and state.shape == (rows.shape[0], 1) and rows.shape[1] > 0:
        views = [_row_view(t) for t in (rows, state, grads)]
    if views is None or any(v is None for v in views):
        _rowwise_adagrad_py(rows, state, grads, lr, eps)
        return True
    (r, rs), (s, ss), (g, gs) = views  # type: ignore[misc]
    d = rows.shape[1]
    core = _core

    def part(lo: int, hi: int) -> None:  # rows lo..hi-1
        core.rowwise_adagrad(
            r[lo * rs : (hi - 1) * rs + d], s[lo * ss : (hi - 1) * ss + 1], g[lo * gs : (hi - 1) * gs + d],
            hi - lo, d, rs, ss, gs, lr, eps,
        )

    if rows.shape[0]:
        run_chunks(part, chunks(np.full(rows.shape[0], 1)))
    return True


def _rowwise_adagrad_py(rows: torch.Tensor, state: torch.Tensor, grads: torch.Tensor, lr: float, eps: float) -> None:
    state.add_(grads.square().mean(dim=1, keepdim=True))
    rows.addcdiv_(grads, state.sqrt().add_(eps), value=-lr)


def index_add_rows(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``out.index_add_(0, index, src)`` (rows of ``src`` summed into ``out``), in place; returns ``out``.

    On CPU float32 the compiled loop is 2-3x faster than torch's for narrow rows (embedding
    gradients, D = 8-64) and gives the same sums in the same order; elsewhere (or without the
    core) torch's, ``_index_add_rows_py``. ``src`` may be row-strided
    (``src.stride() == (S, 1)``, S >= D): no copy to a contiguous tensor.
    """
    view = _row_view(src) if _out_ok(out, index) and src.shape == (index.numel(), out.shape[1]) else None
    if view is None:
        return _index_add_rows_py(out, index, src)
    _core.index_add_rows(out.numpy(), index.numpy(), view[0], out.shape[1], view[1])  # type: ignore[union-attr]
    return out


def _index_add_rows_py(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    return out.index_add_(0, index, src)


def index_add_features(
    out: torch.Tensor, index: torch.Tensor, srcs: list[torch.Tensor | None], owner: Sequence[int] | None = None
) -> torch.Tensor:
    """``out.index_add_(0, index[f*B:(f+1)*B], srcs[f])`` for every feature f whose src is not
    None (each [B, D]), in place; returns ``out``.

    ``owner[f]`` (non-decreasing) names the rows of ``out`` feature f may write, e.g. its table in
    a group: features of different owners write different rows, so the native loop may run
    them on several threads; without it, one thread.

    The compiled loop goes feature by feature, each in batch order (the order of the torch
    reference, so results are bit-identical), reading row-strided slices of one [B, F', D]
    gradient in place (no stacked copy; their rows are prefetched, a stride of ~2 KB defeats
    the hardware's prefetcher). Tensors it does not take, or no core: feature by feature with
    torch, ``_index_add_features_py``.
    """
    b = index.numel() // max(len(srcs), 1)
    views = []
    if _out_ok(out, index) and index.numel() == b * len(srcs):
        views = [None if s is None else _row_view(s) if s.shape == (b, out.shape[1]) else None for s in srcs]
    if not views or any(v is None and s is not None for v, s in zip(views, srcs)):
        return _index_add_features_py(out, index, srcs)
    strides = np.array([out.shape[1] if v is None else v[1] for v in views], dtype=np.int64)
    flat = [None if v is None else v[0] for v in views]
    out_np, index_np = out.numpy(), index.numpy()
    core = _core

    def part(lo: int, hi: int) -> None:  # features lo..hi-1
        core.index_add_features(out_np, index_np[lo * b : hi * b], flat[lo:hi], strides[lo:hi], b, out.shape[1])  # type: ignore[union-attr]

    if owner is None:
        part(0, len(srcs))
    else:
        cuts = [True] + [owner[f] != owner[f - 1] for f in range(1, len(srcs))]
        run_chunks(part, chunks(np.full(len(srcs), b), cuts))
    return out


def _index_add_features_py(out: torch.Tensor, index: torch.Tensor, srcs: list[torch.Tensor | None]) -> torch.Tensor:
    """Torch's: one scatter-add of the features' gradients stacked (a fixed few operations on a
    GPU whatever the number of features; CPU sums in the same order as feature by feature)."""
    b = index.numel() // max(len(srcs), 1)
    live = [f for f, s in enumerate(srcs) if s is not None]
    if not live:
        return out
    if len(live) == len(srcs):
        return out.index_add_(0, index, torch.cat(srcs) if len(srcs) > 1 else srcs[0])  # type: ignore[arg-type]
    idx = torch.cat([index[f * b : (f + 1) * b] for f in live])
    return out.index_add_(0, idx, torch.cat([srcs[f] for f in live]))  # type: ignore[misc]


def _out_ok(out: torch.Tensor, index: torch.Tensor) -> bool:
    """Whether the native scatter-adds can write ``out`` [U, D] at int64 ``index``."""
    return (
        _core is not None and out.device.type == "cpu" and out.dtype == torch.float32 and out.dim() == 2
        and out.is_contiguous() and out.shape[1] > 0 and not out.requires_grad
        and index.dtype == torch.int64 and index.is_contiguous() and index.device.type == "cpu"
    )

