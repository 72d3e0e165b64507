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
    if _native._core is not None:
        return _native._core.probe_rows(tables, ids, bounds, out_slot, bool(remove))
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
