"""Table groups and their per-batch lookups: the one path every embedding row takes.

A ``TableGroup`` is the tables of a collection that share a dim, a record width, a row storage
dtype and the fast tier's device (a lone table is a group of one); they may differ in initializer, seed,
optimizer hyperparameters, ``min_count`` and TTL. A ``GroupLookup`` is one batch moving
through explicit phases, each a method that can be called on its own (a pipeline may run them
on different threads, sharding may put all-to-alls between them):

``plan`` (constructor) -> ``fetch`` -> ``pool`` -> [backward] -> [``refresh``] -> ``update``
-> ``write_back``

``refresh`` is for bounded staleness: when later batches' updates were written after this
lookup's fetch, it re-reads those rows so that its update lands on their current values.

All per-batch state lives on the lookup object; the group and its tables hold only what
outlives a batch.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from ember import _native
from ember.batch.sparse import SparseFeatures
from ember.embedding.codec import sr_table_keys
from ember.embedding.config import FeatureConfig
from ember.embedding.init import init_keys, normal_std, normal_tensor, uniform01_tensor, uniform_scale
from ember.embedding.mapped_fetch import MappedFetch
from ember.embedding.pooling import GroupPool, SequenceEmbedding, pool_feature
from ember.embedding.table import EmbeddingTable, fresh_records
from ember.optim import RowWiseAdagrad, rule_lr
from ember.tiers.cached import CachedTier
from ember.tiers.device_budget import download, mark_device, pinned, to_device, upload, upload_parts
from ember.tiers.device_counts import DeviceAdmission, DeviceCounts
from ember.tiers.device import DeviceTier
from ember.tiers.group_cache import CachePlan, CacheTicket, GroupCache, GroupCacheView, table_mix
from ember.tiers.policy import IdCounter
from ember.tiers.host import HostTier, SegmentIds
from ember.tiers.mapped_rows import MappedRows, MappedTier
from ember.tiers.segments import read_bf16_segments, read_segments, write_bf16_segments, write_segments
from ember import once
from ember.fileio import fmt_bytes

__all__ = ["TableGroup", "GroupLookup"]

log = logging.getLogger("ember.embedding")


class TableGroup:
    """Tables read, pooled, updated and written back together, in one buffer per batch.

    Tables are ordered so that equal optimizer configs are adjacent: one optimizer call then
    updates a run of tables. ``features`` lists the group's features table by table.
    """

    def __init__(self, tables: Sequence[EmbeddingTable], features: dict[str, list[FeatureConfig]]) -> None:
        order = sorted(range(len(tables)), key=lambda j: (tables[j].optimizer.model_dump_json(), j))
        self.tables = [tables[j] for j in order]
        first = self.tables[0]
        self.dim = first.dim
        self.width = first.config.stored_dim  # fp32 columns of a decoded record
        self.dtype = first.config.dtype
        self.codec = first.codec  # tiers hold ``codec.words`` words per record (fp32: the same)
        self.device = first.tier.device
        for t in self.tables:
            if (t.dim, t.config.stored_dim, t.config.dtype, t.tier.device) != (self.dim, self.width, self.dtype, self.device):
                raise ValueError(f"table '{t.name}' does not fit the group of '{first.name}' "
                                 "(dim, record width, dtype, device)")
        self.features = [f for t in self.tables for f in features[t.name]]
        self.owner = [j for j, t in enumerate(self.tables) for _ in features[t.name]]  # table of each feature
        self.cache = _group_cache(self.tables, self.codec.identity)  # (a view's device is the tier's it replaced)
        self.mapped = _mapped_group(self.tables)  # storage.index: device: one MappedRows for the group
        self.tiers = [t.tier for t in self.tables]
        # runs of adjacent tables with one optimizer config: one update call each
        self.runs: list[tuple[int, int]] = []
        for j, t in enumerate(self.tables):
            if self.runs and _same(t.optimizer, self.tables[self.runs[-1][0]].optimizer):
                self.runs[-1] = (self.runs[-1][0], j + 1)
            else:
                self.runs.append((j, j + 1))
        # fresh rows of plain tables: one init call per distinct (initializer, optimizer) pair,
        # uniform initializers differing only in scale counting as one (a scale per row)
        self.special = np.array([t.special for t in self.tables], dtype=bool)
        combos: list[tuple] = []
        self.combo = np.zeros(len(self.tables), dtype=np.int64)
        self.scale = np.array([uniform_scale(t.config.initializer, t.dim) for t in self.tables])
        for j, t in enumerate(self.tables):
            init = t.config.initializer
            k = next((i for i, (ci, co) in enumerate(combos) if _same(co, t.optimizer) and (
                _same(ci, init) or ci.type == init.type == "uniform")), None)
            if k is None:
                combos.append((init, t.optimizer))
                k = len(combos) - 1
            self.combo[j] = k
        self.combos = combos
        # combos whose tables' uniform scales differ: fresh rows take a scale per row
        self.mixed_scale = [len({self.scale[j] for j in np.flatnonzero(self.combo == k)}) > 1 for k in range(len(combos))]
        self.seeds = np.array([t.seed for t in self.tables], dtype=np.int64)
        # per combo: the constant initial state of a uniform initializer's new rows (float32), which
        # ``_native.fresh_uniform`` writes in place in one pass; None: ``fresh_records``' path
        self.fills = [np.asarray(st, dtype=np.float32) if init.type == "uniform" and self.dtype in ("fp32", "bf16")
                      and (st := opt.constant_state(self.dim)) is not None else None for init, opt in combos]
        self.init_keys = init_keys(self.seeds)  # each table's key of uniform draws
        # what ``GroupLookup.apply``'s one-pass update (row-wise Adagrad inside the host write) asks
        # of the group itself, decided once: None when it has it, else why not; and each table's
        # (lr, eps) [T, 2] when no table has an lr schedule (else made per step)
        self.mapped_fetch: MappedFetch | None = None  # storage.index: device: a training fetch's device half
        if self.mapped is not None:
            self._fresh_on_device()
            self.mapped_fetch = MappedFetch(self)
        self.fused_why = ("the rows are read and written by the device (storage.index: device)" if self.mapped is not None
                          else f"{self.dtype} rows" if not (self.codec.identity or self.dtype == "bf16")
                          else "a table's optimizer is not row-wise Adagrad" if not all(
                              isinstance(t.optimizer, RowWiseAdagrad) for t in self.tables)
                          else "the rows are not in host memory the native core writes" if not HostTier.native_tiers(self.tiers)
                          else None)
        self.fused_hyper = None
        if self.fused_why is None and all(t.optimizer.schedule is None for t in self.tables):  # type: ignore[union-attr]
            self.fused_hyper = np.array([(t.optimizer.lr, t.optimizer.eps) for t in self.tables],  # type: ignore[union-attr]
                                        dtype=np.float64)
            self.fused_hyper.setflags(write=False)  # shared by every step's write

    def _fresh_on_device(self) -> None:
        """Per table, on the device of the group's ``MappedRows``: the init key, the uniform's
        ``mul``/``add`` (zeros: 0 and 0), a normal initializer's keys and std, and the optimizer's
        constant initial state, from which ``fresh_rows`` makes new rows there (the host path's
        bits: ``uniform01_tensor``, ``normal_tensor``)."""
        assert self.mapped is not None
        dev = self.mapped.device
        zeros = np.array([t.config.initializer.type == "zeros" for t in self.tables])
        scale = np.where(zeros, 0.0, self.scale)
        self.fresh_keys = torch.from_numpy(self.init_keys.view(np.int64)).to(dev)
        self.fresh_mul = torch.from_numpy((2 * scale).astype(np.float32)).to(dev)
        self.fresh_add = torch.from_numpy((-scale).astype(np.float32)).to(dev)
        # tables of a normal initializer: the mask [T], its two uniform streams' keys and std per table
        normal = np.array([t.config.initializer.type == "normal" for t in self.tables])
        self.fresh_normal: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
        if normal.any():
            std = np.array([normal_std(t.config.initializer, self.dim) for t in self.tables], dtype=np.float32)
            self.fresh_normal = (torch.from_numpy(normal).to(dev), *(torch.from_numpy(init_keys(self.seeds, k).view(np.int64)).to(dev)
                                 for k in (1, 2)), torch.from_numpy(std).to(dev))
        ttl = np.array([np.inf if t.config.ttl_steps is None else float(t.config.ttl_steps) for t in self.tables])
        self.ttl_dev = torch.from_numpy(ttl.astype(np.float32)).to(dev) if np.isfinite(ttl).any() else None
        self.expired_dev = torch.zeros(len(self.tables), dtype=torch.int64, device=dev)  # reads of expired rows
        for t in self.tables:
            t.tier.expired = self.expired_dev  # type: ignore[attr-defined]  # (its stats take their share)
        self.table_numbers = torch.arange(len(self.tables), dtype=torch.int32, device=dev)
        # min_count: each table's threshold [T] (1: none), the sightings of IDs without a row and
        # the reads of those held back per table, on the device (each table's admission is a view)
        self.pending: DeviceCounts | None = None
        self.min_counts: Tensor | None = None
        self.shared_counts: Tensor | None = None  # (the two indexes' counts, downloaded together)
        self.filtered_dev: Tensor | None = None
        if any(t.admission is not None for t in self.tables):
            self.pending = DeviceCounts(dev)
            self.shared_counts = self.mapped.index.share_counts(self.pending.index)
            self.min_counts = torch.tensor([t.min_count for t in self.tables], dtype=torch.int32, device=dev)
            self.filtered_dev = torch.zeros(len(self.tables), dtype=torch.int64, device=dev)
            for j, t in enumerate(self.tables):
                if t.admission is not None:
                    held = t.admission.items()  # (counted before the group was made: moved over)
                    t.admission = DeviceAdmission(self.pending, j, len(self.tables), self.filtered_dev)
                    if held[0].size:
                        t.admission.add(*held)
        # each table's state words, then (a TTL) the last-seen step, set when a lookup reads the row
        consts = [t.optimizer.constant_state(self.dim) for t in self.tables]
        consts = [None if c is None else c + [0.0] * (self.width - self.dim - len(c)) for c in consts]
        state = np.array([[0.0] * (self.width - self.dim) if c is None else c for c in consts], dtype=np.float32)
        self.fresh_state = torch.from_numpy(state.reshape(len(self.tables), self.width - self.dim)).to(dev)
        # optimizers whose new state depends on the weights (FTRL): (rule, its tables as a mask [T])
        self.fresh_from_weights = []
        for k, (_, opt) in enumerate(self.combos):
            mine = np.array([self.combo[j] == k and consts[j] is None for j in range(len(self.tables))])
            if mine.any():
                self.fresh_from_weights.append((opt, torch.from_numpy(mine).to(dev)))

    def device_tensors(self) -> list[Tensor]:
        """The device memory a group with ``storage.index: device`` keeps between steps (its
        ``MappedRows`` and the fresh rows' per-table constants): what a ``DeviceBudget`` on a CPU
        "device" is told is the device's."""
        assert self.mapped is not None
        return [*self.mapped.device_tensors(), self.fresh_keys, self.fresh_mul, self.fresh_add, *(self.fresh_normal or ()),
                self.expired_dev, self.table_numbers, self.fresh_state,
                *([] if self.pending is None else [*self.pending.device_tensors(), self.min_counts, self.filtered_dev]),
                *([] if self.ttl_dev is None else [self.ttl_dev]), *(m for _, m in self.fresh_from_weights)]

    def steps_on(self, device: torch.device, dtype: torch.dtype) -> Tensor:
        """Each table's ``step`` [T] on ``device`` (from pinned memory on a GPU: no wait)."""
        return upload(self.steps_host(device, dtype), device)

    def steps_host(self, device: torch.device, dtype: torch.dtype) -> Tensor:
        """Each table's ``step`` [T] in host memory, pinned when ``device`` is a GPU (for a
        non-blocking copy there)."""
        return pinned(torch.tensor([t.step for t in self.tables], dtype=dtype), device)

    def sr_keys_host(self, device: torch.device) -> Tensor:
        """Each table's key of stochastic-rounding noise at its current step (int64 [T],
        ``sr_table_keys``), made on the host, pinned when ``device`` is a GPU."""
        keys = sr_table_keys(self.seeds, np.array([t.step for t in self.tables], dtype=np.int64))
        return pinned(torch.from_numpy(keys.view(np.int64)), device)

    def fresh_rows(self, keys: Tensor, tags: Tensor) -> Tensor:
        """New records [N, width] of the IDs ``keys`` of tables ``tags`` (int32 [N]), made on the
        device by tensor operations: bit for bit what ``GroupLookup._fresh_into`` makes on the host."""
        w = uniform01_tensor(keys, self.fresh_keys[tags], self.dim, self.fresh_mul[tags], self.fresh_add[tags])
        if self.fresh_normal is not None:
            normal, k1, k2, std = self.fresh_normal
            w = torch.where(normal[tags].unsqueeze(1), normal_tensor(keys, k1[tags], k2[tags], self.dim, std[tags]), w)
        w = self.codec.round_exact(w)  # (bf16 / fp16: as they will be stored)
        state = self.fresh_state[tags]
        for opt, mine in self.fresh_from_weights:
            made = opt.init_state(w)
            made = torch.cat((made, state[:, made.shape[1]:]), 1)  # (a TTL table's last-seen word)
            state = torch.where(mine[tags].unsqueeze(1), made, state)
        return torch.cat((w, state), 1)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tables]

    def plan(self, sparse: SparseFeatures, train: bool) -> "GroupLookup":
        """Phase 1: dedupe this batch's IDs per table (see ``GroupLookup``)."""
        return GroupLookup(self, sparse, train)


