"""Pooling: a feature's bag of rows -> one vector per sample (sum / mean / sqrt-n / weighted), or
a padded sequence; and the grouped pooling of many unweighted features in one autograd call.

``pool_feature`` is also what ``ember.serving`` uses, so served scores pool exactly as training did.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ember import _native

__all__ = ["SequenceEmbedding", "pool_feature", "GroupPool", "WEIGHT_EPS"]


class SequenceEmbedding(NamedTuple):
    """Unpooled embeddings of a sequence feature: values [B, L, D] (zero-padded), mask [B, L]."""

    values: Tensor
    mask: Tensor


WEIGHT_EPS = 1e-6
"""Floor of a weighted bag's norm (sum of |w|, or sqrt of sum of w^2): a bag whose weights are
all zero pools to zero, and one with tinier weights shrinks smoothly toward zero."""


def pool_feature(
    w: Tensor, idx: Tensor, offsets: Tensor, weights: Tensor | None, pooling: str, max_length: int | None = None
) -> Tensor | SequenceEmbedding:
    """Pool rows ``w`` [U, D] at ``idx`` [N] per bag (``offsets`` [B+1]), as ``pooling`` says.

    ``sum`` / ``mean`` / ``sqrtn``; with ``weights`` [N]: ``sum w*e``,
    ``sum w*e / max(sum |w|, eps)`` and ``sum w*e / max(sqrt(sum w^2), eps)``, eps =
    ``WEIGHT_EPS``. Dividing by the sum of *absolute* weights makes a weighted mean a signed
    convex combination: never larger than the bag's largest row whatever the weights' signs
    or size (a sum of weights near zero would blow it up), equal to the usual weighted mean
    for positive weights; a bag whose weights are all zero (or an empty bag) pools to zero.
    ``sequence``: [B, L, D] padded plus a mask.
    """
    if pooling == "sequence":
        return _sequence(w, idx, offsets, max_length)
    if weights is None and pooling in ("sum", "mean"):
        return F.embedding_bag(idx, w, offsets[:-1], mode=pooling, include_last_offset=False)
    bag = F.embedding_bag(idx, w, offsets[:-1], mode="sum", per_sample_weights=weights)
    if pooling == "sum":  # weighted sum
        return bag
    counts = offsets[1:] - offsets[:-1]
    if weights is None:  # sqrtn; an empty bag's sum is 0
        return bag / counts.to(w.dtype).sqrt().clamp(min=1.0).unsqueeze(1)
    # per-bag sum of |w| (mean) or of w^2 (sqrtn)
    seg = torch.repeat_interleave(torch.arange(counts.numel(), device=w.device), counts)
    acc = torch.zeros(counts.numel(), dtype=bag.dtype, device=w.device)
    if pooling == "mean":
        norm = acc.index_add(0, seg, weights.abs()).clamp(min=WEIGHT_EPS)
    else:  # clamped before the square root, whose gradient at 0 is infinite
        norm = acc.index_add(0, seg, weights * weights).clamp(min=WEIGHT_EPS * WEIGHT_EPS).sqrt()
    return bag / norm.unsqueeze(1)


def _sequence(w: Tensor, idx: Tensor, offsets: Tensor, max_length: int | None) -> SequenceEmbedding:
    lengths = offsets[1:] - offsets[:-1]
    b = lengths.numel()
    length = max_length if max_length is not None else int(lengths.max()) if b else 0
    pos = torch.arange(length, device=w.device)
    mask = pos.unsqueeze(0) < lengths.unsqueeze(1)  # [B, L]
    src = (offsets[:-1].unsqueeze(1) + pos.unsqueeze(0)).clamp(max=max(idx.numel() - 1, 0))
    gathered = F.embedding(idx[src] if idx.numel() else torch.zeros_like(src), w) if w.shape[0] else w.new_zeros(b, length, w.shape[1])
    return SequenceEmbedding(gathered * mask.unsqueeze(-1).to(w.dtype), mask)


class GroupPool(torch.autograd.Function):
    """Unweighted ``sum`` or ``mean`` pooling of n features from one group's rows ``w`` [U, D], as
    n outputs [B, D] (``offsets`` None: single-hot, bag i is value i); backward is one
    scatter-add into [U, D] and calls ``reached(k)`` for each feature k whose output got a
    gradient (a table none of whose features reached the loss must not be updated).

    CPU ``embedding_bag`` backward sorts all N indices first; for a group of many tables the
    scatter-add over the (already deduplicated) inverse indices is several times cheaper.
    When every bag holds one value the pooling is a plain row gather (~5x cheaper than
    ``embedding_bag`` on CPU), and backward adds each feature's gradient where it lies (often a
    row-strided slice of the model's stacked gradient) without stacking them.
    """

    @staticmethod
    def forward(ctx, w: Tensor, inverse: Tensor, bags: tuple[Tensor, Tensor, Tensor] | None, mode: str,  # type: ignore[override]
                owner: Sequence[int], reached: Callable[[int], None]):
        single = bags is None  # bag i is value i
        ctx.set_materialize_grads(False)
        if single:
            ctx.save_for_backward(inverse)
        else:  # (offsets, bag of each value, 1 / length), on w's device
            ctx.save_for_backward(inverse, bags[1], bags[2])
        ctx.mode, ctx.rows, ctx.single, ctx.owner, ctx.reached = mode, w.shape[0], single, owner, reached
        pooled = _native.take_rows(w, inverse) if single else F.embedding_bag(inverse, w, bags[0], mode=mode)
        return tuple(pooled.view(len(owner), -1, w.shape[1]).unbind(0))

    @staticmethod
    def backward(ctx, *grads: Tensor | None):  # type: ignore[override]
        inverse = ctx.saved_tensors[0]
        for k, g in enumerate(grads):
            if g is not None:
                ctx.reached(k)
        like = next(g for g in grads if g is not None)
        gw = like.new_zeros(ctx.rows, like.shape[1])
        none = (None,) * 5
        if ctx.single:  # each feature's gradient where it lies, none stacked
            return (_native.index_add_features(gw, inverse, list(grads), ctx.owner),) + none
        bag_of, scale = ctx.saved_tensors[1:]
        grad = torch.cat([g if g is not None else torch.zeros_like(like) for g in grads])
        if ctx.mode == "mean":
            grad = grad * scale.unsqueeze(1).to(grad.dtype)
        per_value = grad.index_select(0, bag_of)
        return (_native.index_add_rows(gw, inverse, per_value),) + none
