"""CachedTier: a bounded fast tier in front of a slower one (which may itself be a CachedTier).

The chain is *exclusive*: every ID lives in exactly one tier, so ``items()`` yields each ID once
with its newest record and nothing is ever written twice. Rows move as whole records
(``[weights | optimizer state | ...]``) in batches, and the caller's buffer lives on the fast
tier's device: with a GPU cache, hits never leave the GPU; only misses (read from the slow tier)
and demotions (written back to it) cross, counted in each tier's ``transfer_bytes``.

- ``get_into``: IDs found in the fast tier are hits; the misses are read from the slow tier, counted
  in a count-min sketch, and promoted when seen ``admit_after`` times *and* (LFU) more often
  than the fast tier's coldest rows they would displace (TinyLFU admission, vectorised over
  the batch). Displaced rows are demoted (written back) to the slow tier.
- ``put``: rows in the fast tier are overwritten there; rows in the slow tier there; new rows
  go through the same admission test.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from ember.tiers.base import Tier
from ember.tiers.host import HostTier, _check_rows
from ember.tiers.policy import CountMinSketch

__all__ = ["CachedTier"]


class CachedTier(Tier):
    """``fast`` (a bounded HostTier/DeviceTier) caching ``slow`` (any tier).

    Args:
        fast: bounded memory tier; its ``policy`` (lru/lfu) picks what to demote.
        slow: the rest of the chain; it must be able to hold every row.
        admit_after: accesses (as counted while missing) before an ID is promoted; 1 promotes
            on first miss.
        sketch_width: counters per sketch row (default 8x the fast tier's capacity).
        decay_every: halve all access counts after this many counted misses (default 16x the
            sketch width), so the cache follows a drifting distribution.
        evict_slack: extra rows demoted whenever the fast tier must make room (default 1/64 of
            its capacity): batches the O(capacity) victim selection over several steps, at the
            cost of that much cache left momentarily empty.

    Example:
        >>> c = CachedTier(HostTier(2, capacity=1), HostTier(2), admit_after=1)
        >>> _ = c.get_into(torch.tensor([1, 2]), torch.zeros(2, 2))  # both miss: counted once, admissible
        >>> c.put(torch.tensor([1, 2]), torch.ones(2, 2))
        >>> len(c), len(c.fast), len(c.slow)
        (2, 1, 1)
    """

    def __init__(
        self,
        fast: Tier,
        slow: Tier,
        admit_after: int = 1,
        sketch_width: int | None = None,
        decay_every: int | None = None,
        evict_slack: int | None = None,
    ) -> None:
        if fast.capacity is None:
            raise ValueError("CachedTier: the fast tier needs a capacity (rows)")
        if fast.record_dim != slow.record_dim:
            raise ValueError(f"CachedTier: record_dim {fast.record_dim} (fast) != {slow.record_dim} (slow)")
        if admit_after < 1:
            raise ValueError(f"CachedTier: admit_after must be >= 1, got {admit_after}")
        self.fast = fast
        self.slow = slow
        self.record_dim = fast.record_dim
        self.device = fast.device
        self.policy = fast.policy
        self.capacity: int | None = slow.capacity
        self.admit_after = admit_after
        self.sketch = CountMinSketch(sketch_width or 8 * fast.capacity)
        self.decay_every = decay_every or 16 * self.sketch.width
        self.evict_slack = evict_slack if evict_slack is not None else fast.capacity // 64
        self.name = f"{fast.name}+{slow.name}"
        self.reset_step_stats()

    # ---- size -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.fast) + len(self.slow)

    @property
    def nbytes(self) -> int:
        return self.fast.nbytes + self.slow.nbytes + self.sketch.nbytes

    def contains(self, ids: Tensor) -> Tensor:
        inf = self.fast.contains(ids)
        if bool(inf.all()):
            return inf
        out = inf.clone()
        rest = ~inf
        out[rest] = self.slow.contains(ids[rest])
        return out

    # ---- reads ----------------------------------------------------------------------------
    def get_into(self, ids: Tensor, out: Tensor) -> Tensor:
        """Records of found IDs into ``out`` [N, R] (best on the fast tier's device); returns the
        found mask [N]. Frequent misses are promoted into ``fast`` from ``out``, so a promoted
        row crosses devices once."""
        _check_rows([self], [ids.numel()], out, "out")
        found = self.fast.get_into(ids, out).clone()
        miss_np = np.flatnonzero(~found.numpy())  # numpy bookkeeping: small arrays, per batch
        if miss_np.size == 0:
            return found
        host = isinstance(self.fast, HostTier)
        fast_slots = self.fast.slots_of(ids).numpy() if host else None  # the read's, no probe
        miss = torch.from_numpy(miss_np)
        miss_ids = ids.index_select(0, miss)
        rows_s = out.new_empty(miss_np.size, self.record_dim)
        found_s = self.slow.get_into(miss_ids, rows_s)
        found_s_np = found_s.numpy()
        hit_s = np.flatnonzero(found_s_np)
        if hit_s.size:
            sel = torch.from_numpy(hit_s).to(out.device)
            out.index_copy_(0, torch.from_numpy(miss_np[hit_s]).to(out.device), rows_s.index_select(0, sel))
        found.numpy()[miss_np] = found_s_np
        est = self._count(miss_ids)
        # Promote found rows that pass admission (new rows are admitted at put time).
        if hit_s.size:
            admit = self._admit(est[hit_s])
            if admit.size:
                pick = hit_s[admit]
                p_ids = miss_ids[torch.from_numpy(pick)]
                self.slow.remove(p_ids)
                if host:  # absent from fast: the read above just missed them
                    self.fast.remember(p_ids, np.full(p_ids.numel(), -1, dtype=np.int64))
                demoted = self.demotions
                self._insert_fast(p_ids, rows_s.index_select(0, torch.from_numpy(pick).to(out.device)), est[pick])
                self.promotions += p_ids.numel()
                if host:  # where the batch's IDs are now, for its write-back: no probe there
                    # (no demotion: no slot was freed, every hit is where the read found it)
                    now = self.fast.still_held(ids, fast_slots) if self.demotions != demoted else fast_slots.copy()
                    now[miss_np[pick]] = self.fast.slots_of(p_ids).numpy()
                    self.fast.remember(ids, now)
        return found

    def _count(self, ids: Tensor) -> np.ndarray:
        """Count one more access of each ID missing from ``fast``; returns the new estimates."""
        est = self.sketch.add(ids.numpy())
        if self.sketch.added >= self.decay_every:
            self.sketch.halve()
            self.fast.decay_counts()
            est >>= 1  # every counter halved: so is each minimum
        return est

    def _admit(self, est: np.ndarray) -> np.ndarray:
        """Which candidates (indices into ``est``) enter ``fast``; the most frequent first.

        Free slots are filled by candidates seen ``admit_after`` times; beyond that (LFU) a
        candidate must be seen more often than the resident it displaces, pairing the k-th
        most frequent candidate with the k-th coldest resident.
        """
        ok = np.flatnonzero(est >= self.admit_after)
        if ok.size == 0:
            return ok
        ok = ok[np.argsort(-est[ok], kind="stable")]
        cap = self.fast.capacity
        assert cap is not None
        ok = ok[:cap]
        free = cap - len(self.fast)
        if ok.size <= free or self.fast.policy != "lfu":
            return ok
        _, vcounts = self.fast.victims(ok.size - free)
        beats = est[ok[free:]] > vcounts
        n_beat = int(np.argmin(beats)) if not beats.all() else beats.size
        return ok[: free + n_beat]

    def _insert_fast(self, ids: Tensor, records: Tensor, counts: np.ndarray | None) -> None:
        """Insert rows into ``fast``, demoting (writing back) as many of its coldest rows as needed."""
        free = self.fast.free_rows
        assert free is not None
        need = ids.numel() - free
        if need > 0:
            # demote a little more than needed: the next few batches' promotions then find free
            # slots, and the O(capacity) victim scan runs once per several batches, not per batch
            d_ids, d_rows = self.fast.evict(need + self.evict_slack)
            self.slow.put(d_ids, d_rows)
            self.demotions += d_ids.numel()
        self.fast.put(ids, records, counts=counts)

    # ---- writes ---------------------------------------------------------------------------
    def put(self, ids: Tensor, records: Tensor, counts: np.ndarray | None = None) -> None:
        """Write records where their IDs live; new IDs go through admission (``counts`` unused:
        admission counts come from the sketch)."""
        in_fast = self.fast.contains(ids).numpy()
        if in_fast.all():
            self.fast.put(ids, records)
            return
        held = np.flatnonzero(in_fast)
        if held.size:
            h = torch.from_numpy(held)
            h_ids = ids.index_select(0, h)
            if isinstance(self.fast, HostTier):  # their slots were just probed
                self.fast.remember(h_ids, self.fast.slots_of(ids).numpy()[held])
            self.fast.put(h_ids, records.index_select(0, h.to(records.device)))
        rest = torch.from_numpy(np.flatnonzero(~in_fast))
        r_ids = ids.index_select(0, rest)
        r_recs = records.index_select(0, rest.to(records.device))
        in_slow = self.slow.contains(r_ids)
        new = torch.nonzero(~in_slow).squeeze(1)
        to_fast = np.empty(0, dtype=np.int64)
        counts_new = np.empty(0, dtype=np.int64)
        if new.numel():
            est = self.sketch.estimate(r_ids[new].numpy())
            admitted = self._admit(est)
            to_fast, counts_new = new.numpy()[admitted], est[admitted]
        if to_fast.size:
            keep = np.ones(rest.numel(), dtype=bool)
            keep[to_fast] = False
            sel = torch.from_numpy(to_fast)
            self._insert_fast(r_ids[sel], r_recs.index_select(0, sel.to(r_recs.device)), counts_new)
            if keep.any():
                k = torch.from_numpy(np.flatnonzero(keep))
                self.slow.put(r_ids[k], r_recs.index_select(0, k.to(r_recs.device)))
                self.bypasses += k.numel()
        else:
            self.slow.put(r_ids, r_recs)
            self.bypasses += r_ids.numel()

    def remove(self, ids: Tensor) -> Tensor:
        found = self.fast.remove(ids)
        if bool(found.all()):
            return found
        rest = ~found
        out = found.clone()
        out[rest] = self.slow.remove(ids[rest])
        return out

    def evict(self, n: int) -> tuple[Tensor, Tensor]:
        """Remove up to ``n`` rows from the chain: from the slowest tier first (its own order)."""
        ids, rows = self.slow.evict(n)
        if ids.numel() < n:
            f_ids, f_rows = self.fast.evict(n - ids.numel())
            self.fast.count_transfer(f_ids.numel(), rows.device)
            ids, rows = torch.cat([ids, f_ids]), torch.cat([rows, f_rows.to(rows.device)])
        return ids, rows

    def items(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[Tensor, Tensor]]:
        """Every (ids, records) exactly once: the fast tier's rows, then the slow tier's."""
        yield from self.fast.items(chunk_rows)
        yield from self.slow.items(chunk_rows)

    def flush(self) -> None:
        self.fast.flush()
        self.slow.flush()

    def demote_all(self) -> None:
        """Move every row of the fast tier into the slow one (the fast tier is left empty)."""
        ids, rows = self.fast.evict(len(self.fast))
        if ids.numel():
            self.slow.put(ids, rows)

    def close(self) -> None:
        """Write the fast tier's rows back to the slow one, then close it.

        After this the slow tier holds every row (a disk tier reopened later has them all);
        the fast tier is left empty.
        """
        self.demote_all()
        self.slow.close()

    def warm_start(self, ids: Tensor, counts: Tensor) -> int:
        """Seed access counts from a data sample and promote the most frequent rows held.

        ``ids`` int64 [N] unique, ``counts`` [N] their frequencies in the sample. Rows that do
        not exist yet are admitted as soon as they are created. Returns rows promoted.
        """
        ids_np = ids.numpy()
        c = counts.to(torch.int64).numpy()
        self.sketch.add(ids_np, c)
        order = np.argsort(-c, kind="stable")
        cap = self.fast.capacity
        assert cap is not None
        top = torch.from_numpy(ids_np[order[:cap]])
        top = top[~self.fast.contains(top)]
        if top.numel() == 0:
            return 0
        rows = torch.zeros(top.numel(), self.record_dim, device=self.device)
        found = self.slow.get_into(top, rows)
        sel = torch.nonzero(found).squeeze(1)
        if sel.numel() == 0:
            return 0
        p_ids = top[sel]
        est = self.sketch.estimate(p_ids.numpy())
        admit = self._admit(est)
        pick = torch.from_numpy(admit)
        self.slow.remove(p_ids[pick])
        self._insert_fast(p_ids[pick], rows[sel.to(rows.device)][pick.to(rows.device)], est[admit])
        self.promotions += admit.size
        self.slow.warm_start(ids, counts)
        return int(admit.size)

    # ---- observability ------------------------------------------------------------------------
    def reset_step_stats(self) -> None:
        self.promotions = 0
        self.demotions = 0
        self.bypasses = 0  # rows put straight into the slow tier (not cached, not admitted)
        self.fast.reset_step_stats()
        self.slow.reset_step_stats()

    def stats(self) -> dict[str, float]:
        """Flat ``tier.<name>.*`` counters of every tier in the chain."""
        out = dict(self.fast.stats())
        p = f"tier.{self.fast.name}."
        out[p + "promotions"] = float(self.promotions)
        out[p + "demotions"] = float(self.demotions)
        out[p + "bypasses"] = float(self.bypasses)
        out.update(self.slow.stats())
        return out
