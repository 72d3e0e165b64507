"""Where a run's parts live, and so how one step's IDs, rows and outputs travel: the one place a
step differs between placements. ``Components`` hands its plan, forward, loss and backward to
its ``Placement`` and never asks which one it has.

- ``Placement`` (local; also tables sharded over ranks, ``distributed.placement: tables``): every
  collection plans and pools the batch's features itself (a sharded collection routes the IDs
  to their owners and the rows back), and the model runs on the pooled vectors.
- ``Towers`` (``distributed.placement: towers``, around ``ember.distributed.towers``'
  ``TowerPlacement``): the batch's features routed to the ranks of the node that holds their
  tower, each tower run there, and only the towers' outputs sent to every rank for the head
  under DDP; after backward, each tower's gradients are summed over its node.
- ``EmbeddingOnly`` (an embedding rank of ``distributed.placement: embedding_ranks``): the
  collections answer the dense ranks' fetches and take their gradients; no model runs, its
  loss is 0 and it takes no dense step (``ember.distributed.embedding_ranks``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ember.batch import Batch
from ember.embedding.collection import Lookup
from ember.embedding.group import GroupLookup
from ember.models.distill import Distilled, distill_loss
from ember.train.loss import multitask_bce
from ember.train.precision import PrecisionSetting, autocast

if TYPE_CHECKING:
    from ember.distributed.towers import TowerPlacement
    from ember.train.builder import Components

__all__ = ["Placement", "Towers", "EmbeddingOnly"]


def compute_precision(parts: "Components") -> PrecisionSetting:
    """The dense model's compute type for this forward: ``train.precision`` while training;
    fp32 when scoring (eval, predict), since an exported model serves in fp32 and the scores a
    run reports must be the scores it serves."""
    return parts.precision if parts.model.training and torch.is_grad_enabled() else "fp32"


class Placement:
    """Every table of the run reachable through its collections (module docstring)."""

    runs_model = True  # False: this rank runs no dense model (an embedding rank)

    def plan(self, parts: "Components", batch: Batch, train: bool) -> list[Lookup]:
        """Phase 1 of every collection for ``batch`` (``EmbeddingCollection.plan``)."""
        return [ec.plan(batch.sparse, train) for ec in parts.collections()]

    def forward(self, parts: "Components", batch: Batch, lookups: list[Lookup] | None) -> Tensor:
        """Logits [B, T] (float32): the collections pool (``lookups``: planned and maybe
        fetched ahead, one per collection; None: each plans and fetches its own), the model runs."""
        lk = lookups or [None] * len(parts.collections())
        emb = parts.embeddings(batch.sparse, lk[0])
        pooled = [emb[f.name] for f in parts.embeddings.features]
        linear = None
        if parts.linear is not None:
            lin = parts.linear(batch.sparse, lk[1])
            linear = [lin[f.name] for f in parts.linear.features]
        with autocast(parts.device, compute_precision(parts)):
            logits = parts.run_model(batch.dense, pooled, linear)
        return logits.float()

    def loss(self, parts: "Components", batch: Batch, logits: Tensor, task_weights: Tensor | None,
             rows: int | None) -> Tensor:
        """BCE on the labels, plus the teacher's part under ``model.distill``."""
        if parts.distill is None:
            return multitask_bce(logits, batch.labels, task_weights, rows)
        assert isinstance(parts.model, Distilled)
        return distill_loss(parts.model, logits, batch.labels, batch.teacher, batch.dense, parts.distill, task_weights,
                            rows)

    def backward(self, parts: "Components", loss: Tensor, step: int) -> list[GroupLookup]:
        """Backward (loss-scaled under fp16), then the dense step of global step ``step``; the
        lookups due for their update, or none when an fp16 step overflowed (skipped whole)."""
        parts.dense_optimizer.zero_grad(set_to_none=True)
        parts.sparse_optimizer.zero_grad()
        (loss if parts.scaler is None else parts.scaler.scaled(loss)).backward()
        self.after_backward(parts)
        ready = parts.sparse_optimizer.take()
        if parts.scaler is not None:
            grads = [p.grad for p in parts.model.parameters()] + [lk.grad for lk in ready]
            if not parts.scaler.unscale_(grads):
                return []
        parts.set_dense_lr(step)
        parts.dense_optimizer.step()
        return ready

    def after_backward(self, parts: "Components") -> None:
        """Gradients this placement sums itself, before the dense step (DDP sums the rest)."""


class Towers(Placement):
    """``distributed.placement: towers`` over ``towers`` (module docstring)."""

    def __init__(self, towers: "TowerPlacement") -> None:
        self.towers = towers

    def plan(self, parts: "Components", batch: Batch, train: bool) -> list[Lookup]:
        """The features routed to this rank's towers, planned."""
        return [self.towers.plan(parts.embeddings, batch.sparse, train)]

    def forward(self, parts: "Components", batch: Batch, lookups: list[Lookup] | None) -> Tensor:
        train = parts.model.training and torch.is_grad_enabled()
        routed = lookups[0] if lookups else self.towers.plan(parts.embeddings, batch.sparse, train)
        with autocast(parts.device, compute_precision(parts)):
            logits = self.towers.forward(parts.embeddings, batch.dense, routed, train)
        if isinstance(parts.model, Distilled) and parts.model.aux_head and not parts.model.training:
            logits = logits[:, : parts.model.num_tasks]  # distillation's serving head, as Distilled.forward
        return logits.float()

    def after_backward(self, parts: "Components") -> None:
        self.towers.reduce_tower_grads()  # summed over the tower's node only
        adapter = getattr(parts.model, "adapter", None)  # distillation's: beside the towers and the DDP head
        if adapter is not None:
            self.towers.sum_grads(list(adapter.parameters()))


class EmbeddingOnly(Placement):
    """An embedding rank (module docstring): its slice of each batch has no rows."""

    runs_model = False

    def forward(self, parts: "Components", batch: Batch, lookups: list[Lookup] | None) -> Tensor:
        """The fetch collectives (in training this opens the lookups for their updates); the
        logits are [0, T]."""
        for ec, lk in zip(parts.collections(), lookups or [None] * len(parts.collections())):
            ec(batch.sparse, lk)
        return torch.zeros(batch.size, len(parts.task_names), device=parts.device)

    def loss(self, parts: "Components", batch: Batch, logits: Tensor, task_weights: Tensor | None,
             rows: int | None) -> Tensor:
        return torch.zeros((), device=parts.device)

    def backward(self, parts: "Components", loss: Tensor, step: int) -> list[GroupLookup]:
        """No backward and no dense step: the lookups (every rank's IDs this rank owns) await
        the dense ranks' gradients in their update."""
        parts.sparse_optimizer.zero_grad()
        ready = parts.sparse_optimizer.take()
        if parts.scaler is not None and not parts.scaler.unscale_([]):  # the ranks agree on the overflow
            return []
        return ready
