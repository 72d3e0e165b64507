"""EmbeddingCollection: SparseFeatures -> pooled per-feature tensors; the autograd boundary.

Every collection is a set of table groups (``ember.embedding.group``): tables of one dim,
record width and fast-tier device are read, pooled, updated and written back together, a lone
table being a group of one. A batch's ``Lookup`` moves through the phases plan -> fetch ->
pool -> (backward) -> update -> write back; ``forward`` runs the first three, and
``SparseOptimizer.step`` the last two for every lookup whose backward has run. Backward yields
one gradient per unique ID, already summed over its occurrences — never a dense table gradient.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from ember.batch.sparse import SparseFeatures
from ember.embedding.config import FeatureConfig, TableConfig
from ember.embedding.group import GroupLookup, TableGroup
from ember.embedding.pooling import SequenceEmbedding
from ember.embedding.table import EmbeddingTable
from ember.tiers.mapped_rows import MappedTier

__all__ = ["EmbeddingCollection", "Lookup"]

log = logging.getLogger("ember.embedding")


class Lookup:
    """One batch's lookup in every table group of a collection; each phase runs on all groups.

    Built by ``EmbeddingCollection.plan`` (phase 1); then ``fetch()``, ``pool(device)``,
    backward, ``update()``, ``write_back()``. The phases may be called one by one from outside
    (a pipeline or a sharded run puts its own work between them).
    """

    def __init__(self, groups: list[GroupLookup], features: list[FeatureConfig],
                 shape: tuple[tuple[str, ...], int] | None = None) -> None:
        self.groups = groups
        self.features = features
        self.fetched = False
        self.shape = shape  # (keys, batch size) of the batch planned: forward checks it is given that batch

    @property
    def train(self) -> bool:
        return any(g.train for g in self.groups)

    @property
    def preparable(self) -> bool:
        """Whether some group's fetch has a host half ``prepare`` can run ahead (a device cache)."""
        return any(g.preparable for g in self.groups)

    def prepare(self) -> "Lookup":
        """The host half of phase 2 of every group with a device cache, ahead of ``fetch``
        (see ``GroupLookup.prepare``)."""
        for g in self.groups:
            g.prepare()
        return self

    def fetch(self) -> "Lookup":
        """Phase 2 of every group (see ``GroupLookup.fetch``)."""
        for g in self.groups:
            g.fetch()
        self.fetched = True
        return self

    def to_device(self, device: torch.device) -> None:
        """Optional, between fetch and pool: every group copies its rows to ``device`` ahead."""
        for g in self.groups:
            g.to_device(device)

    def pool(self, device: torch.device, on_grad: Callable[[GroupLookup], None] | None = None) -> dict[str, Tensor | SequenceEmbedding]:
        """Phase 3 of every group: {feature: pooled tensor}, in the collection's feature order."""
        out: dict[str, Tensor | SequenceEmbedding] = {}
        for g in self.groups:
            out.update(g.pool(device, on_grad))
        return {f.name: out[f.name] for f in self.features}

    def update(self, step: int | None = None) -> None:
        """Phase 4 of every group whose features got a gradient (``step``: the global step an lr
        schedule reads, as ``GroupLookup.update``)."""
        for g in self.groups:
            if g.grad is not None:
                g.update(step)

    def write_back(self) -> None:
        """Phase 5 of every group that was updated."""
        for g in self.groups:
            if g.updated:
                g.write_back()
            else:
                g.discard()

    def discard(self) -> None:
        """A lookup fetched (or prepared) that will not train: every group gives its rows back."""
        for g in self.groups:
            g.discard()


