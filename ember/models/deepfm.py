"""DeepFM: first-order terms + FM second order over the embeddings + a deep MLP, summed."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from ember.errors import ConfigError
from ember.models.base import (
    ModelConfigBase,
    DenseInit,
    ModelInputs,
    concat_inputs,
    dense_linear,
    require_equal_dims,
    sum_linear,
)
from ember.models.layers.interaction import FMInteraction
from ember.models.layers.mlp import MLP, MLPConfig

__all__ = ["DeepFM", "DeepFMConfig"]


class DeepFMConfig(ModelConfigBase):
    """DeepFM (Guo et al. 2017).

    ``dense_field``: project the dense vector to one extra D-wide field so it takes part in
    the FM pairs (it always feeds the first-order term and the deep MLP). ``dense_init``: how
    the first-order weights over the dense features and the bias start (default ``zeros``, see
    ``DenseInit``).

    Example:
        >>> DeepFMConfig().deep_mlp.sizes
        [400, 400, 400]
    """

    type: Literal["deepfm"] = "deepfm"
    """`deepfm`: first-order terms, an FM interaction and a deep MLP."""
    deep_mlp: MLPConfig = Field(default_factory=lambda: MLPConfig(sizes=[400, 400, 400]))
    """MLP over the concatenated embeddings and dense features."""
    dense_init: DenseInit = DenseInit()
    """How the first-order weights over the dense features start."""
    dense_field: bool = True
    """The dense vector is one more FM field."""


class DeepFM(nn.Module):
    """logit = sum(linear) + w·dense + b + FM(fields) + MLP(concat(dense, sparse)).

    The first-order and FM terms are shared by every task; the MLP head has T outputs.

    Shapes:
        dense [B, Dd], sparse F_s × [B, D], linear F_s × [B, 1] -> logits [B, T]

    Example:
        >>> import torch
        >>> inputs = ModelInputs(num_dense=13, sparse_dims=[16] * 26, num_tasks=1)
        >>> model = DeepFM(DeepFMConfig(deep_mlp=[32]), inputs)
        >>> sparse, linear = [torch.randn(4, 16)] * 26, [torch.randn(4, 1)] * 26
        >>> model(torch.randn(4, 13), sparse, linear).shape
        torch.Size([4, 1])
    """

    wants_linear = True
    __jit_ignored_attributes__ = ("config",)

    def __init__(self, config: DeepFMConfig, inputs: ModelInputs) -> None:
        super().__init__()
        if not inputs.sparse_dims:
            raise ConfigError("DeepFM: needs at least one sparse feature for the FM term")
        dim = inputs.sparse_dims[0]
        require_equal_dims("DeepFM", inputs.sparse_dims, dim, "FM needs one shared dim")
        self.config = config
        self.num_sparse: int = inputs.num_sparse
        self.use_dense_field: bool = config.dense_field and inputs.num_dense > 0
        self.dense_linear = dense_linear(inputs.num_dense, 1, config.dense_init)  # with Dd = 0: the global bias
        self.dense_field: nn.Module = nn.Identity()
        if self.use_dense_field:
            self.dense_field = nn.Linear(inputs.num_dense, dim)
        self.fm = FMInteraction()
        deep = MLP(inputs.concat_dim, config.deep_mlp)
        self.deep = nn.Sequential(deep, nn.Linear(deep.out_dim, inputs.num_tasks))

    def forward(
        self, dense: Tensor, sparse: list[Tensor], linear: list[Tensor] | None = None
    ) -> Tensor:
        first = sum_linear(linear, self.num_sparse, dense) + self.dense_linear(dense)
        if self.use_dense_field:
            fields = torch.stack([self.dense_field(dense)] + sparse, dim=1)
        else:
            fields = torch.stack(sparse, dim=1)
        return first + self.fm(fields) + self.deep(concat_inputs(dense, sparse))
