"""The key index's probes and inserts (``ember.tiers.key_index.KeyIndex``, a memory tier's
index; several tiers' at once for a table group)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ember import _native
from ember.mix import mix64


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


def _check_segments(t: int, ids: np.ndarray, bounds: np.ndarray, what: str = "bounds") -> None:
    """``bounds`` cut ``ids`` into ``t`` segments (int64 [t+1], rising from 0 to len(ids)); else
    ValueError(``what``)."""
    if bounds.size != t + 1 or bounds[0] != 0 or bounds[t] != ids.size or bool((np.diff(bounds) < 0).any()):
        raise ValueError(what)


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
    if _native._core is not None:
        return _native._core.probe(keys, slots, ids, out_bucket, out_slot)
    return _probe_py(keys, slots, ids, out_bucket, out_slot)


def _probe_py(keys: np.ndarray, slots: np.ndarray, ids: np.ndarray, out_bucket: np.ndarray, out_slot: np.ndarray) -> int:
    """numpy ``probe`` (``_find_buckets`` over the slots' marks)."""
    mask = _check_table(keys, slots)
    ids = np.asarray(ids, dtype=np.int64)
    n = ids.size
    if out_bucket.size != n or out_slot.size != n:
        raise ValueError("ember native probe: output lengths do not match ids")
    out_bucket[...] = _find_buckets(keys, slots, ids, mask, 0, _EMPTY)
    found = out_bucket >= 0
    out_slot[...] = -1
    out_slot[found] = slots.take(out_bucket[found])
    return int(np.count_nonzero(found))


def _find_buckets(keys: np.ndarray, marks: np.ndarray, ids: np.ndarray, mask: int, live: int, empty: int) -> np.ndarray:
    """The bucket of each ID (-1 when absent) in a linear-probing table whose ``marks`` say which
    buckets hold a key (``>= live``) and which are empty (``== empty``; the rest are deleted).
    Round one checks each ID's home bucket (most IDs end there); later rounds check a window of
    ``_WINDOW`` consecutive buckets per ID, so linear probing's long tail costs a few rounds
    instead of one round per bucket."""
    bucket = np.full(ids.size, -1, dtype=np.int64)
    home = _home(ids, mask)
    s = marks.take(home)
    hit = (s >= live) & (keys.take(home) == ids)
    bucket[hit] = home[hit]
    active = np.flatnonzero(~hit & (s != empty))
    pos = home.take(active) + 1
    for _ in range(0, mask, _WINDOW):  # (a full table has no empty bucket: every bucket once)
        if not active.size:
            break
        win = (pos[:, None] + _STEPS) & mask  # [A, W]
        s = marks.take(win)
        hit = (s >= live) & (keys.take(win) == ids.take(active)[:, None])
        stopped, is_hit, at = _first_stop(hit | (s == empty), hit, win)
        bucket[active[is_hit]] = at[is_hit]
        active = active[~stopped]
        pos = (pos[~stopped] + _WINDOW) & mask
    return bucket


def probe_rows(tables: Sequence[tuple[np.ndarray, np.ndarray]], ids: np.ndarray, bounds: np.ndarray,
               out_slot: np.ndarray, remove: bool = False) -> int:
    """Several tiers' probe in one pass (a table group's write): tier j's (keys, slots) over its
    segment ``ids[bounds[j]:bounds[j+1]]``; ``out_slot`` (int64 [n]) gets each ID's slot, -1 where
    absent. Counts no access. ``remove``: each found ID leaves its tier's index (its bucket
    marked deleted; a segment's IDs unique); the caller frees the slots. Returns the number found."""
    if _native._core is not None:
        return _native._core.probe_rows(tables, ids, bounds, out_slot, bool(remove))
    return _probe_rows_py(tables, ids, bounds, out_slot, remove)


def _probe_rows_py(tables: Sequence[tuple[np.ndarray, np.ndarray]], ids: np.ndarray, bounds: np.ndarray,
                   out_slot: np.ndarray, remove: bool = False) -> int:
    b = np.asarray(bounds, dtype=np.int64)
    what = "ember native probe_rows: bounds [T+1] over ids, out_slot [n]"
    _check_segments(len(tables), ids, b, what)
    if out_slot.size != ids.size:
        raise ValueError(what)
    found = 0
    for j, (keys, slots) in enumerate(tables):
        seg = ids[b[j] : b[j + 1]]
        bucket, s32 = np.empty(seg.size, np.int64), np.empty(seg.size, np.int32)
        found += _probe_py(keys, slots, seg, bucket, s32)
        out_slot[b[j] : b[j + 1]] = s32
        if remove:
            slots[bucket[bucket >= 0]] = _DELETED
    return found

COUNT_MODES = {"get": 0, "add": 1, "remove": 2}
_COUNT_MAX = np.iinfo(np.int32).max


def count_ids(tables: Sequence[tuple[np.ndarray, np.ndarray]], ids: np.ndarray, bounds: np.ndarray, mode: str,
              adds: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact counters of IDs (``ember.tiers.policy.IdCounter``), several in one pass (a table
    group's ``min_count`` tables). Counter j is ``(keys int64 [cap], counts int32 [cap])``, cap a
    power of two: bucket b holds ID ``keys[b]`` seen ``counts[b]`` times (> 0); 0 marks an empty
    bucket, -1 a deleted one; an ID's home is ``mix64(id) & (cap - 1)``, linear probing. Over
    counter j's segment ``ids[bounds[j]:bounds[j+1]]`` (unique within it), by ``mode``:

    - ``"get"``: each ID's count (0 when absent);
    - ``"add"``: ``adds[i]`` (> 0; 1 each when None) added to each ID's count (saturating at
      2^31 - 1), an absent ID placed in the first free (deleted or empty) bucket from its home
      (one probe for both); the new counts. The caller keeps each counter's load below 1;
    - ``"remove"``: each ID's bucket marked deleted; the counts they had (0 when absent).

    Returns ``(out int64 [n], stats int64 [T, 2])``: per counter the IDs placed (add) or removed
    (remove), and the empty buckets the placed IDs took. Runs whole counters on several threads
    when the call is large enough. Where an add places an ID may differ between the compiled
    loop and the fallback (as ``place``), never what a count reads."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    bounds = np.ascontiguousarray(bounds, dtype=np.int64)
    if mode not in COUNT_MODES:
        raise ValueError(f"count_ids: mode must be one of {sorted(COUNT_MODES)}, got {mode!r}")
    if adds is None:
        adds = np.empty(0, dtype=np.int32)
    else:
        adds = np.ascontiguousarray(adds, dtype=np.int32)
        if adds.size != ids.size or (adds.size and int(adds.min()) <= 0):
            raise ValueError(f"count_ids: adds must be {ids.size} counts above 0")
    out = np.empty(ids.size, dtype=np.int64)
    stats = np.zeros((len(tables), 2), dtype=np.int64)
    if _native._core is not None:
        _native._core.count_ids(tables, ids, bounds, adds, out, COUNT_MODES[mode], stats,
                                _native.part_bounds(np.diff(bounds)))
    else:
        _count_ids_py(tables, ids, bounds, mode, adds, out, stats)
    return out, stats


def _count_ids_py(tables: Sequence[tuple[np.ndarray, np.ndarray]], ids: np.ndarray, bounds: np.ndarray, mode: str,
                  adds: np.ndarray, out: np.ndarray, stats: np.ndarray) -> None:
    b = bounds
    _check_segments(len(tables), ids, b, "ember native count_ids: bounds [T+1] over ids")
    for j, (keys, counts) in enumerate(tables):
        mask = _check_table(keys, counts)
        seg = ids[b[j] : b[j + 1]]
        bucket = _find_buckets(keys, counts, seg, mask, 1, 0)
        found = bucket >= 0
        if mode != "add":
            out[b[j] : b[j + 1]] = np.where(found, counts.take(np.maximum(bucket, 0)), 0)
            if mode == "remove":
                counts[bucket[found]] = -1
                stats[j, 0] = int(np.count_nonzero(found))
            continue
        add = adds[b[j] : b[j + 1]] if adds.size else np.ones(seg.size, dtype=np.int32)
        new = np.flatnonzero(~found)
        if new.size:
            def claim(buckets: np.ndarray, winners: np.ndarray) -> None:
                stats[j, 1] += int(np.count_nonzero(counts[buckets] == 0))
                keys[buckets] = seg[new[winners]]
                counts[buckets] = add[new[winners]]  # (> 0: taken before the next round looks)
                bucket[new[winners]] = buckets

            _claim_rounds(_home(seg[new], mask), mask + 1, lambda win: counts[win] <= 0, claim,
                          "count_ids: a counter is full (reserve room first)")
            stats[j, 0] = new.size
        old = np.flatnonzero(found)
        at = bucket[old]
        counts[at] = np.minimum(counts[at].astype(np.int64) + add[old], _COUNT_MAX)
        out[b[j] : b[j + 1]] = counts.take(bucket)


def place(keys: np.ndarray, slots: np.ndarray, ids: np.ndarray, new_slots: np.ndarray) -> int:
    """Insert ``ids[i] -> new_slots[i]`` (int64 [n] absent, unique IDs; int32 [n]) into the table,
    each into the first free (empty or deleted) bucket from its home. Returns the number of
    empty buckets used (deleted ones reused do not count). The caller keeps the load below 1;
    a full table raises RuntimeError.

    The compiled loop places the IDs one after another; the fallback in rounds (one winner per
    contested bucket). Both fill the same set of buckets and either finds every ID the other
    placed, but two IDs of one call that compete for a bucket may end up swapped."""
    if _native._core is not None:
        return _native._core.place(keys, slots, ids, new_slots)
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


def rehash(keys: np.ndarray, slots: np.ndarray, old_keys: np.ndarray, old_slots: np.ndarray) -> int:
    """Place every live entry of the old table (``old_slots[b] >= 0``), in bucket order, into
    the new one (``keys`` / ``slots``, large enough), as ``place`` places ``items()``; returns
    the empty buckets used. The compiled loop reads the old table in place (no copies of its
    items)."""
    if old_keys.dtype != np.int64 or old_slots.dtype != np.int32 or old_keys.shape != old_slots.shape:
        raise ValueError("rehash: old keys int64 [c], old slots int32 [c]")
    if _native._core is not None:
        return _native._core.rehash(keys, slots, old_keys, old_slots)
    return _rehash_py(keys, slots, old_keys, old_slots)


def _rehash_py(keys: np.ndarray, slots: np.ndarray, old_keys: np.ndarray, old_slots: np.ndarray) -> int:
    live = np.flatnonzero(old_slots >= 0)
    return _place_py(keys, slots, old_keys.take(live), old_slots.take(live))


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
