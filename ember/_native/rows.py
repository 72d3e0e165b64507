"""Memory tiers, several in one call (``ember.tiers.host.HostTier``, a table group's read and
write)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from ember import _native
from ember._native.bf16 import _bf16_pack_sr_py, _bf16_widen_py
from ember._native.key_index import _check_segments, _check_table, _place_py, _probe_py
from ember._native.sparse import _rowwise_adagrad_py

SKIP_ROW = -2
"""``write_rows``' slot of a row left out (neither updated nor written)."""


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

def _rows_of(buf: np.ndarray, n: int, r: int, what: str) -> np.ndarray:
    """``buf`` (C-contiguous, n * r floats) as a [n, r] view; a copy would lose the writes."""
    if not buf.flags.c_contiguous or buf.size != n * r:
        raise ValueError(f"ember native: {what} must be a C-contiguous float32 buffer of {n} x {r}")
    return buf.reshape(n, r)


def _split_tiers(kernel: Callable[..., int], tables: Sequence[tuple], ids: np.ndarray, bounds: np.ndarray,
                 per_row: tuple[np.ndarray, ...], per_tier: tuple[np.ndarray, ...], r: int, dim: int) -> int:
    """``kernel(tables, ids, bounds, *per_row, *per_tier, r, dim, parts)``: the core runs runs of
    whole tiers (``parts``) on several threads."""
    return kernel(tables, ids, bounds, *per_row, *per_tier, r, dim, _native.part_bounds(np.diff(bounds)))


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
    if _native._core is not None:
        return _split_tiers(_native._core.read_rows, tables, ids, bounds, (_rows_of(out, ids.size, record_width(r, dim), "out"),
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


def _check_adagrad(adagrad: tuple[np.ndarray, np.ndarray] | None, n: int, t: int, width: int) -> None:
    if adagrad is None:
        return
    grads, hyper = adagrad
    gdim = grads.shape[1] if grads.ndim == 2 else -1
    if (grads.dtype != np.float32 or not grads.flags.c_contiguous or grads.shape[0] != n or not 0 < gdim < width
            or hyper.shape != (t, 2) or hyper.dtype != np.float64 or not hyper.flags.c_contiguous):
        raise ValueError("ember native write_rows: adagrad needs grads float32 [n, gdim] (0 < gdim < record width) "
                         "and hyper float64 [T, 2], C-contiguous")


def write_rows(tables: Sequence[tuple[np.ndarray, ...]], ids: np.ndarray, bounds: np.ndarray, slot: np.ndarray,
               records: np.ndarray, next: np.ndarray, clocks: np.ndarray, used: np.ndarray, free_at: np.ndarray,
               r: int, dim: int = 0, seeds: np.ndarray | None = None, steps: np.ndarray | None = None,
               adagrad: tuple[np.ndarray, np.ndarray] | None = None) -> int:
    """A memory tier's put for every tier j over its segment of ``ids`` (int64 [n]; ``bounds``
    int64 [T+1] from 0 to n): rows with ``slot[i] >= 0`` (int64 [n]) are overwritten; rows with
    ``slot[i] == -1`` (absent, unique IDs) get the slot ``free[free_at[j]]`` (then ``free_at[j]
    += 1``) while tier j's free list lasts (int32: slots of removed rows, taken from its front as
    ``HostTier._allocate`` takes them), then ``next[j]`` (then ``next[j] += 1``; written back to
    ``slot[i]``), an index bucket (``place``), ``slot_ids = ID``, ``held = 1``,
    ``last = clocks[j]``, ``count = 1``; then ``arena[slot[i]] = records[i]`` (float32 [n, r]).
    ``used[j]`` (int64 [T]) = empty index buckets consumed; returns the rows inserted in all.
    Rows with ``slot[i] == SKIP_ROW`` (-2) are left out: neither updated nor written (rows held
    back by ``min_count``, written around rather than gathered out).
    ``tables[j] = (keys, slots, arena, last, count, slot_ids, held, free)``.

    The caller reserved room (``next[j]`` + new rows beyond the free list <= arena rows, index
    load below 1); else ValueError before anything is written. Runs on several threads (runs
    of whole tiers) when the call is large enough. The fallback places new IDs as ``_place_py``
    does: the same buckets are taken, either implementation reads the other's tables.
    ``dim`` > 0: ``records`` are a bf16 table's fp32 records [n, dim + r - (dim+1)//2], packed
    into the arenas with tier j's noise (``seeds[j]``, ``steps[j]``, int64 [T]) as
    ``bf16_pack_sr`` packs them.
    ``adagrad`` = (grads float32 [n, gdim], hyper float64 [T, 2]: tier j's lr and eps): each
    record is first updated in place by row-wise Adagrad (weights in its first ``gdim``
    columns, the accumulator in the next; ``rowwise_adagrad_``'s arithmetic, bit for bit), then
    written: the sparse optimizer's pass over the batch and the write in one."""
    empty = np.empty(0, dtype=np.int64)
    seeds = empty if seeds is None else seeds
    steps = empty if steps is None else steps
    if dim and (seeds.size != len(tables) or steps.size != len(tables)):  # before a split could write a part
        raise ValueError("ember native write_rows: seeds/steps [T] when dim > 0")
    width = record_width(r, dim)
    _check_adagrad(adagrad, ids.size, len(tables), width)
    if _native._core is not None:
        grads, hyper = (np.empty(0, np.float32), np.empty(0, np.float64)) if adagrad is None else adagrad
        return _split_tiers(_native._core.write_rows, tables, ids, bounds,
                            (slot, _rows_of(records, ids.size, width, "records"), grads),
                            (next, clocks, used, free_at) + ((seeds, steps) if dim else (empty, empty)) + (hyper,), r, dim)
    return _write_rows_py(tables, ids, bounds, slot, records, next, clocks, used, free_at, r, dim, seeds, steps, adagrad)


def _write_rows_py(tables: Sequence[tuple[np.ndarray, ...]], ids: np.ndarray, bounds: np.ndarray, slot: np.ndarray,
                   records: np.ndarray, next: np.ndarray, clocks: np.ndarray, used: np.ndarray, free_at: np.ndarray,
                   r: int, dim: int = 0, seeds: np.ndarray | None = None, steps: np.ndarray | None = None,
                   adagrad: tuple[np.ndarray, np.ndarray] | None = None) -> int:
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
    _check_adagrad(adagrad, n, t, recs.shape[1])
    if n and int(slot.min()) < SKIP_ROW:
        raise IndexError("ember native write_rows: a slot lies outside the arena")
    if (slot == SKIP_ROW).any():  # the other rows alone, written back into records (updated in place)
        kept = np.flatnonzero(slot != SKIP_ROW)
        kb = np.searchsorted(kept, bounds)
        sub = np.ascontiguousarray(recs[kept])
        sub_slot = slot[kept]
        sub_ada = None if adagrad is None else (np.ascontiguousarray(adagrad[0][kept]), adagrad[1])
        inserted = _write_rows_py(tables, ids[kept], kb, sub_slot, sub, next, clocks, used, free_at, r, dim, seeds,
                                  steps, sub_ada)
        recs[kept] = sub
        slot[kept] = sub_slot
        return inserted
    if adagrad is not None:  # the optimizer as ``rowwise_adagrad_`` runs it without the core, then the write
        grads, gdim = torch.from_numpy(adagrad[0]), adagrad[0].shape[1]
        for j in range(t):
            a, b = int(bounds[j]), int(bounds[j + 1])
            if b > a:
                rows = torch.from_numpy(recs[a:b])
                _rowwise_adagrad_py(rows[:, :gdim], rows[:, gdim : gdim + 1], grads[a:b], float(adagrad[1][j, 0]),
                                    float(adagrad[1][j, 1]))
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
