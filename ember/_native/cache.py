"""A cache's bookkeeping (``ember.tiers.policy``, ``ember.tiers.group_cache``): the admission
sketch, the group cache's probe, victim scores and scans, its slot passes."""

from __future__ import annotations

import numpy as np

from ember import _native
from ember._native import _fallback_once
from ember._native.key_index import place, probe
from ember.mix import mix64


def cms(table: np.ndarray, ids: np.ndarray, counts: np.ndarray | None, seeds: np.ndarray, out: np.ndarray) -> None:
    """Count-min sketch ``table`` (uint16 [depth, width], width a power of two): with ``counts``
    (int64 [n], >= 0) add ``counts[i]`` to every row's cell of ``ids[i]`` (saturating at 65,535),
    all IDs first; then ``out[i]`` = the estimate of ``ids[i]`` (the minimum over the rows). Row
    r's cell is ``mix64(id ^ seeds[r]) & (width - 1)``. One pass in C; ``_cms_py`` otherwise."""
    core = _native._core
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
    core = _native._core
    if core is None:
        return _pair_find_py(keys, slots, ids, salt, slot_id, count, last, held, clock, out)
    empty64, empty32 = np.empty(0, np.int64), np.empty(0, np.int32)
    c, la, h = empty64 if count is None else count, empty64 if last is None else last, empty32 if held is None else held
    return core.pair_find(keys, slots, ids, salt, slot_id, c, la, h, int(clock), out, _native.part_count(ids.size))


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


# The host half of a training lookup runs on two pipeline threads that share the GIL; these
# passes over its slot arrays run in C with the GIL released. Without the core, each says once
# in the log that its numpy reference runs instead.

_NEVER = np.iinfo(np.int64).max


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
    valid, lo, hi = gc_scores(last, count, live, held, lru, score, 0, last.size)
    return gc_select(score, valid, lo, hi, out_slot, out_score)


def _gc_scan_py(last: np.ndarray, count: np.ndarray, live: np.ndarray, held: np.ndarray, lru: bool,
                score: np.ndarray, out_slot: np.ndarray, out_score: np.ndarray) -> int:
    """``gc_scan`` in numpy alone (the reference of the compiled passes)."""
    valid, lo, hi = _gc_scores_py(last, count, live, held, lru, score, 0, last.size)
    return _gc_select_py(score, valid, lo, hi, out_slot, out_score)


def gc_scores(last: np.ndarray, count: np.ndarray, live: np.ndarray, held: np.ndarray, lru: bool,
              score: np.ndarray, start: int, stop: int) -> tuple[int, int, int]:
    """The victim scan's first pass over slots ``start..stop-1``: their ``score`` (as ``gc_scan``).
    Returns (how many qualify, their lowest score, their highest score); lowest > highest when
    none. In C, in slot ranges on several threads when there are many (``part_count``: a pass
    over every slot's arrays, waiting on memory); ``_gc_scores_py`` otherwise."""
    core = _native._core
    if core is None:
        _fallback_once("gc_scan")
        return _gc_scores_py(last, count, live, held, lru, score, start, stop)
    return core.gc_scores(last, count, live, held, bool(lru), score, int(start), int(stop),
                          _native.part_count(int(stop) - int(start)))


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
    core = _native._core
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
    core = _native._core
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
    core = _native._core
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
    core = _native._core
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
    core = _native._core
    if core is None:
        _fallback_once("gc_release")
        return _gc_release_py(held, at)
    core.gc_release(held, np.ascontiguousarray(at, dtype=np.int64))


def _gc_release_py(held: np.ndarray, at: np.ndarray) -> None:
    held[at] -= 1
