"""OverlayTable: a served table = a full export's rows + the rows delta exports changed since.

The full export's sorted IDs and weights (the base) are shared by every version built on it
and never copied. Each version adds one overlay: the rows the deltas since the full export
wrote (sorted IDs, weights, last-seen steps) and tombstones for the IDs they removed, merged
into one sorted array so a lookup is two binary searches whatever the number of deltas.
Applying a delta builds a new overlay beside the old one (O(overlay + delta) time and memory;
the old version stays intact for the requests still using it), so the overlay grows by the
rows each delta touches until the next full export starts a new base.

A TTL table also carries the table's ``step``: a row (base or overlay) last seen more than
``ttl_steps`` before it reads as absent, exactly as the table reads it, so the served model
equals a full export of the same training state.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ember.serving.predictor import _FrozenTable, search

__all__ = ["OverlayTable"]


class OverlayTable:
    """A base table (``_FrozenTable`` of a full export) plus an overlay of changed rows.

    Example (``base`` a loaded table; a delta's rows for IDs 7 and 9, ID 3 removed)::

        t = OverlayTable(base).with_delta(np.array([7, 9]), rows, None, np.array([3]), step)
        t.rows(torch.tensor([3, 7]))   # 3: its initial row (absent); 7: the delta's row
    """

    def __init__(self, base: _FrozenTable, ids: np.ndarray | None = None, weights: Tensor | None = None,
                 seen: np.ndarray | None = None, removed: np.ndarray | None = None, step: int | None = None) -> None:
        self.base = base
        self.dim, self.ttl = base.dim, base.ttl
        self.step = base.step if step is None else step
        self.ids = ids if ids is not None else np.empty(0, np.int64)
        self.weights = weights if weights is not None else torch.empty(0, base.dim)
        self.seen = seen if seen is not None else (np.empty(0, np.float32) if base.ttl is not None else None)
        self.removed = removed if removed is not None else np.empty(0, bool)  # tombstone per overlay entry

    def with_delta(self, ids: np.ndarray, weights: Tensor, seen: np.ndarray | None, removed: np.ndarray,
                   step: int | None) -> "OverlayTable":
        """A new version: this one with a delta's rows (``ids`` [N] with ``weights`` [N, dim] and
        last-seen steps) and removed IDs applied; a delta's entries win over the overlay's."""
        n, r = ids.size, removed.size
        every = np.concatenate([ids.astype(np.int64), removed.astype(np.int64), self.ids])
        uniq, first = np.unique(every, return_index=True)  # first occurrence: delta rows, then removals, then old
        pick = torch.from_numpy(first)
        w = torch.cat([weights, torch.zeros(r, self.dim), self.weights]).index_select(0, pick)
        tomb = np.concatenate([np.zeros(n, bool), np.ones(r, bool), self.removed])[first]
        s = None
        if self.seen is not None:
            if seen is None:
                raise ValueError("OverlayTable.with_delta: a TTL table's delta needs its rows' last-seen steps")
            s = np.concatenate([seen.astype(np.float32), np.zeros(r, np.float32), self.seen])[first]
        return OverlayTable(self.base, uniq, w, s, tomb, step)

    @property
    def overlay_rows(self) -> int:
        return int(self.ids.size)

    @property
    def overlay_bytes(self) -> int:
        """Memory of this version's overlay (the base is shared and not counted)."""
        n = self.ids.nbytes + self.weights.numel() * self.weights.element_size() + self.removed.nbytes
        return n + (self.seen.nbytes if self.seen is not None else 0)

    def rows(self, ids: Tensor) -> Tensor:
        """Rows [N, dim] of ``ids``: the overlay's, else the base's, else what eval gives an ID
        without a row (initial row, or the zero row below ``min_count``)."""
        q = ids.numpy()
        pos_o, in_o = search(self.ids, q)
        gone = in_o & self.removed[pos_o] if self.ids.size else in_o
        live_o = in_o & ~gone
        pos_b, in_b = search(self.base.ids, q)
        in_b &= ~in_o
        if self.ttl is not None:
            seen = np.zeros(q.size, np.float32)
            if live_o.any():
                seen[live_o] = self.seen[pos_o[live_o]]  # type: ignore[index]
            if in_b.any():
                seen[in_b] = self.base.seen[pos_b[in_b]]  # type: ignore[index]
            fresh = self.step - seen <= self.ttl
            live_o &= fresh
            in_b &= fresh
        out = torch.empty(q.size, self.dim)
        if live_o.any():
            out[torch.from_numpy(live_o)] = self.weights[torch.from_numpy(pos_o[live_o])]
        if in_b.any():
            out[torch.from_numpy(in_b)] = self.base.weights[torch.from_numpy(pos_b[in_b])]
        absent = ~(live_o | in_b)
        if absent.any():
            mask = torch.from_numpy(absent)
            out[mask] = self.base.fallback(ids[mask])
        return out