class EmbeddingCollection(nn.Module):
    """Embeds the sparse part of a batch with dynamic tables; ``SparseOptimizer`` trains them.

    Args:
        tables: one TableConfig per table.
        features: one FeatureConfig per sparse feature; several may share a table.
        seed: the run's seed; a table without its own ``seed`` derives one from it and its name.

    Examples:
        >>> ec = EmbeddingCollection([TableConfig(name="t", dim=4)],
        ...                          [FeatureConfig(name="a", table="t"), FeatureConfig(name="b", table="t")])
        >>> sf = SparseFeatures(["a", "b"], torch.tensor([1, 2, 3, 1]), torch.tensor([2, 1, 1, 0]))
        >>> out = ec(sf)
        >>> out["a"].shape, out["b"][1].abs().sum().item()
        (torch.Size([2, 4]), 0.0)
    """

    def __init__(self, tables: Sequence[TableConfig], features: Sequence[FeatureConfig], seed: int = 0) -> None:
        super().__init__()
        tables = [TableConfig.parse(t, where="table") if isinstance(t, Mapping) else t for t in tables]
        features = [FeatureConfig.parse(f, where="feature") if isinstance(f, Mapping) else f for f in features]
        for what, items, cls in (("tables", tables, TableConfig), ("features", features, FeatureConfig)):
            wrong = [type(x).__name__ for x in items if not isinstance(x, cls)]
            if wrong:
                raise TypeError(f"EmbeddingCollection: {what} must be {cls.__name__}s (or dicts of their keys), got {wrong}")
        self.table_configs = {t.name: t for t in tables}
        if len(self.table_configs) != len(tables):
            raise ValueError("EmbeddingCollection: table names must be unique")
        self.features = list(features)
        names = [f.name for f in self.features]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"EmbeddingCollection: feature names must be unique; {twice} given more than once "
                             "(two features may share a table under different names)")
        for f in self.features:
            if f.table_name not in self.table_configs:
                raise ValueError(
                    f"feature '{f.name}' uses table '{f.table_name}', which is not defined; "
                    f"tables are {sorted(self.table_configs)}"
                )
        self.seed = seed
        self.tables: dict[str, EmbeddingTable] = {name: EmbeddingTable(cfg, seed) for name, cfg in self.table_configs.items()}
        by_table: dict[str, list[FeatureConfig]] = {}
        for f in self.features:
            by_table.setdefault(f.table_name, []).append(f)
        keyed: dict[tuple, list[EmbeddingTable]] = {}
        for name in by_table:  # tables no feature uses are stored and checkpointed, never looked up
            t = self.tables[name]
            index = "device" if isinstance(t.tier, MappedTier) else "host"  # (auto outside a run: host)
            keyed.setdefault((t.dim, t.config.stored_dim, str(t.tier.device), t.config.dtype, index), []).append(t)
        self.groups = [TableGroup(ts, by_table) for ts in keyed.values()]
        if len(self.groups) > 1:
            log.info("%s", _describe_split(list(keyed)))
        self.device = torch.device("cpu")
        # lookups of training forwards awaiting backward, and those whose gradients await
        # SparseOptimizer.step (the embedding analogue of parameters' .grad)
        self._open: list[GroupLookup] = []
        self._ready: list[GroupLookup] = []

    _NO_ROWS = ("EmbeddingCollection: its tables' rows are not part of state_dict() (they live in tiers that may "
                "outgrow memory): save and restore them with ember.checkpoint.save.save_checkpoint and "
                "ember.checkpoint.load.load_tables, as ember train does")

    def get_extra_state(self) -> dict[str, Any]:
        """What ``state_dict`` holds for the collection: a note that its rows are elsewhere (said
        once, as a warning), so neither saving nor loading one passes for the tables' state."""
        warnings.warn(self._NO_ROWS, stacklevel=3)
        return {"ember_tables": sorted(self.tables), "rows": "not included"}

    def set_extra_state(self, state: Any) -> None:
        """Loading a state_dict restores no row: warned, so fresh rows never pass for trained ones."""
        warnings.warn(self._NO_ROWS + "; the rows here are unchanged by load_state_dict", stacklevel=3)

    def feature_dims(self) -> list[int]:
        return [self.table_configs[f.table_name].dim for f in self.features]

    def to(self, *args, **kwargs):  # type: ignore[override]  # rows stay in their tiers
        device, *_ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None:
            self.device = torch.device(device)
        return self

    # ---- the phases ------------------------------------------------------------------------
    def plan(self, sparse: SparseFeatures, train: bool | None = None) -> Lookup:
        """Phase 1 for every group: dedupe the batch's IDs per table. A training lookup counts
        ``min_count`` sightings and refreshes TTL steps; ``train`` defaults to the module in
        training mode with grad enabled (a pipeline thread planning ahead says it explicitly:
        grad mode is per thread)."""
        if train is None:
            train = self.training and torch.is_grad_enabled()
        return Lookup([g.plan(sparse, train) for g in self.groups], self.features, (tuple(sparse.keys), sparse.batch_size))

    def forward(self, sparse: SparseFeatures, lookup: Lookup | None = None) -> dict[str, Tensor | SequenceEmbedding]:
        """Pooled embeddings {feature: [B, D] (or a SequenceEmbedding)}: plan, fetch (unless
        ``lookup`` was planned and fetched already) and pool. A training forward hands its
        gradients to ``SparseOptimizer.step`` after backward."""
        lk = lookup if lookup is not None else self.plan(sparse)
        if lk.shape is not None and lk.shape != (tuple(sparse.keys), sparse.batch_size):
            raise ValueError(f"EmbeddingCollection: the lookup was planned for a batch of {lk.shape[1]} with keys "
                             f"{list(lk.shape[0])}, not for this one ({sparse.batch_size}, {list(sparse.keys)}); "
                             "plan each batch's own lookup (ec.plan(batch))")
        if not lk.fetched:
            lk.fetch()
        if not lk.train:
            return lk.pool(self.device)
        if self._ready:
            raise RuntimeError(
                "EmbeddingCollection: the embedding gradients of an earlier batch were never applied; "
                "call SparseOptimizer.step() after loss.backward() (or its zero_grad() to drop them)"
            )
        self._open = list(lk.groups)
        return lk.pool(self.device, self._on_grad)

    def _on_grad(self, lookup: GroupLookup) -> None:
        self._ready.append(lookup)

    def take_gradients(self) -> tuple[list[GroupLookup], int]:
        """The lookups whose backward ran since the last call (and how many training lookups
        were waiting for one); forgets both. Used by ``SparseOptimizer``."""
        ready, waiting = self._ready, len(self._open)
        self._ready, self._open = [], []
        return ready, waiting

    def zero_grad(self, set_to_none: bool = True) -> None:  # type: ignore[override]
        """Drop gradients computed but not yet applied (``SparseOptimizer.zero_grad``)."""
        self._ready = []

    def concat(self, embedded: dict[str, Tensor | SequenceEmbedding]) -> Tensor:
        """Pooled features side by side: [B, sum D] in feature order."""
        try:
            return torch.cat([embedded[f.name] for f in self.features if f.pooling != "sequence"], dim=1)  # type: ignore[misc]
        except KeyError as e:
            raise KeyError(f"EmbeddingCollection.concat: no feature {e} in what it was given ({sorted(embedded)}); "
                           "give it the collection's output, ec(batch.sparse)") from None

    def close(self) -> None:
        """Flush and release every table's tiers."""
        for t in self.tables.values():
            t.close()


def _describe_split(keys: list[tuple]) -> str:
    """One line naming each group and why tables were split (what differs from the first)."""
    parts, first = [], keys[0]
    fields = ("dim", "record width", "device", "dtype", "storage.index")
    for key in keys:
        diff = [name for name, a, b in zip(fields, key, first) if a != b]
        parts.append(f"dim {key[0]}, {key[1]} floats per record, {key[2]}, {key[3]}, index on the {key[4]}"
                     + (f" (differs in {', '.join(diff)})" if diff else ""))
    return f"EmbeddingCollection: {len(keys)} table groups, one pass each per batch: " + "; ".join(parts)
