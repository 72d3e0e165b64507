"""Logistic regression: the baseline every CTR model should beat.

logit = sum of the per-feature first-order terms (the trainer's dim-1 linear tables, i.e. one
learned weight per ID) + w·dense + b. The D-wide sparse embeddings are ignored (give the
tables ``dim: 1`` in the config to keep them cheap).
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from ember.models.base import DenseInit, ModelConfigBase, ModelInputs, dense_linear, sum_linear

__all__ = ["LR", "LRConfig"]


class LRConfig(ModelConfigBase):
    """Logistic regression over one-hot IDs and the dense features.

    ``dense_init``: how the weights over the dense features and the bias start (default
    ``zeros``, like plain LR baselines; see :class:`~ember.models.base.DenseInit`). The
    per-ID weights always start at zero (the trainer's linear tables).

    Example:
        >>> LRConfig().dense_init.type
        'zeros'
    """

    type: Literal["lr"] = "lr"
    """`lr`: logistic regression, one weight per ID plus a linear layer on the dense features."""
    dense_init: DenseInit = DenseInit()
    """How the weights over the dense features start."""


class LR(nn.Module):
    """logit_t = sum_i linear_i + w_t·dense + b_t (the ID terms are shared by every task).

    Shapes:
        dense [B, Dd], sparse F_s × [B, D_i] (unused), linear F_s × [B, 1] -> logits [B, T]

    Example:
        >>> import torch
        >>> model = LR(LRConfig(), ModelInputs(13, [16] * 26, 1))
        >>> linear = [torch.randn(4, 1)] * 26
        >>> model(torch.randn(4, 13), [torch.randn(4, 16)] * 26, linear).shape
        torch.Size([4, 1])
    """

    wants_linear = True
    reads_embeddings = False  # its D-wide tables are never looked up in training: they stay empty (ember plan)
    __jit_ignored_attributes__ = ("config",)

    def __init__(self, config: LRConfig, inputs: ModelInputs) -> None:
        super().__init__()
        self.config = config
        self.num_sparse: int = inputs.num_sparse
        self.dense_linear = dense_linear(inputs.num_dense, inputs.num_tasks, config.dense_init)  # with Dd = 0: a bias

    def forward(
        self, dense: Tensor, sparse: list[Tensor], linear: list[Tensor] | None = None
    ) -> Tensor:
        return sum_linear(linear, self.num_sparse, dense) + self.dense_linear(dense)
