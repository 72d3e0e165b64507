"""The per-table reference implementation: the oracle the grouped engine is tested against.

Each table on its own, the plainest way: one dedupe (``unique_segments``) per table, one ``get_into`` per table,
fresh rows per table, one leaf per table, every feature pooled with ``pool_feature``, and one
optimizer call and one ``put`` per table. Slow and simple on purpose; tests only.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from ember import _native
from ember.batch.sparse import SparseFeatures
from ember.embedding.config import FeatureConfig, TableConfig
from ember.embedding.pooling import SequenceEmbedding, pool_feature
from ember.embedding.table import EmbeddingTable
from ember.optim import rule_lr

__all__ = ["ReferenceCollection"]


class ReferenceCollection:
    """Same tables, features and results as ``EmbeddingCollection`` + ``SparseOptimizer``.

    ``forward(sparse)`` pools (training when ``train``); after ``loss.backward()``, ``step()``
    updates and stores each table whose features reached the loss. ``leaves[name]`` is the
    last forward's (ids, leaf [U, D]) per table, for comparing gradients.
    """

    def __init__(self, tables: Sequence[TableConfig], features: Sequence[FeatureConfig], seed: int = 0) -> None:
        self.tables = {t.name: EmbeddingTable(t, seed) for t in tables}
        self.features = list(features)
        self.by_table: dict[str, list[FeatureConfig]] = {}
        for f in self.features:
            self.by_table.setdefault(f.table_name, []).append(f)
        self.leaves: dict[str, tuple[Tensor, Tensor, Tensor, Tensor | None]] = {}
        self.train = True
        self.steps = 0  # step() calls so far: the global step lr schedules read, as SparseOptimizer.steps

    def forward(self, sparse: SparseFeatures) -> dict[str, Tensor | SequenceEmbedding]:
        out: dict[str, Tensor | SequenceEmbedding] = {}
        self.leaves = {}
        for name, feats in self.by_table.items():
            table = self.tables[name]
            values = torch.cat([sparse[f.name].values for f in feats])
            uniq, inv, _ = _native.unique_segments(values.numpy(), np.array([0, values.numel()]))
            ids, inverse = torch.from_numpy(uniq), torch.from_numpy(inv)
            packed = torch.zeros(ids.numel(), table.codec.words)
            found = table.tier.get_into(ids, packed)
            records = table.codec.decode(packed).clone()
            filtered = self._complete(table, ids, records, found)
            w = records[:, : table.dim].clone().requires_grad_(self.train)
            self.leaves[name] = (ids, w, records, filtered)
            start = 0
            for f in feats:
                jf = sparse[f.name]
                n = jf.values.numel()
                out[f.name] = pool_feature(w, inverse[start : start + n], jf.offsets, jf.weights, f.pooling, f.max_length)
                start += n
        return {f.name: out[f.name] for f in self.features}

    def _complete(self, table: EmbeddingTable, ids: Tensor, records: Tensor, found: Tensor) -> Tensor | None:
        if table.ttl is not None and bool(found.any()):
            found = found & ~(table.step - records[:, -1] > table.ttl)
        filtered = None
        for i in np.flatnonzero(~found.numpy()).tolist():
            one = ids[i : i + 1]
            if table.admission is not None:
                count = (table.admission.add if self.train else table.admission.get)(one.numpy())[0]
                if count < table.min_count:
                    filtered = torch.zeros(ids.numel(), dtype=torch.bool) if filtered is None else filtered
                    filtered[i] = True
                    records[i] = 0.0
                    continue
            records[i] = table.stored(table.new_records(one))[0]
        if table.ttl is not None and self.train:
            records[:, -1] = float(table.step)
        return filtered

    def step(self) -> None:
        for name, (ids, w, records, filtered) in self.leaves.items():
            if w.grad is None:
                continue
            table = self.tables[name]
            table.step += 1
            keep = torch.ones(ids.numel(), dtype=torch.bool) if filtered is None else ~filtered
            rows = records[keep]
            d, r = table.dim, table.config.record_dim
            new_w, new_s = table.optimizer.update(rows[:, :d].clone(), rows[:, d:r].clone(), w.grad[keep], table.step,
                                                  rule_lr(table.optimizer, self.steps))
            rows[:, :d], rows[:, d:r] = new_w, new_s
            table.tier.put(ids[keep], table.codec.encode(rows, ids[keep], table.seed, table.step))
            if table.admission is not None and bool(keep.any()):
                table.admission.remove(ids[keep].numpy())
            if table.ttl is not None and table.step % table.ttl == 0:
                table.expire()
        self.leaves = {}
        self.steps += 1