class GroupLookup:
    """One batch's rows of one table group, moving through the phases.

    plan (this constructor) reads ``sparse`` and writes ``ids`` (unique IDs, table after table),
    ``sizes`` (uniques per table), ``inverse`` (index into ``ids`` of every value of the group's
    features, in group feature order) and ``counts`` (values per feature).
    ``train``: a training lookup counts ``min_count`` sightings and refreshes TTL steps.
    """

    def __init__(self, group: TableGroup, sparse: SparseFeatures, train: bool) -> None:
        self.group = group
        self.sparse: SparseFeatures | None = sparse
        self.train = train
        ranges = sparse.key_ranges()
        names = [f.name for f in group.features]
        missing = [n for n in names if n not in ranges]
        if missing:
            raise KeyError(f"the batch has no sparse feature {missing}; it has {list(sparse.keys)}")
        self.counts = [ranges[n][1] - ranges[n][0] for n in names]
        if tuple(names) == tuple(sparse.keys):
            values = sparse.values
        else:
            values = torch.cat([sparse.values[ranges[n][0] : ranges[n][1]] for n in names]) if names else sparse.values[:0]
        bounds = np.zeros(len(group.tables) + 1, dtype=np.int64)
        np.add.at(bounds, np.asarray(group.owner, dtype=np.int64) + 1, self.counts)
        self._dedupe(values.cpu().numpy(), np.cumsum(bounds))

    @classmethod
    def of_ids(cls, group: TableGroup, table_ids: Sequence[Tensor], train: bool) -> "GroupLookup":
        """Phase 1 for given IDs of each table rather than a batch's features (e.g. the IDs other
        ranks sent to their owner): ``inverse`` maps every given ID, table after table, to its
        row of ``ids``. Such a lookup has no features to pool: its gradient comes through
        ``backward``; fetch, update and write back are as usual."""
        if len(table_ids) != len(group.tables):
            raise ValueError(f"GroupLookup.of_ids: {len(table_ids)} ID tensors for {len(group.tables)} tables")
        lk = GroupLookup.__new__(GroupLookup)
        lk.group, lk.sparse, lk.train, lk.counts = group, None, train, []
        sizes = [t.numel() for t in table_ids]
        values = torch.cat([t.to(torch.int64).cpu() for t in table_ids]) if table_ids else torch.empty(0, dtype=torch.int64)
        lk._dedupe(values.numpy(), np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
        return lk

    def _dedupe(self, values: np.ndarray, bounds: np.ndarray) -> None:
        """Unique IDs per table segment ``bounds`` of ``values``, and the per-batch state."""
        group = self.group
        uniq, inverse, sizes = _native.unique_segments(values, bounds)
        self.ids = torch.from_numpy(uniq)
        self.inverse = torch.from_numpy(inverse)
        self.sizes = [int(s) for s in sizes]
        self.table_of = np.repeat(np.arange(len(group.tables), dtype=np.int64), self.sizes)  # of each unique ID
        # the unique IDs of each table, as tensors kept for the lookup's life: the tiers remember
        # the slots fetch probed for these very tensors, so write_back needs no second probe
        self.table_ids = SegmentIds.split(self.ids, self.sizes)
        self.starts = self.table_ids.bounds
        self.records: Tensor | None = None  # fetch: [U, width] on the group's device
        self.filtered: dict[int, Tensor] = {}  # fetch: table -> rows below min_count (no row, no update)
        self.admitted: dict[int, Tensor] = {}  # fetch: min_count table -> IDs admitted (its counter's only written IDs)
        self.on_device: Tensor | None = None  # to_device: the rows pool reads [U, dim], copied ahead
        self.reached = [False] * len(group.tables)  # backward: tables whose features reached the loss
        self.grad: Tensor | None = None  # backward: [U, dim], one summed gradient per unique ID
        self.updated: list[int] = []  # update: tables stepped
        self.written: list[Tensor] = []  # write_back: IDs stored, per table
        self.ticket: CacheTicket | None = None  # fetch through a group cache: what it decided, for write_back
        self.inverse_dev: Tensor | None = None  # fetch through a group cache: ``inverse`` copied with the rows
        self._bags: list[_Bags] | None = None  # fetch through a group cache: the grouped pooling's plan, copied too
        self._prepared: tuple[CachePlan, list[_Bags], list[Tensor]] | None = None  # prepare: the cache's host half, not yet loaded
        self.mapped_rows: Tensor | None = None  # fetch through MappedRows (training): each ID's record number, on the device
        self._mapped_pairs: Tensor | None = None  # and (record numbers, IDs, tables) int64 [3, U] there
        self._mapped_end: weakref.finalize | None = None  # ends its MappedRows lookup (begin .. end)
        self._mapped_held: Callable[[], Tensor] | None = None  # and, for a change log, which pairs min_count held back

    def _count_moved(self, rows_per_table: Sequence[int], width: int) -> None:
        """Note, per table, rows of ``width`` floats that crossed between host and device."""
        for table, n in zip(self.group.tables, rows_per_table):
            table.count_transfer(int(n), width)

    # ---- phase 2 ------------------------------------------------------------------------
    @property
    def preparable(self) -> bool:
        """Whether ``prepare`` does anything: the group has a device cache, whose host decisions
        may be taken ahead of the device work of the lookups before this one."""
        return self.group.cache is not None

    def prepare(self) -> "GroupLookup":
        """The host half of ``fetch`` through the group's device cache, on its own: probe,
        admissions and victims, the misses read from the slower tiers and fresh rows, all into
        one pinned buffer (and the victims sent to the host: ``GroupCache.send``); ``fetch``
        then only loads it. A pipeline prepares a batch while the batch before it still
        computes, and once that batch's write-back ran, ``reread`` reads again into the plan
        what it stored outside the arena (the arena's own rows are gathered by the load, after
        that write-back in stream order). No-op without a device cache."""
        g = self.group
        if g.cache is not None and self._prepared is None:
            self._stage()
            g.cache.send(self._prepared[0])  # the displaced rows leave now, before the write-backs its load waits for
        return self

    def _stage(self) -> None:
        """The cache's host half: plan and staged rows (``_prepared``)."""
        g = self.group
        assert g.cache is not None
        owner = self.table_of
        bags, extra = self._uploads()
        plan = g.cache.fetch(self.ids.numpy(), self.sizes, self.train, extra)
        miss, found_np, staged = plan.miss, plan.found, plan.staged
        if miss.size:
            fresh = np.flatnonzero(~found_np[miss] & ~g.special[owner[miss]])  # indices into miss
            if fresh.size:
                self._fresh_into(staged, miss[fresh], owner, at=None if fresh.size == miss.size else fresh)
        self._prepared = (plan, bags, extra)
        self.ticket = plan.ticket

    def fetch(self) -> "GroupLookup":
        """Read ``ids``' records from the tiers into ``records`` [U, width] on the fast tier's
        device; absent IDs get fresh rows (one init call per distinct initializer), ``min_count``
        and TTL tables complete their rows (writes ``records``, ``filtered``). Stores nothing.
        Through a device cache: ``prepare`` (unless done), then its device half."""
        g = self.group
        if g.cache is not None:
            self._load_cached()
            return self
        if g.mapped is not None:
            self._fetch_mapped()
            return self
        found = None
        if g.dtype == "bf16" and g.device.type == "cpu":  # widened as they are read: no packed copy, no decode pass
            rec = torch.empty(self.ids.numel(), g.width)
            found = read_bf16_segments(g.tiers, self.table_ids, rec, g.dim)
        if found is None:
            packed = torch.empty(self.ids.numel(), g.codec.words, device=g.device)
            found = read_segments(g.tiers, self.table_ids, packed)
            rec = g.codec.decode(packed)  # fp32 [U, width]; rows of absent IDs are overwritten below
        found_np, owner = found.numpy(), self.table_of
        miss = np.flatnonzero(~found_np & ~g.special[owner])
        if miss.size and rec.device.type == "cpu":
            self._fresh_into(rec, miss, owner, at=miss)
        elif miss.size:  # fresh rows are made on the host
            fresh = torch.empty(miss.size, g.width)
            self._fresh_into(fresh, miss, owner)
            rec.index_copy_(0, torch.from_numpy(miss).to(rec.device), fresh.to(rec.device))
            self._count_moved(np.bincount(owner[miss], minlength=len(g.tables)), g.width)
        self._complete(rec, found)
        return self

    def _fresh_into(self, out: Tensor, rows: np.ndarray, owner: np.ndarray, at: np.ndarray | None = None) -> None:
        """Fresh records of the IDs at positions ``rows`` (of ``ids``; tables ``owner[rows]``)
        into the rows ``at`` of ``out`` [*, width] (default: ``out`` is [len(rows), width], in
        order): one init call per distinct initializer. A uniform initializer with a constant
        initial state writes its rows in place in one native pass (``_native.fresh_uniform``:
        init, bf16 rounding and state; the same bits as ``fresh_records``)."""
        g = self.group
        ids = self.ids.numpy()
        one = len(g.combos) == 1
        combo = None if one else g.combo[owner[rows]]
        in_place = out.device.type == "cpu" and out.dtype == torch.float32 and out.is_contiguous()
        for k, (init, opt) in enumerate(g.combos):
            sel = None if one else np.flatnonzero(combo == k)
            if sel is not None and not sel.size:
                continue
            r = rows if sel is None else rows[sel]
            pos = at if sel is None else (sel if at is None else at[sel])  # rows of ``out``; None: all, in order
            tables = owner[r]
            fill = g.fills[k]
            if in_place and fill is not None:
                if g.mixed_scale[k]:
                    s = g.scale[tables]
                    mul, add = (2 * s).astype(np.float32), (-s).astype(np.float32)
                else:
                    s0 = float(g.scale[tables[0]])
                    mul, add = float(np.float32(2 * s0)), -float(np.float32(s0))
                _native.fresh_uniform(ids[r], g.init_keys[tables], np.arange(r.size) if pos is None else pos,
                                      out.numpy(), g.dim, mul, add, fill, g.dtype == "bf16")
                continue
            scale = g.scale[tables] if g.mixed_scale[k] else None
            fresh = fresh_records(torch.from_numpy(ids[r]), g.seeds[tables], g.dim, init, opt, scale, g.dtype,
                                  out=out if pos is None else None)
            if pos is not None:
                out.index_copy_(0, torch.from_numpy(pos).to(out.device), fresh.to(out.device))

    def _load_cached(self) -> None:
        """The device half of a fetch through the group's device cache: a fixed few device
        operations (``GroupCache.load``) on what ``prepare`` decided and staged."""
        g = self.group
        assert g.cache is not None
        if self._prepared is None:
            self._stage()  # (loaded at once: its one upload carries the displaced rows' slots too)
        assert self._prepared is not None
        (plan, bags, _), self._prepared = self._prepared, None
        rec, dev = g.cache.load(plan)
        self._uploaded(bags, dev, rec.device)
        self._complete(rec, torch.from_numpy(plan.found))

    def _uploads(self) -> tuple[list["_Bags"], list[Tensor]]:
        """The grouped pooling's plan, and the host tensors the device needs beside the rows, in
        one upload's order: ``inverse`` (a lookup of features), then each bag's indexes and layout."""
        bags = self._grouped()
        extra = [self.inverse] if self.sparse is not None else []
        for bg in bags:
            extra += [x for x in (bg.inv, None if bg.layout is None else bg.layout[0]) if x is not None]
        return bags, extra

    def _uploaded(self, bags: list["_Bags"], dev: Sequence[Tensor], device: torch.device) -> None:
        """``_uploads``' tensors, now on ``device`` (``dev``, in their order), taken by the lookup
        and its bags (``pool`` uses them instead of copying its own)."""
        if not dev:
            return
        self.inverse_dev, rest = dev[0], iter(dev[1:])
        for bg in bags:
            bg.inv_dev = None if bg.inv is None else next(rest)
            bg.layout_dev = None if bg.layout is None else _bag_views(next(rest), *bg.layout[1:])
            bg.on = device
        self._bags = bags

    def _fetch_mapped(self) -> None:
        """A fetch through the group's ``MappedRows`` (storage.index: device): one upload of the
        IDs, their tables and the pooling's indexes; on the device, the look-up (a training
        lookup inserts the new pairs), one gather of the records from host memory, fresh rows
        for new IDs (made there) and, in training, one scatter that stores them at once (every
        indexed pair holds its record: a later fetch, a refresh or a dropped lookup never reads
        an unwritten row). No host work per ID beyond the plan's dedupe."""
        g, m = self.group, self.group.mapped
        assert m is not None
        mark_device(*g.device_tensors())  # (nothing unless a DeviceBudget is active)
        owner = self.table_of
        bags, extra = self._uploads()
        fetch = g.mapped_fetch
        assert fetch is not None
        if self.train:  # (the pairs go up with the fetch's own upload: into its graph on a GPU)
            seq = m.begin()
            self._mapped_end = weakref.finalize(self, m.end_later, seq)
            pairs, rec = fetch(self.ids, owner)  # (one CUDA graph on a GPU)
            self.mapped_rows, self._mapped_pairs = pairs[0], pairs
            if g.pending is not None and any(t.changes is not None for t in g.tables):  # (delta exports: IDs stored)
                self._mapped_held = download(pairs[0] == m.scratch)
            self._uploaded(bags, upload_parts(extra, m.device), m.device)
            self.records = rec
            return
        dev = upload_parts([self.ids, torch.from_numpy(owner), *extra], m.device)
        rec = fetch.read(dev[0], dev[1].to(torch.int32))  # (an evaluation: inserts and stores nothing)
        self._uploaded(bags, dev[2:], m.device)
        self.records = rec

    def _complete(self, rec: Tensor, found: Tensor) -> None:
        """``min_count`` and TTL tables finish their rows; ``records`` is set.

        Host records of ``min_count`` tables without a TTL are completed together
        (``_admit_absent``): their absent IDs counted in one pass over the tables' counters, the
        admitted ones' fresh rows made in one native pass for every table (``_fresh_into``, the
        bits ``EmbeddingTable.new_records`` gives), the rest zeroed; the IDs admitted are kept
        (``admitted``): the only ones of the table's written IDs its counter still holds. Other
        tables: ``EmbeddingTable.complete``."""
        g = self.group
        batched: list[int] = []
        for j in np.flatnonzero(g.special).tolist():
            t = g.tables[j]
            if t.ttl is None and isinstance(t.admission, IdCounter) and rec.device.type == "cpu":
                batched.append(j)
                continue
            a, b = int(self.starts[j]), int(self.starts[j + 1])
            filt = t.complete(self.ids[a:b], rec[a:b], found[a:b], self.train)
            if filt is not None and bool(filt.any()):
                self.filtered[j] = filt
        if batched:
            self._admit_absent(rec, found.numpy(), batched)
        self.records = rec

    def _admit_absent(self, rec: Tensor, found: np.ndarray, js: list[int]) -> None:
        """``_complete`` for tables ``js`` (host records, ``min_count``, no TTL), all at once: the
        absent IDs counted in one pass over their counters, each table's decision
        (``EmbeddingTable.admitted_by``), the admitted rows made fresh in one native pass, the
        rest zeroed; ``admitted`` and ``filtered`` noted per table."""
        g, tab = self.group, self.table_of
        take = np.zeros(len(g.tables), dtype=bool)
        take[js] = True
        rows = np.flatnonzero(~found & take[tab])  # the tables' absent rows, table by table
        per = np.bincount(tab[rows], minlength=len(g.tables))[js]
        bounds = np.concatenate([[0], np.cumsum(per)])
        ids_np = self.ids.numpy()
        counts = IdCounter.count([g.tables[j].admission for j in js], ids_np[rows], bounds,
                                 "add" if self.train else "get")
        ok = np.concatenate([g.tables[j].admitted_by(counts[lo:hi])
                             for j, lo, hi in zip(js, bounds[:-1].tolist(), bounds[1:].tolist())])
        at, held = rows[ok], rows[~ok]
        before = np.concatenate([[0], np.cumsum(ok)])  # admitted rows before each row
        for j, a in zip(js, np.split(ids_np[at], before[bounds[1:-1]])):
            self.admitted[j] = torch.from_numpy(a)
        if at.size:
            self._fresh_into(rec, at, tab, at=at)
        if held.size:  # below min_count: the shared all-zero row (no weights, no state)
            rec.index_fill_(0, torch.from_numpy(held), 0.0)
            filt = np.zeros(rec.shape[0], dtype=bool)
            filt[held] = True
            for j in np.unique(tab[held]).tolist():
                a, b = int(self.starts[j]), int(self.starts[j + 1])
                self.filtered[j] = torch.from_numpy(filt[a:b])

    def to_device(self, device: torch.device) -> None:
        """Between fetch and pool (optional): copy the rows pool reads [U, dim] to ``device``
        ahead, from pinned memory, without blocking (a pipeline runs it on its own CUDA stream
        and has ``pool`` wait for it). Reads ``records``; writes ``on_device``."""
        if self.records is None:
            raise RuntimeError("GroupLookup.to_device before fetch")
        w = self.records[:, : self.group.dim]
        if _same_device(w.device, device):
            return
        self._count_moved(self.sizes, self.group.dim)
        if w.device.type == "cpu":
            w = w.contiguous().pin_memory()
        self.on_device = w.to(device, non_blocking=True)

    # ---- phase 3 ------------------------------------------------------------------------
    def pool(self, device: torch.device, on_grad: Callable[["GroupLookup"], None] | None = None) -> dict[str, Tensor | SequenceEmbedding]:
        """Pool every feature of the group from ``records`` on ``device``: {feature: [B, D] or a
        sequence}. For a training lookup the rows form a leaf ``weights`` [U, D]; backward fills
        ``grad`` (one summed gradient per unique ID) and ``reached``, then calls ``on_grad``."""
        if self.records is None:
            raise RuntimeError("GroupLookup.pool before fetch: call fetch() first")
        g = self.group
        w = self.records[:, : g.dim]
        if self.on_device is not None and _same_device(self.on_device.device, device):
            w = self.on_device  # copied ahead by to_device
            if device.type == "cuda":
                w.record_stream(torch.cuda.current_stream(device))
        elif not _same_device(w.device, device):
            self._count_moved(self.sizes, g.dim)
        # a copy to another device is made contiguous; on the CPU no copy: the single-hot pooling
        # gathers from the records' row-strided weights in place (_native.take_rows)
        w = w.to(device, non_blocking=True, memory_format=torch.contiguous_format)
        if self.train:
            # the leaf is not kept on the lookup: its hook below holds the lookup, and a lookup
            # holding its leaf back would be a cycle through the tensor's hooks, which the garbage
            # collector cannot see (every step's rows leaked). The graph keeps the leaf (and so
            # the hook and the lookup) alive until backward has run.
            w = w.detach().requires_grad_()

            def done(leaf: Tensor) -> None:
                self.grad = leaf.grad
                if on_grad is not None:
                    on_grad(self)

            w.register_post_accumulate_grad_hook(done)
        sparse = self.sparse
        if sparse is None:
            raise RuntimeError("GroupLookup.pool: this lookup was made of IDs (of_ids), it has no features to pool")
        inverse = self.inverse_dev if self.inverse_dev is not None and _same_device(self.inverse_dev.device, device) else (
            to_device(self.inverse, device))
        starts = np.concatenate([[0], np.cumsum(self.counts)]).tolist()
        out: dict[str, Tensor | SequenceEmbedding] = {}
        grouped = self._grouped_on(device)  # unweighted sum / mean features: pooled together
        together = {k for bg in grouped for k in bg.ks}
        for k, f in enumerate(g.features):
            if k in together:
                continue
            jf = sparse[f.name]
            idx = inverse[starts[k] : starts[k + 1]]
            wts = None if jf.weights is None else to_device(jf.weights, device)
            res = pool_feature(w, idx, to_device(jf.offsets, device), wts, f.pooling, f.max_length)
            out[f.name] = res
            t = res.values if isinstance(res, SequenceEmbedding) else res
            if self.train and t.requires_grad:
                t.register_hook(self._reach_hook(g.owner[k]))
        for bg in grouped:
            inv = inverse if bg.inv_dev is None else bg.inv_dev
            owner = [g.owner[k] for k in bg.ks]
            outs = GroupPool.apply(w, inv, bg.layout_dev, bg.mode, owner, self._reach_local(owner))
            out.update({g.features[k].name: o for k, o in zip(bg.ks, outs)})
        return out

    def _grouped(self) -> list["_Bags"]:
        """The grouped pooling's plan, on the host: per mode (unweighted ``sum`` / ``mean``) its
        features, the rows of their values when not all of the group's, and the multi-hot
        layout (None: single-hot, a gather)."""
        sparse, g = self.sparse, self.group
        if sparse is None or sparse.weights is not None:
            return []
        modes: dict[str, list[int]] = {}
        for k, f in enumerate(g.features):
            if f.pooling in ("sum", "mean"):
                modes.setdefault(f.pooling, []).append(k)
        b = sparse.batch_size
        starts = np.concatenate([[0], np.cumsum(self.counts)]).tolist()
        key_pos = {key: i for i, key in enumerate(sparse.keys)}
        # the plan is made on the host: a batch given on the device has its lengths copied once
        lengths = sparse.lengths.cpu().view(len(sparse.keys), b)
        out = []
        for mode, ks in modes.items():
            inv = None if len(ks) == len(g.features) else torch.cat([self.inverse[starts[k] : starts[k + 1]] for k in ks])
            rows = [key_pos[g.features[k].name] for k in ks]
            lens = lengths if rows == list(range(len(sparse.keys))) else lengths[torch.tensor(rows)]
            values = self.inverse.numel() if inv is None else inv.numel()
            layout = None
            # single-hot: as many values as bags, none empty (the batch's shortest bag, found
            # once by key_ranges, answers unless it is empty; numpy: torch's int64 min is ~10x slower)
            if values != len(ks) * b or (b and sparse.min_length() < 1 and int(lens.numpy().min()) < 1):
                layout = _bag_host(lens.reshape(-1))
            out.append(_Bags(mode, ks, inv, layout))
        return out

    def _grouped_on(self, device: torch.device) -> list["_Bags"]:
        """``_grouped`` with its tensors on ``device`` (copied with the rows by a group cache's
        fetch, else now)."""
        if self._bags is not None and all(bg.on is not None and _same_device(bg.on, device) for bg in self._bags):
            return self._bags
        bags = self._grouped()
        for bg in bags:
            bg.inv_dev = None if bg.inv is None else to_device(bg.inv, device)
            bg.layout_dev = None if bg.layout is None else _bag_views(to_device(bg.layout[0], device), *bg.layout[1:])
            bg.on = device
        return bags

    def backward(self, grad: Tensor) -> None:
        """Hand the lookup its gradient directly, [U, dim] summed per unique ID (what autograd
        does through ``pool``; e.g. gradients that arrive from other ranks, or a benchmark):
        every table of the group counts as reached."""
        if grad.shape != (self.ids.numel(), self.group.dim):
            raise ValueError(f"GroupLookup.backward: grad must be [{self.ids.numel()}, {self.group.dim}], got {list(grad.shape)}")
        self.grad = grad
        self.reached = [True] * len(self.reached)

    def _reach_hook(self, table: int) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            self.reached[table] = True

        return hook

    def _reach_local(self, owner: list[int]) -> Callable[[int], None]:
        def reach(k: int) -> None:
            self.reached[owner[k]] = True

        return reach

    # ---- phase 4 ------------------------------------------------------------------------
    def keys(self, table_ids: Sequence[Tensor] | None = None) -> np.ndarray:
        """One int64 key per (table, ID) of ``table_ids`` (default: all of this lookup's), the
        ID mixed with its table: equal pairs give equal keys (distinct pairs rarely collide;
        ``refresh`` only ever re-reads a row too many for it)."""
        if table_ids is not None:
            return pair_keys(table_ids)
        return _keyed(self.ids.numpy(), self.sizes)

    def refresh(self, writes: Sequence[np.ndarray]) -> int:
        """Before ``update`` under bounded staleness: re-read from the tiers the rows of this
        lookup that later write-backs of the same group stored after this lookup's fetch
        (``writes``: ``keys(written)`` of each), so the update applies this batch's gradient to
        the rows' current values and no update is lost. A row below ``min_count`` at fetch
        time that another batch has since admitted is updated too. Writes ``records`` and
        ``filtered``; returns the rows re-read."""
        if self.records is None:
            raise RuntimeError("GroupLookup.refresh before fetch")
        writes = [w for w in writes if w.size]
        if not writes:
            return 0
        g = self.group
        at = _members(self.keys(), writes)  # positions in ``ids``, table after table
        if not at.size:
            return 0
        cut = np.searchsorted(at, self.starts[1:-1])
        ids = self.ids.numpy()
        if g.cache is not None and _same_device(self.records.device, g.cache.device):
            at = self._refresh_cached(at, [p.size for p in np.split(at, cut)])
        elif g.mapped is not None and self._mapped_pairs is not None:  # (every indexed pair holds its record)
            at_dev = upload(torch.from_numpy(at), self.records.device)
            pairs = self._mapped_pairs
            row = pairs[0].index_select(0, at_dev)
            rows = g.codec.decode(g.mapped.gather(row))
            if g.pending is not None:  # (a pair min_count held back keeps its zero row: no batch before stored it)
                rows = torch.where((row == g.mapped.scratch).unsqueeze(1), self.records.index_select(0, at_dev), rows)
            self.records.index_copy_(0, at_dev, rows)
        else:
            subsets = [torch.from_numpy(ids[p]) for p in np.split(at, cut)]
            packed = self.records.new_empty(at.size, g.codec.words)
            found = read_segments(g.tiers, subsets, packed).numpy()  # one pass over the group's tiers
            rows = g.codec.decode(packed)
            if not found.all():
                keep = np.flatnonzero(found)
                at, rows = at[keep], rows.index_select(0, torch.from_numpy(keep).to(rows.device))
            self.records.index_copy_(0, torch.from_numpy(at).to(self.records.device), rows)
        for j, f in self.filtered.items():  # admitted since the fetch by another batch: updated now
            a = int(self.starts[j])
            f[torch.from_numpy(at[(at >= a) & (at < a + f.numel())] - a)] = False
        return int(at.size)

    def reread(self, written: Callable[[], Sequence[np.ndarray]]) -> int:
        """Between ``prepare`` and ``fetch``, once write-backs of the same group ran since the
        prepare (``written()``: keys of the rows each stored, as ``refresh`` takes them): the
        rows the cache's prepare read outside its arena that they stored are read again into
        the staged plan, on the host (``GroupCache.reread``); the arena's rows are gathered by
        the load, after those write-backs. Which rows: after one write-back, the cache knows
        (``GroupCache.stored_since``: its misses now in the arena or in the spill rows), else
        the misses among ``written()``. The rows are then as a fetch after the write-backs
        reads them, bit for bit. Returns the rows re-read."""
        g = self.group
        if self._prepared is None or not self._prepared[0].miss.size:
            return 0
        assert g.cache is not None
        plan, ids = self._prepared[0], self.ids.numpy()
        miss = plan.miss
        at = g.cache.stored_since(plan, ids)
        if at is None:
            writes = [w for w in written() if w.size]
            if not writes:
                return 0
            at = miss[_members(self.keys()[miss], writes)]
        return g.cache.reread(plan, ids, at)

    def _refresh_cached(self, at: np.ndarray, sizes: list[int]) -> np.ndarray:
        """``refresh``'s read through the group's device cache, as its fetch reads (one probe of
        the group's index, the rows not in the arena from the slower tiers into one staging
        buffer, a fixed few device operations; no admission, no access counted), not one table
        at a time through its view (each a probe, a gather, a wait for every pending copy).
        Returns the positions re-read (those found)."""
        cache = self.group.cache
        assert cache is not None and self.records is not None
        plan = cache.fetch(self.ids.numpy()[at], sizes, train=False, extra=[torch.from_numpy(at)], stats=False)
        rows, (at_dev,) = cache.load(plan)
        found = plan.found
        if found.all():
            self.records.index_copy_(0, at_dev, rows)
            return at
        keep = np.flatnonzero(found)  # (rare: an ID gone from the chain since; its fetched row stays)
        k = torch.from_numpy(keep).to(rows.device)
        self.records.index_copy_(0, at_dev.index_select(0, k), rows.index_select(0, k))
        return at[keep]

    def update(self, step: int | None = None) -> None:
        """Run each table's sparse optimizer on the rows of ``records`` whose features reached the
        loss, with ``grad`` (reads ``grad``, ``reached``, ``filtered``; writes ``records``,
        ``updated`` and each stepped table's ``step``). One call per run of tables sharing an
        optimizer config. ``step``: the global step (0-based) at which an optimizer ``schedule``
        reads its lr (required when a reached table has one)."""
        if self.grad is None or self.records is None:
            raise RuntimeError("GroupLookup.update needs a gradient: run loss.backward() after pool()")
        g, rec = self.group, self.records
        grad = self._grad_on_records()
        for lo, hi in g.runs:
            j = lo
            while j < hi:  # sub-runs of reached tables
                if not self.reached[j]:
                    j += 1
                    continue
                k = j
                while k < hi and self.reached[k]:
                    k += 1
                table = g.tables[j]
                if step is None and getattr(table.optimizer, "schedule", None) is not None:
                    raise RuntimeError(f"table '{table.name}' has an lr schedule: pass the global step to update(step=...) "
                                       "(SparseOptimizer.step() and the trainer do)")
                for t in g.tables[j:k]:
                    t.step += 1
                self.updated.extend(range(j, k))
                a, b = int(self.starts[j]), int(self.starts[k])
                skip = [(int(self.starts[m]), f) for m, f in self.filtered.items() if j <= m < k]
                if not skip:
                    _optimizer_step(table, rec[a:b], grad[a:b], step)
                else:
                    mask = torch.zeros(b - a, dtype=torch.bool)
                    for start, f in skip:
                        mask[start - a : start - a + f.numel()] = f
                    keep = (torch.nonzero(~mask).squeeze(1) + a).to(rec.device)
                    sub = rec.index_select(0, keep)
                    _optimizer_step(table, sub, grad.index_select(0, keep), step)
                    rec.index_copy_(0, keep, sub)
                j = k

    # ---- phases 4 and 5 together ----------------------------------------------------------
    def apply(self, step: int | None = None) -> None:
        """``update`` then ``write_back`` (what ``SparseOptimizer`` runs once a batch's gradient
        is in). When every table reached the loss and filters no row, the rows live in host
        memory the C core writes, and every table's optimizer is row-wise Adagrad, the update
        runs inside the write: one pass over the batch's records instead of two
        (``_native.write_rows``' ``adagrad``), bit for bit the two phases' result. Rows below
        ``min_count`` (fp32 rows) are left out of that pass (``_write_all``'s ``skip``)."""
        g, rec = self.group, self.records
        if self.grad is not None and rec is not None:
            self._grad_on_records()  # (a model on a GPU, rows on the host: moved as update moves it)
        hyper = self._fused_hyper(step)
        if hyper is None:
            self.update(step)
            self.write_back()
            return
        assert rec is not None and self.grad is not None
        grad = self.grad.contiguous()
        for t in g.tables:
            t.step += 1
        self.updated = list(range(len(g.tables)))
        keep = _keep_mask(self) if self.filtered else None
        if not self._write_all((grad.numpy(), hyper), None if keep is None else ~keep):
            for t in g.tables:  # nothing written (a bounded tier without room): the two phases
                t.step -= 1
            self.updated = []
            self.update(step)
            self.write_back()
            return
        self._wrote(self.table_ids if keep is None else self._kept(keep))

    def _kept(self, keep: np.ndarray) -> list[Tensor]:
        """Each table's IDs whose rows ``keep`` (bool [U]) marks: the IDs a write stored."""
        at = np.concatenate([[0], np.cumsum(keep)])[np.asarray(self.starts)]  # kept rows before each table's
        return SegmentIds.split(torch.from_numpy(self.ids.numpy()[keep]), np.diff(at).tolist())

    def _grad_on_records(self) -> Tensor:
        """``grad`` on the records' device: moved there once (counted in the tables' transfer bytes)."""
        assert self.grad is not None and self.records is not None
        if not _same_device(self.grad.device, self.records.device):
            self._count_moved(self.sizes, self.group.dim)
            self.grad = self.grad.to(self.records.device)
        return self.grad

    def _fused_hyper(self, step: int | None) -> np.ndarray | None:
        """(lr, eps) per table [T, 2] when ``apply`` can run the optimizer inside the write, else
        None (a rule other than row-wise Adagrad, a device cache, fp16 rows, and a step in which a
        table missed the loss or rows below min_count are held back are each said once)."""
        g, rec, grad = self.group, self.records, self.grad
        if grad is None or rec is None:
            return None
        why = ("the rows have a device cache" if g.cache is not None and self.ticket is not None
               else g.fused_why if g.fused_why is not None
               else f"the gradient is {grad.dtype} on {grad.device}" if not (
                   grad.dtype == torch.float32 and grad.device.type == "cpu")
               else "a table's features did not reach the loss, so its rows are neither updated nor written"
               if not all(self.reached)
               else "rows below min_count are held back (stored nowhere) in such a step" if self.filtered
               and not g.codec.identity
               else None)
        if why is not None:
            if once.first("group.fused_update", why):
                log.info("table group of '%s': sparse optimizer and write-back in two passes (%s; the one-pass "
                         "update serves row-wise Adagrad on host rows)", g.tables[0].name, why)
            return None
        if not (rec.device.type == "cpu" and rec.dtype == torch.float32 and rec.is_contiguous()
                and grad.shape == (rec.shape[0], g.dim)):
            return None  # (a group's records on host rows are always so: a guard, not a path)
        if g.fused_hyper is not None:
            return g.fused_hyper
        if step is None:  # a table has an lr schedule
            return None  # update raises what to do
        hyper = np.empty((len(g.tables), 2), dtype=np.float64)
        for j, t in enumerate(g.tables):
            rule = t.optimizer
            lr = rule_lr(rule, step)
            hyper[j] = (rule.lr if lr is None else lr, rule.eps)  # type: ignore[union-attr]
        return hyper

    # ---- phase 5 ------------------------------------------------------------------------
    def discard(self) -> None:
        """A training lookup that will not be written back (no table reached the loss, a
        skipped step) lets its group cache evict the rows it held."""
        if self.group.cache is not None:
            self._prepared = None  # (prepared, never loaded: its victims were sent at once)
            self.group.cache.release(self.ticket)
            self.ticket = None
        self._end_mapped()

    def _end_mapped(self) -> None:
        """A training lookup through ``MappedRows`` ends: rows removed meanwhile may be reused."""
        done, self._mapped_end = self._mapped_end, None
        info = done.detach() if done is not None else None
        if info is not None and self.group.mapped is not None:
            self.group.mapped.end(info[2][0])  # (the finalizer's own argument: the lookup's number)

    def _write_back_cached(self) -> None:
        g, rec = self.group, self.records
        assert g.cache is not None and self.ticket is not None and rec is not None
        keep = _keep_mask(self)
        g.cache.write_back(self.ticket, self.ids.numpy(), self.sizes, rec, keep)
        self.ticket = None
        self._wrote(self._kept(keep))

    def write_back(self) -> None:
        """Store the updated tables' rows in their tiers (rows below ``min_count`` get none),
        then each table's bookkeeping (admission counts, TTL sweep). Reads ``records``,
        ``updated``, ``filtered``. A bf16/fp16 group's weights are rounded stochastically with
        noise of (table seed, table step, ID, column) (``RowCodec.encode``)."""
        if self.records is None:
            raise RuntimeError("GroupLookup.write_back before fetch")
        g, rec = self.group, self.records
        ids = self.table_ids
        if g.cache is not None and self.ticket is not None:
            self._write_back_cached()
            return
        if g.mapped is not None and self.mapped_rows is not None:  # one scatter of every row (the others' unchanged)
            assert g.mapped_fetch is not None and self._mapped_pairs is not None
            g.mapped_fetch.write(self._mapped_pairs, rec)  # (16-bit: rounded as the host path writes)
            written = [ids[j] if j in self.updated else ids[j][:0] for j in range(len(g.tables))]
            held, self._mapped_held = self._mapped_held, None
            if held is not None:  # (the pairs min_count held back were stored nowhere)
                stored = ~held().numpy()
                written = [w[torch.from_numpy(stored[a:b])] for w, a, b in zip(written, self.starts[:-1], self.starts[1:])]
            self._wrote(written)
            self._end_mapped()
            return
        if len(self.updated) == len(g.tables) and not self.filtered:
            self._write_all()
            written = ids
        else:
            tiers, parts, rows = [], [], []
            written = [ids[j][:0] for j in range(len(g.tables))]
            for j in self.updated:
                a, b = int(self.starts[j]), int(self.starts[j + 1])
                i, r = ids[j], rec[a:b]
                if j in self.filtered:
                    keep = torch.nonzero(~self.filtered[j]).squeeze(1)
                    i, r = i[keep], r.index_select(0, keep.to(r.device))
                tiers.append(g.tiers[j])
                parts.append(i)
                rows.append(g.codec.encode(r, i, g.tables[j].seed, g.tables[j].step))
                written[j] = i
            if tiers:
                write_segments(tiers, parts, torch.cat(rows) if len(rows) > 1 else rows[0])
        self._wrote(written)

    def _write_all(self, adagrad: tuple[np.ndarray, np.ndarray] | None = None, skip: np.ndarray | None = None) -> bool:
        """Every table's rows of ``records`` into its tiers (all updated). A bf16 group's rows
        are packed as they are written (the bits encode gives), else encoded, then written.
        ``adagrad`` (``apply``): the row-wise Adagrad step inside the write, only in one native
        pass: False, nothing written, where the C core cannot write it. ``skip`` (bool [U], fp32
        rows with ``adagrad``): rows below ``min_count``, left out of that pass."""
        g, rec, ids = self.group, self.records, self.table_ids
        assert rec is not None and (skip is None or (g.codec.identity and adagrad is not None))
        if g.codec.identity:
            if adagrad is not None:
                return HostTier.write_segments_native(g.tiers, ids, rec, None, adagrad, skip)
            write_segments(g.tiers, ids, rec)
            return True
        steps = np.array([t.step for t in g.tables], dtype=np.int64)
        if g.dtype == "bf16" and write_bf16_segments(g.tiers, ids, rec, g.dim, g.seeds, steps, adagrad):
            return True
        if adagrad is not None:
            return False
        rec = g.codec.encode(rec, self.ids, torch.from_numpy(np.repeat(g.seeds, self.sizes)),  # per row: its table's
                             torch.from_numpy(np.repeat(steps, self.sizes)))
        write_segments(g.tiers, ids, rec)
        return True

    def _wrote(self, written: Sequence[Tensor]) -> None:
        """Note the IDs each table stored (``written``, for later refreshes) and run each updated
        table's bookkeeping (admission counts, TTL sweep). The IDs admitted by the fetch leave
        their tables' counters in one pass (``IdCounter.count``)."""
        self.written = list(written)
        tables = self.group.tables
        left = {j: self.admitted[j] for j in self.updated
                if j in self.admitted and isinstance(tables[j].admission, IdCounter) and self.admitted[j].numel()}
        if left:
            gone = [a.numpy() for a in left.values()]
            IdCounter.count([tables[j].admission for j in left], np.concatenate(gone),
                            np.cumsum([0] + [a.size for a in gone]), "remove")
        for j in self.updated:
            tables[j].after_write(self.written[j], self.ids[:0] if j in left else self.admitted.get(j))


@dataclass
class _Bags:
    """Features of one group pooled together (unweighted ``sum`` or ``mean``), see ``_grouped``."""

    mode: str
    ks: list[int]  # the features (indices into the group's)
    inv: Tensor | None  # host: rows of their values (None: ``inverse`` itself)
    layout: tuple[Tensor, int, int] | None  # host: multi-hot layout (``_bag_host``), None: single-hot
    inv_dev: Tensor | None = None
    layout_dev: tuple[Tensor, Tensor, Tensor] | None = None
    on: torch.device | None = None  # where ``inv_dev`` and ``layout_dev`` are


def _bag_host(lengths: Tensor) -> tuple[Tensor, int, int]:
    """Multi-hot bags of values with ``lengths`` [n] (host), packed in one int64 tensor for one
    copy to the device: offsets [n], the bag of every value [N], and 1 / length as float32 bits
    (a mean's scale; 1 for an empty bag). Returns (packed, n, N); ``_bag_views`` unpacks."""
    n = lengths.numel()
    offsets = torch.zeros(n, dtype=torch.int64)
    torch.cumsum(lengths[:-1], 0, out=offsets[1:])
    bag_of = torch.repeat_interleave(torch.arange(n), lengths)
    scale = torch.zeros((n + 1) // 2, dtype=torch.int64)  # two float32 per int64 word
    scale.view(torch.float32)[:n] = 1.0 / lengths.clamp(min=1).to(torch.float32)
    return torch.cat([offsets, bag_of, scale]), n, bag_of.numel()


def _bag_views(packed: Tensor, n: int, values: int) -> tuple[Tensor, Tensor, Tensor]:
    """(offsets, bag of each value, 1 / length) of a ``_bag_host`` layout, wherever it is."""
    return packed[:n], packed[n : n + values], packed[n + values :].view(torch.float32)[:n]


def _keep_mask(lookup: "GroupLookup") -> np.ndarray:
    """bool [U]: the rows ``write_back`` stores (updated tables, less rows below ``min_count``)."""
    keep = np.zeros(lookup.ids.numel(), dtype=bool)
    for j in lookup.updated:
        a, b = int(lookup.starts[j]), int(lookup.starts[j + 1])
        keep[a:b] = True if j not in lookup.filtered else ~lookup.filtered[j].numpy()
    return keep


def _group_cache(tables: Sequence[EmbeddingTable], identity: bool) -> GroupCache | None:
    """One ``GroupCache`` for ``tables`` when each has a device cache (their tiers become its
    views), else None (each table keeps its own chain). Says once why a group cannot have one."""
    names = [t.name for t in tables]
    views = [t.tier for t in tables if isinstance(t.tier, GroupCacheView)]
    if views:  # a group over these tables was made before (e.g. ember.testing's lookups): the same cache
        cache = views[0].cache
        if len(views) == len(tables) == len(cache.views) and [v.j for v in views] == list(range(len(tables))) and all(
                v.cache is cache for v in views):
            return cache
        _log_once(f"table group {names}: its tables' device caches belong to another group; rows are read and "
                  "written through that group's cache one table at a time")
        return None
    cached = [isinstance(t.tier, CachedTier) and isinstance(t.tier.fast, DeviceTier) for t in tables]
    if not any(cached):
        return None
    if not all(cached) or not identity:
        why = "some of its tables have no device cache" if not all(cached) else "its rows are not float32"
        _log_once(f"table group {names}: one device cache per table ({why}; a group cache needs a device cache "
                  "on every table of the group and float32 rows)")
        return None
    tiers = [t.tier for t in tables]
    first = tiers[0]
    assert isinstance(first, CachedTier)
    if len({(c.policy, c.admit_after) for c in tiers}) > 1:  # type: ignore[attr-defined]
        _log_once(f"table group {names}: its tables' cache policies differ; the group's cache uses "
                  f"'{first.policy}', admit_after {first.admit_after} (those of '{names[0]}')")
    capacity = sum(int(c.fast.capacity) for c in tiers)  # type: ignore[attr-defined]
    record_dim, device = first.record_dim, first.device  # type: ignore[attr-defined]
    policy, admit_after = first.policy or "lfu", first.admit_after  # type: ignore[attr-defined]
    slows = []
    for t, c in zip(tables, tiers):  # each table's own cache empties into its slower tier (rows stored before
        c.demote_all()  # the group existed: none in a new table) and goes, its device memory with it, before
        slows.append(c.slow)  # the group's arena is allocated: never both at once
        t.tier = c.slow
    del tiers, first, c
    cache = GroupCache(slows, capacity, record_dim, device, policy, admit_after, names)
    for t, view in zip(tables, cache.views):
        t.tier = view
    _log_once(f"table group {names}: one {cache.device.type} cache of {capacity:,} rows for its {len(tables)} tables, "
              f"and {cache.spill_rows:,} spill rows for the rows a step does not cache: "
              f"{fmt_bytes(cache.arena.numel() * 4)} in all")
    return cache


def _mapped_group(tables: Sequence[EmbeddingTable]) -> MappedRows | None:
    """One ``MappedRows`` for ``tables`` when their storage is ``index: device`` (the collection
    groups those apart), their tiers becoming its views; rows they held already move into it."""
    tiers = [t.tier for t in tables]
    if not tiers or not all(isinstance(x, MappedTier) for x in tiers):
        return None
    first = tiers[0].rows  # type: ignore[attr-defined]
    # the group's hot rows: its tables' device budgets summed, one frequency ranking over the group
    hot = sum(x.hot_rows for x in tiers)  # type: ignore[attr-defined]
    if all(x.rows is first and x.j == j and x.tables == len(tables) for j, x in enumerate(tiers)):  # type: ignore[attr-defined]
        first.keep_hot(hot)  # (a group of one table, or one made before)
        _log_mapped([t.name for t in tables], first)
        return first
    held = sum(len(x) for x in tiers)
    rows = MappedRows(first.record_dim, first.device, capacity=max(2 * held, 1 << 16), hot_rows=hot)
    for j, (t, x) in enumerate(zip(tables, tiers)):
        t.tier = MappedTier(rows, j, len(tables))
        t.tier.hot_rows = x.hot_rows  # type: ignore[attr-defined]
        for ids, rec in x.items():
            t.tier.put(ids, rec)
    _log_mapped([t.name for t in tables], rows)
    return rows


def _log_mapped(names: list[str], rows: MappedRows) -> None:
    where = ("in pinned host memory, indexed on the GPU" if rows.device.type == "cuda" else
             "in host memory, indexed by tensor operations on the CPU (the index is made for a GPU: on a CPU, "
             "storage.index: host is faster)")
    if rows.hot is not None:
        where += (f", and copies of the {rows.hot.capacity:,} read most in "
                  f"{'GPU' if rows.device.type == 'cuda' else 'host'} memory ({fmt_bytes(rows.hot.nbytes)}), chosen "
                  f"again every {rows.hot.every} training steps")
    _log_once(f"table group {names}: every row {where} (storage.index: device)")


def _log_once(msg: str) -> None:
    if once.first("group.layout", msg):
        log.info("%s", msg)


def pair_keys(table_ids: Sequence[Tensor]) -> np.ndarray:
    """``GroupLookup.keys`` of the IDs ``table_ids[j]`` of each table j of a group."""
    ids = torch.cat(list(table_ids)).numpy() if table_ids else np.empty(0, np.int64)
    return _keyed(ids, [t.numel() for t in table_ids])


def _keyed(ids: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    return ids ^ np.repeat(table_mix(len(sizes)), sizes)


def _members(ids: np.ndarray, among: list[np.ndarray]) -> np.ndarray:
    """Positions (ascending) of ``ids`` found in any array of ``among`` (sorted search)."""
    cand = np.sort(np.concatenate(among)) if len(among) > 1 else np.sort(among[0])
    at = np.minimum(np.searchsorted(cand, ids), cand.size - 1)
    return np.flatnonzero(cand[at] == ids)


def _optimizer_step(table: EmbeddingTable, records: Tensor, grads: Tensor, at: int | None) -> None:
    """Run ``table``'s optimizer on records [N, >= record_dim] in place (weights then state),
    at the lr its schedule gives step ``at``."""
    dim, record_dim = table.dim, table.config.record_dim
    rule = table.optimizer
    rows, state = rule.update(records[:, :dim], records[:, dim:record_dim], grads, table.step, None if at is None else rule_lr(rule, at))
    if rows.data_ptr() != records.data_ptr():
        records[:, :dim] = rows
    if state.numel() and state.data_ptr() != records[:, dim:record_dim].data_ptr():
        records[:, dim:record_dim] = state


def _same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` are one device when the current device is 0."""
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    current = torch.cuda.current_device()
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)


def _same(a: object, b: object) -> bool:
    """Config equality, cheap when shared (pydantic ``==`` is slow; shared configs are common)."""
    return a is b or a == b
