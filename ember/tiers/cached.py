"""CachedTier: a bounded fast tier in front of a slower one (which may itself be a CachedTier).

The chain is *exclusive*: every ID lives in exactly one tier, so ``items()`` yields each ID once
with its newest record and nothing is ever written twice. Rows move as whole records
(``[weights | optimizer state | ...]``) in batches:

- ``get``: IDs found in the fast tier are hits; the misses are read from the slow tier, counted
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
from ember.tiers.host import HostTier
from ember.tiers.policy import CountMinSketch

__all__ = ["CachedTier"]


class CachedTier:
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
        >>> _ = c.get(torch.tensor([1, 2]))  # both miss: each counted once, so admissible
        >>> c.put(torch.tensor([1, 2]), torch.ones(2, 2))
        >>> len(c), len(c.fast), len(c.slow)
        (2, 1, 1)
    """

    def __init__(
        self,
        fast: HostTier,
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
        self.capacity: int | None = getattr(slow, "capacity", None)
        self.admit_after = admit_after
        self.sketch = CountMinSketch(sketch_width or 8 * fast.capacity)
        self.decay_every = decay_every or 16 * self.sketch.width
        self.evict_slack = evict_slack if evict_slack is not None else fast.capacity // 64
        self.name = f"{fast.name}+{getattr(slow, 'name', 'slow')}"
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
        out[rest] = self.slow.contains(ids[rest])  # type: ignore[attr-defined]
        return out

    # ---- reads ----------------------------------------------------------------------------
    def get(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Records [N, R] on CPU and found mask [N]; promotes frequent misses into ``fast``."""
        rows_f, found_f = self.fast.get(ids)
        rows = rows_f.to("cpu")
        found = found_f.clone()
        miss_np = np.flatnonzero(~found.numpy())  # numpy bookkeeping: small arrays, per batch
        if miss_np.size == 0:
            return rows, found
        miss = torch.from_numpy(miss_np)
        miss_ids = ids.index_select(0, miss)
        rows_s, found_s = self.slow.get(miss_ids)
        rows_s = rows_s.to("cpu")
        rows.index_copy_(0, miss, rows_s)
        found_s_np = found_s.numpy()
        found.numpy()[miss_np] = found_s_np
        est = self._count(miss_ids)
        # Promote found rows that pass admission (new rows are admitted at put time).
        cand = torch.from_numpy(np.flatnonzero(found_s_np))
        if cand.numel():
            admit = self._admit(est[cand.numpy()])
            if admit.size:
                pick = cand[torch.from_numpy(admit)]
                p_ids = miss_ids[pick]
                self.slow.remove(p_ids)
                self._insert_fast(p_ids, rows_s[pick], est[pick.numpy()])
                self.promotions += p_ids.numel()
        return rows, found

    def _count(self, ids: Tensor) -> np.ndarray:
        """Count one more access of each ID missing from ``fast``; returns the new estimates."""
        ids_np = ids.numpy()
        self.sketch.add(ids_np)
        if self.sketch.added >= self.decay_every:
            self.sketch.halve()
            self.fast.decay_counts()
        return self.sketch.estimate(ids_np)

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
            self.slow.put(d_ids, d_rows.to("cpu"))
            self.demotions += d_ids.numel()
        self.fast.put(ids, records, counts=counts)

    # ---- writes ---------------------------------------------------------------------------
    def put(self, ids: Tensor, records: Tensor) -> None:
        """Write records where their IDs live; new IDs go through admission."""
        in_fast = self.fast.overwrite(ids, records)
        rest_np = np.flatnonzero(~in_fast)
        if rest_np.size == 0:
            return
        rest = torch.from_numpy(rest_np)
        r_ids = ids.index_select(0, rest)
        r_recs = records.index_select(0, rest)
        in_slow = self.slow.contains(r_ids)  # type: ignore[attr-defined]
        new = torch.nonzero(~in_slow).squeeze(1)
        to_fast = np.empty(0, dtype=np.int64)
        est = None
        if new.numel():
            est = self.sketch.estimate(r_ids[new].numpy())
            to_fast = new.numpy()[self._admit(est)]
        if to_fast.size:
            keep = np.ones(rest.numel(), dtype=bool)
            keep[to_fast] = False
            sel = torch.from_numpy(to_fast)
            counts = self.sketch.estimate(r_ids[sel].numpy())
            self._insert_fast(r_ids[sel], r_recs[sel], counts)
            if keep.any():
                k = torch.from_numpy(np.flatnonzero(keep))
                self.slow.put(r_ids[k], r_recs[k])
        else:
            self.slow.put(r_ids, r_recs)

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
            ids, rows = torch.cat([ids, f_ids]), torch.cat([rows, f_rows.to("cpu")])
        return ids, rows

    def items(self, chunk_rows: int = 1 << 20) -> Iterator[tuple[Tensor, Tensor]]:
        """Every (ids, records) exactly once: the fast tier's rows, then the slow tier's."""
        yield from self.fast.items(chunk_rows)
        yield from self.slow.items(chunk_rows)

    def flush(self) -> None:
        self.fast.flush()
        getattr(self.slow, "flush", lambda: None)()

    def close(self) -> None:
        """Write the fast tier's rows back to the slow one, then close it.

        After this the slow tier holds every row (a disk tier reopened later has them all);
        the fast tier is left empty.
        """
        ids, rows = self.fast.evict(len(self.fast))
        if ids.numel():
            self.slow.put(ids, rows.to("cpu"))
        getattr(self.slow, "close", lambda: None)()

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
        rows, found = self.slow.get(top)
        sel = torch.nonzero(found).squeeze(1)
        if sel.numel() == 0:
            return 0
        p_ids = top[sel]
        est = self.sketch.estimate(p_ids.numpy())
        admit = self._admit(est)
        pick = torch.from_numpy(admit)
        self.slow.remove(p_ids[pick])
        self._insert_fast(p_ids[pick], rows.to("cpu")[sel][pick], est[admit])
        self.promotions += admit.size
        if isinstance(self.slow, CachedTier):
            self.slow.warm_start(ids, counts)
        return int(admit.size)

    # ---- observability ------------------------------------------------------------------------
    def reset_step_stats(self) -> None:
        self.promotions = 0
        self.demotions = 0
        self.fast.reset_step_stats()
        getattr(self.slow, "reset_step_stats", lambda: None)()

    def stats(self) -> dict[str, float]:
        """Flat ``tier.<name>.*`` counters of every tier in the chain."""
        out = dict(self.fast.stats())
        p = f"tier.{self.fast.name}."
        out[p + "promotions"] = float(self.promotions)
        out[p + "demotions"] = float(self.demotions)
        out.update(getattr(self.slow, "stats", lambda: {})())
        return out
