"""EmbeddingCollection: SparseFeatures -> pooled per-feature tensors; the autograd boundary.

Per table, the IDs of every feature using it are deduplicated once; their rows are gathered
once into a small leaf tensor ``W`` [U, D] that requires grad; each feature pools from ``W``
with ``embedding_bag`` over the inverse indices. Backward therefore yields ``W.grad``: the
gradient of each unique ID, already summed over its occurrences — never a dense table gradient.
``apply_gradients()`` hands those to each table's sparse optimizer.

Tables are batched (as FBGEMM's table-batched embeddings): tables of one dim and stored width
whose features all pool unweighted with the same ``sum`` or ``mean`` form a group. A group's
rows are gathered into one records buffer, its leaf ``W`` [sum U, D] is a view of it, all its
features pool in one ``embedding_bag`` and backward runs once; if its tables also share the
optimizer config and step (and have no ``min_count`` filter), one optimizer call updates them
all. Results equal the per-table computation; other tables take the per-table path.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ember import _native
from ember.batch.sparse import SparseFeatures
from ember.embedding.config import FeatureConfig, TableConfig
from ember.embedding.table import EmbeddingTable

__all__ = ["EmbeddingCollection", "SequenceEmbedding", "TableLookup"]


class SequenceEmbedding(NamedTuple):
    """Unpooled embeddings of a sequence feature: values [B, L, D] (zero-padded), mask [B, L]."""

    values: Tensor
    mask: Tensor


@dataclass
class TableLookup:
    """The rows one batch read from one table: unique IDs, their records, inverse per feature."""

    table: str
    ids: Tensor  # int64 [U], CPU
    records: Tensor  # float32 [U, R], CPU (a row range of the group's buffer when batched)
    inverse: Tensor | None  # int64 [N] into ids, over the table's feature values (None in a group: see group.inverse)
    weights: Tensor | None = None  # leaf [U, D] on the model device, set by forward
    group: "_Group | None" = field(default=None, repr=False)  # set when batched with other tables


@dataclass
class _Group:
    """Tables batched together for one batch: their lookups back to back in one buffer."""

    lookups: list[TableLookup]
    records: Tensor  # [sum U, stored_dim]; each lookup's records is a row range of it
    inverse: Tensor  # int64 [N] into records, over all the group's feature values in order
    mode: str  # "sum" or "mean"
    weights: Tensor | None = None  # leaf [sum U, D], set by forward
    reached: list[bool] | None = None  # per lookup: did any of its features reach the loss


class _GroupPool(torch.autograd.Function):
    """A group's pooling: ``embedding_bag`` (sum or mean) of ``w`` [U, D] for n features, as n
    outputs [B, D] (``offsets`` None: single-hot, bag i is value i); backward is a scatter-add
    into [U, D] and notes which features reached the loss.

    CPU ``embedding_bag`` backward sorts all N indices first; for a group of many tables the
    scatter-add over the (already deduplicated) inverse indices is several times cheaper.
    When every bag holds one value (single-hot features) the pooling is a plain row gather,
    ~5x cheaper than ``embedding_bag`` on CPU, and backward adds each feature's gradient where
    it lies (often a row-strided slice of the model's stacked gradient) without stacking them.
    A batched table whose features never reach the loss must not be updated (as without
    batching, where its ``W.grad`` stays None), so ``group.reached`` records which did.
    """

    @staticmethod
    def forward(ctx, w: Tensor, inverse: Tensor, offsets: Tensor | None, mode: str, group: _Group, owner: list[int]):  # type: ignore[override]
        single = offsets is None  # bag i is value i
        lengths = inverse.new_empty(0) if single else torch.diff(offsets, append=offsets.new_tensor([inverse.numel()]))
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(inverse, lengths)
        ctx.mode, ctx.rows, ctx.single, ctx.group, ctx.owner = mode, w.shape[0], single, group, owner
        pooled = w.index_select(0, inverse) if single else F.embedding_bag(inverse, w, offsets, mode=mode)
        return tuple(pooled.view(len(owner), -1, w.shape[1]).unbind(0))

    @staticmethod
    def backward(ctx, *grads: Tensor | None):  # type: ignore[override]
        inverse, lengths = ctx.saved_tensors
        reached = [False] * len(ctx.group.lookups)
        for g, t in zip(grads, ctx.owner):
            reached[t] = reached[t] or g is not None
        ctx.group.reached = reached
        like = next(g for g in grads if g is not None)
        gw = like.new_zeros(ctx.rows, like.shape[1])
        if ctx.single:  # each feature's gradient where it lies, none stacked
            return _native.index_add_features(gw, inverse, list(grads), ctx.owner), None, None, None, None, None
        grad = torch.cat([g if g is not None else torch.zeros_like(like) for g in grads])
        if ctx.mode == "mean":
            grad = grad / lengths.clamp(min=1).unsqueeze(1).to(grad.dtype)
        per_value = grad.index_select(0, torch.repeat_interleave(lengths))
        return _native.index_add_rows(gw, inverse, per_value), None, None, None, None, None


class EmbeddingCollection(nn.Module):
    """Embeds the sparse part of a batch with dynamic tables and sparse optimizers.

    Args:
        tables: one TableConfig per table.
        features: one FeatureConfig per sparse feature; several may share a table.

    Example:
        >>> ec = EmbeddingCollection([TableConfig(name="t", dim=4)],
        ...                          [FeatureConfig(name="a", table="t"), FeatureConfig(name="b", table="t")])
        >>> sf = SparseFeatures(["a", "b"], torch.tensor([1, 2, 3, 1]), torch.tensor([2, 1, 1, 0]))
        >>> out = ec(sf)
        >>> out["a"].shape, out["b"][1].abs().sum().item()
        (torch.Size([2, 4]), 0.0)
    """

    def __init__(self, tables: Sequence[TableConfig], features: Sequence[FeatureConfig]) -> None:
        super().__init__()
        self.table_configs = {t.name: t for t in tables}
        if len(self.table_configs) != len(tables):
            raise ValueError("EmbeddingCollection: table names must be unique")
        self.features = list(features)
        for f in self.features:
            if f.table_name not in self.table_configs:
                raise ValueError(
                    f"feature '{f.name}' uses table '{f.table_name}', which is not defined; "
                    f"tables are {sorted(self.table_configs)}"
                )
        self.tables: dict[str, EmbeddingTable] = {
            name: EmbeddingTable(cfg) for name, cfg in self.table_configs.items()
        }
        self._by_table: dict[str, list[FeatureConfig]] = {}
        for f in self.features:
            self._by_table.setdefault(f.table_name, []).append(f)
        # batchable tables by (dim, stored width, pooling); the rest take the per-table path
        self._groups: list[list[str]] = []
        keyed: dict[tuple, list[str]] = {}
        for name, feats in self._by_table.items():
            modes = {f.pooling for f in feats}
            mode = next(iter(modes))
            if len(modes) == 1 and mode in ("sum", "mean"):
                cfg = self.table_configs[name]
                keyed.setdefault((cfg.dim, cfg.stored_dim, mode), []).append(name)
            else:
                self._groups.append([name])
        self._groups.extend(keyed.values())
        self.batched = True  # False: every table on its own (the reference path of the tests)
        self._pending: list[TableLookup] = []
        self.device = torch.device("cpu")
        # prefetch: the batch being prepared on the worker thread, and the rows applied since
        self._ahead: tuple[SparseFeatures, Future] | None = None
        self._written: list[TableLookup] = []
        self._worker: ThreadPoolExecutor | None = None

    def feature_dims(self) -> list[int]:
        return [self.table_configs[f.table_name].dim for f in self.features]

    def to(self, *args, **kwargs):  # type: ignore[override]  # tables stay in host memory
        device, *_ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None:
            self.device = torch.device(device)
        return self

    # ---- stage 1 (CPU, can run ahead on another thread): dedupe + fetch rows -------------
    def prepare(self, sparse: SparseFeatures) -> list[TableLookup]:
        """Deduplicate each table's IDs and fetch (or create) their rows.

        If ``prefetch(sparse)`` started this batch on the worker thread, its result is taken
        and the rows that updates applied since then changed are copied in, so the records
        are exactly what a synchronous ``prepare`` would read now.
        """
        train = self.training and torch.is_grad_enabled()  # eval reads must not count toward admission
        if self._ahead is not None and self._ahead[0] is sparse and train:
            lookups = self._ahead[1].result()
            self._ahead = None
            self._patch(lookups)
            return lookups
        self.drain()
        return self._prepare(sparse, train)

    def prefetch(self, sparse: SparseFeatures) -> bool:
        """Start preparing the *next* training batch on a worker thread; returns whether it did.

        Call it after ``prepare`` of the current batch: deduplication, index probes, row reads
        and tier moves of the next batch then overlap this batch's forward, backward and
        update (on a 2-core CPU the dense math leaves gaps the worker fills). Results stay
        exact: ``prepare(sparse)`` later patches the rows this batch's update changed. Tables
        with ``min_count`` or a TTL (order-dependent state) are not prefetched: returns False.
        """
        if not (self.training and torch.is_grad_enabled()):
            return False
        if not all(t.prefetchable for t in self.tables.values()):
            return False
        self.drain()
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ember-prefetch")
        self._written = []
        self._ahead = (sparse, self._worker.submit(self._prepare, sparse, True))
        return True

    def drain(self) -> None:
        """Wait for and drop a pending prefetch (before reading tables directly, e.g. a checkpoint).

        A dropped prefetch changes no row (lookups never store rows), only cache statistics.
        """
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            ahead[1].result()  # re-raise the worker's error here
        self._written = []

    def _patch(self, lookups: list[TableLookup]) -> None:
        """Copy into ``lookups`` the rows that updates applied after they were read changed."""
        written, self._written = self._written, []
        by_table: dict[str, list[TableLookup]] = {}
        for w in written:
            by_table.setdefault(w.table, []).append(w)
        pairs = [(lk, w) for lk in lookups for w in by_table.get(lk.table, ())]  # in apply order
        if not pairs:
            return
        # one deduplication per (written rows, prefetched rows) pair finds the shared IDs: the
        # written IDs come first, so a prefetched ID's inverse below len(written) is its match
        parts, bounds = [], [0]
        for lk, w in pairs:
            parts += [w.ids.numpy(), lk.ids.numpy()]
            bounds.append(bounds[-1] + w.ids.numel() + lk.ids.numel())
        _, inverse, counts = _native.unique_segments(np.concatenate(parts), np.asarray(bounds))
        first = np.concatenate([[0], np.cumsum(counts)[:-1]])
        for j, (lk, w) in enumerate(pairs):
            nw = w.ids.numel()
            pos = inverse[bounds[j] + nw : bounds[j + 1]] - first[j]
            rows = np.flatnonzero(pos < nw)
            if rows.size:
                width = lk.records.shape[1]
                src = w.records.index_select(0, torch.from_numpy(pos[rows]))[:, :width]
                lk.records.index_copy_(0, torch.from_numpy(rows), src)

    def _prepare(self, sparse: SparseFeatures, train: bool) -> list[TableLookup]:
        out: list[TableLookup] = []
        batch_ok = self.batched and sparse.weights is None
        for names in self._groups:
            if len(names) == 1 or not batch_ok:
                for name in names:
                    out.append(self._prepare_one(sparse, name, train))
                continue
            out.extend(self._prepare_group(sparse, names, train))
        return out

    def _prepare_one(self, sparse: SparseFeatures, name: str, train: bool) -> TableLookup:
        values = [sparse[f.name].values for f in self._by_table[name]]
        ids = values[0] if len(values) == 1 else torch.cat(values)
        uniq, inverse, _ = _native.unique_segments(ids.cpu().numpy(), torch.tensor([0, ids.numel()]).numpy())
        u = torch.from_numpy(uniq)
        return TableLookup(name, u, self.tables[name].lookup(u, train=train), torch.from_numpy(inverse))

    def _prepare_group(self, sparse: SparseFeatures, names: list[str], train: bool) -> list[TableLookup]:
        ranges = sparse.key_ranges()
        feats = [f for name in names for f in self._by_table[name]]
        keys = [f.name for f in feats]
        if tuple(keys) == tuple(sparse.keys):
            values = sparse.values
        else:
            values = torch.cat([sparse.values[ranges[k][0] : ranges[k][1]] for k in keys])
        bounds, pos = [0], 0
        for name in names:
            pos += sum(ranges[f.name][1] - ranges[f.name][0] for f in self._by_table[name])
            bounds.append(pos)
        uniq, inverse, counts = _native.unique_segments(values.cpu().numpy(), torch.tensor(bounds).numpy())
        uniq_t, inverse_t = torch.from_numpy(uniq), torch.from_numpy(inverse)
        # every table reads its rows straight into its row range of the group's buffer
        buffer = torch.empty(int(uniq.size), self.table_configs[names[0]].stored_dim)
        lookups, start = [], 0
        for j, name in enumerate(names):
            n = int(counts[j])
            u, rows = uniq_t[start : start + n], buffer[start : start + n]
            lookups.append(TableLookup(name, u, rows, None))
            start += n
        EmbeddingTable.lookup_many([self.tables[n] for n in names], [lk.ids for lk in lookups], buffer, train=train)
        group = _Group(lookups, buffer, inverse_t, self._by_table[names[0]][0].pooling)
        for lk in lookups:
            lk.group = group
        return lookups

    # ---- stage 2 (model device): pool ---------------------------------------------------
    def forward(
        self, sparse: SparseFeatures, lookups: list[TableLookup] | None = None
    ) -> dict[str, Tensor | SequenceEmbedding]:
        if lookups is None:
            lookups = self.prepare(sparse)
        track = torch.is_grad_enabled() and self.training
        result: dict[str, Tensor | SequenceEmbedding] = {}
        seen: set[int] = set()
        for lk in lookups:
            if lk.group is not None:
                if id(lk.group) not in seen:
                    seen.add(id(lk.group))
                    result.update(self._forward_group(sparse, lk.group, track))
                continue
            dim = self.tables[lk.table].dim
            w = lk.records[:, :dim].to(self.device, non_blocking=True, memory_format=torch.contiguous_format)  # gathers from contiguous rows are ~1.5x faster
            if track:
                w = w.detach().requires_grad_()
                lk.weights = w
                self._pending.append(lk)
            assert lk.inverse is not None  # only group members leave it to their group
            inverse = lk.inverse.to(self.device, non_blocking=True)
            start = 0
            for f in self._by_table[lk.table]:
                jf = sparse[f.name]
                n = jf.values.numel()
                idx = inverse[start : start + n]
                start += n
                offsets = jf.offsets.to(self.device, non_blocking=True)
                weights = None if jf.weights is None else jf.weights.to(self.device, non_blocking=True)
                result[f.name] = _pool(w, idx, offsets, weights, f)
        return {f.name: result[f.name] for f in self.features}

    def _forward_group(self, sparse: SparseFeatures, group: _Group, track: bool) -> dict[str, Tensor]:
        dim = self.tables[group.lookups[0].table].dim
        w = group.records[:, :dim].to(self.device, non_blocking=True, memory_format=torch.contiguous_format)  # gathers from contiguous rows are ~1.5x faster
        if track:
            w = w.detach().requires_grad_()
            group.weights = w
            self._pending.extend(group.lookups)
        feats, owner = [], []
        for j, lk in enumerate(group.lookups):
            for f in self._by_table[lk.table]:
                feats.append(f)
                owner.append(j)
        b = sparse.batch_size
        key_pos = {k: i for i, k in enumerate(sparse.keys)}
        lengths = sparse.lengths.view(len(sparse.keys), b)
        rows = [key_pos[f.name] for f in feats]
        if rows != list(range(len(sparse.keys))):
            lengths = lengths[torch.tensor(rows)]
        inverse = group.inverse.to(self.device, non_blocking=True)
        offsets = None  # single-hot (one value per bag: as many values as bags, none empty): a gather
        if inverse.numel() != len(feats) * b or (b and int(lengths.min()) < 1):
            offsets = torch.zeros(len(feats) * b, dtype=torch.int64)
            torch.cumsum(lengths.reshape(-1)[:-1], 0, out=offsets[1:])
            offsets = offsets.to(self.device, non_blocking=True)
        outs = _GroupPool.apply(w, inverse, offsets, group.mode, group, owner)
        return {f.name: o for f, o in zip(feats, outs)}

    def concat(self, embedded: dict[str, Tensor | SequenceEmbedding]) -> Tensor:
        """Pooled features side by side: [B, sum D] in feature order."""
        return torch.cat([embedded[f.name] for f in self.features if f.pooling != "sequence"], dim=1)  # type: ignore[misc]

    # ---- stage 3 (after backward): sparse optimizer -------------------------------------
    def apply_gradients(self) -> None:
        """Apply each table's optimizer to the rows of the last training forward."""
        done: set[int] = set()
        if self._ahead is not None:  # the prefetched batch must see these updates
            self._written.extend(lk for lk in self._pending if _was_updated(lk))
        for lk in self._pending:
            if lk.group is not None:
                if id(lk.group) not in done:
                    done.add(id(lk.group))
                    self._apply_group(lk.group)
                continue
            w = lk.weights
            assert w is not None
            if w.grad is None:  # the table's features did not reach the loss
                continue
            self.tables[lk.table].apply(lk.ids, lk.records, w.grad.to("cpu"))
        self._pending.clear()

    def _apply_group(self, group: _Group) -> None:
        w = group.weights
        assert w is not None
        if w.grad is None:  # none of the group's features reached the loss
            return
        grad = w.grad.to("cpu")
        reached = group.reached or [True] * len(group.lookups)
        tables = [self.tables[lk.table] for lk in group.lookups]
        if all(reached) and all(tables[0].fusable_with(t) for t in tables[1:]):
            EmbeddingTable.apply_many(tables, [lk.ids for lk in group.lookups], group.records, grad)
            return
        start = 0
        for lk, table, hit in zip(group.lookups, tables, reached):
            n = lk.ids.numel()
            if hit:
                table.apply(lk.ids, lk.records, grad[start : start + n])
            start += n

    def close(self) -> None:
        """Finish a pending prefetch and stop the worker thread."""
        self.drain()
        if self._worker is not None:
            self._worker.shutdown()
            self._worker = None

    def discard_gradients(self) -> None:
        """Forget pending lookups (e.g. after a skipped step)."""
        self._pending.clear()


def _was_updated(lk: TableLookup) -> bool:
    """Whether ``apply_gradients`` will update this lookup's rows (its features reached the loss)."""
    if lk.group is None:
        return lk.weights is not None and lk.weights.grad is not None
    g = lk.group
    if g.weights is None or g.weights.grad is None:
        return False
    return g.reached is None or g.reached[g.lookups.index(lk)]


def _pool(w: Tensor, idx: Tensor, offsets: Tensor, weights: Tensor | None, f: FeatureConfig) -> Tensor | SequenceEmbedding:
    if f.pooling == "sequence":
        return _sequence(w, idx, offsets, f.max_length)
    if weights is None and f.pooling in ("sum", "mean"):
        return F.embedding_bag(idx, w, offsets[:-1], mode=f.pooling, include_last_offset=False)
    bag = F.embedding_bag(idx, w, offsets[:-1], mode="sum", per_sample_weights=weights)
    if f.pooling == "sum":  # weighted sum
        return bag
    counts = offsets[1:] - offsets[:-1]
    if weights is None:
        norm = counts.to(w.dtype).sqrt()  # sqrtn
    else:  # per-bag sum of w (mean) or of w^2 (sqrtn)
        seg = torch.repeat_interleave(torch.arange(counts.numel(), device=w.device), counts)
        acc = torch.zeros(counts.numel(), dtype=w.dtype, device=w.device)
        acc.index_add_(0, seg, weights if f.pooling == "mean" else weights * weights)
        norm = acc if f.pooling == "mean" else acc.sqrt()
    return bag / norm.clamp(min=1e-12).unsqueeze(1) * (norm > 0).unsqueeze(1)


def _sequence(w: Tensor, idx: Tensor, offsets: Tensor, max_length: int | None) -> SequenceEmbedding:
    lengths = offsets[1:] - offsets[:-1]
    b = lengths.numel()
    length = max_length if max_length is not None else int(lengths.max()) if b else 0
    pos = torch.arange(length, device=w.device)
    mask = pos.unsqueeze(0) < lengths.unsqueeze(1)  # [B, L]
    src = (offsets[:-1].unsqueeze(1) + pos.unsqueeze(0)).clamp(max=max(idx.numel() - 1, 0))
    gathered = F.embedding(idx[src] if idx.numel() else torch.zeros_like(src), w) if w.shape[0] else w.new_zeros(b, length, w.shape[1])
    return SequenceEmbedding(gathered * mask.unsqueeze(-1).to(w.dtype), mask)
