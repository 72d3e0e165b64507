"""EmbeddingCollection: SparseFeatures -> pooled per-feature tensors; the autograd boundary.

Per table, the IDs of every feature using it are deduplicated once; their rows are gathered
once into a small leaf tensor ``W`` [U, D] that requires grad; each feature pools from ``W``
with ``embedding_bag`` over the inverse indices. Backward therefore yields ``W.grad``: the
gradient of each unique ID, already summed over its occurrences — never a dense table gradient.
``apply_gradients()`` hands those to each table's sparse optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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
    records: Tensor  # float32 [U, R], CPU
    inverse: Tensor  # int64 [N] into ids, over the concatenated values of the table's features
    weights: Tensor | None = None  # leaf [U, D] on the model device, set by forward


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
        self._pending: list[TableLookup] = []
        self.device = torch.device("cpu")

    def feature_dims(self) -> list[int]:
        return [self.table_configs[f.table_name].dim for f in self.features]

    def to(self, *args, **kwargs):  # type: ignore[override]  # tables stay in host memory
        device, *_ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None:
            self.device = torch.device(device)
        return self

    # ---- stage 1 (CPU, can run ahead on another thread): dedupe + fetch rows -------------
    def prepare(self, sparse: SparseFeatures) -> list[TableLookup]:
        """Deduplicate each table's IDs and fetch (or create) their rows."""
        out = []
        train = self.training and torch.is_grad_enabled()  # eval reads must not count toward admission
        for name, feats in self._by_table.items():
            values = [sparse[f.name].values for f in feats]
            ids = values[0] if len(values) == 1 else torch.cat(values)
            uniq, inverse = torch.unique(ids, return_inverse=True)
            out.append(TableLookup(name, uniq, self.tables[name].lookup(uniq, train=train), inverse))
        return out

    # ---- stage 2 (model device): pool ---------------------------------------------------
    def forward(
        self, sparse: SparseFeatures, lookups: list[TableLookup] | None = None
    ) -> dict[str, Tensor | SequenceEmbedding]:
        if lookups is None:
            lookups = self.prepare(sparse)
        track = torch.is_grad_enabled() and self.training
        result: dict[str, Tensor | SequenceEmbedding] = {}
        for lk in lookups:
            dim = self.tables[lk.table].dim
            w = lk.records[:, :dim].to(self.device, non_blocking=True)
            if track:
                w = w.detach().requires_grad_()
                lk.weights = w
                self._pending.append(lk)
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

    def concat(self, embedded: dict[str, Tensor | SequenceEmbedding]) -> Tensor:
        """Pooled features side by side: [B, sum D] in feature order."""
        return torch.cat([embedded[f.name] for f in self.features if f.pooling != "sequence"], dim=1)  # type: ignore[misc]

    # ---- stage 3 (after backward): sparse optimizer -------------------------------------
    def apply_gradients(self) -> None:
        """Apply each table's optimizer to the rows of the last training forward."""
        for lk in self._pending:
            w = lk.weights
            assert w is not None
            if w.grad is None:  # the table's features did not reach the loss
                continue
            self.tables[lk.table].apply(lk.ids, lk.records, w.grad.to("cpu"))
        self._pending.clear()

    def discard_gradients(self) -> None:
        """Forget pending lookups (e.g. after a skipped step)."""
        self._pending.clear()


def _pool(w: Tensor, idx: Tensor, offsets: Tensor, weights: Tensor | None, f: FeatureConfig) -> Tensor | SequenceEmbedding:
    if f.pooling == "sequence":
        return _sequence(w, idx, offsets, f.max_length)
    if weights is None and f.pooling in ("sum", "mean"):
        return F.embedding_bag(idx, w, offsets[:-1], mode=f.pooling, include_last_offset=False)
    bag = F.embedding_bag(idx, w, offsets[:-1], mode="sum", per_sample_weights=weights)
    lengths = (offsets[1:] - offsets[:-1]).to(w.dtype)
    if weights is None:
        norm = lengths.sqrt()  # sqrtn
    else:
        seg = torch.repeat_interleave(torch.arange(lengths.numel(), device=w.device), offsets[1:] - offsets[:-1])
        acc = torch.zeros_like(lengths)
        if f.pooling == "sum":
            return bag
        vals = weights if f.pooling == "mean" else weights * weights
        acc.index_add_(0, seg, vals)
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
