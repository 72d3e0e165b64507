"""Wide & Deep: a wide linear part over first-order terms plus a deep MLP, summed."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor, nn

from ember.models.base import DenseInit, ModelConfigBase, ModelInputs, concat_inputs, dense_linear, sum_linear
from ember.models.layers.mlp import MLP, MLPConfig

__all__ = ["WDL", "WDLConfig"]


class WDLConfig(ModelConfigBase):
    """Wide & Deep (Cheng et al. 2016). The wide part is linear; ``dense_init`` says how its
    weights over the dense features and its bias start (default ``zeros``, see ``DenseInit``).

    Example:
        >>> WDLConfig(deep_mlp={"sizes": [64], "dropout": 0.1}).deep_mlp.dropout
        0.1
    """

    type: Literal["wdl"] = "wdl"
    """`wdl`: Wide & Deep, first-order (wide) terms plus a deep MLP."""
    deep_mlp: MLPConfig = Field(default_factory=lambda: MLPConfig(sizes=[400, 400, 400]))
    """MLP over the concatenated embeddings and dense features."""
    dense_init: DenseInit = DenseInit()
    """How the wide part's weights over the dense features start."""


class WDL(nn.Module):
    """logit = sum(linear) + w·dense + b (wide, shared by tasks) + MLP(concat) (deep, T outputs).

    Shapes:
        dense [B, Dd], sparse F_s × [B, D_i], linear F_s × [B, 1] -> logits [B, T]

    Example:
        >>> import torch
        >>> model = WDL(WDLConfig(deep_mlp=[32]), ModelInputs(13, [16] * 26, 1))
        >>> sparse, linear = [torch.randn(4, 16)] * 26, [torch.randn(4, 1)] * 26
        >>> model(torch.randn(4, 13), sparse, linear).shape
        torch.Size([4, 1])
    """

    wants_linear = True
    __jit_ignored_attributes__ = ("config",)

    def __init__(self, config: WDLConfig, inputs: ModelInputs) -> None:
        super().__init__()
        self.config = config
        self.num_sparse: int = inputs.num_sparse
        self.dense_linear = dense_linear(inputs.num_dense, 1, config.dense_init)  # with Dd = 0: the global bias
        deep = MLP(inputs.concat_dim, config.deep_mlp)
        self.deep = nn.Sequential(deep, nn.Linear(deep.out_dim, inputs.num_tasks))

    def forward(
        self, dense: Tensor, sparse: list[Tensor], linear: list[Tensor] | None = None
    ) -> Tensor:
        wide = sum_linear(linear, self.num_sparse, dense) + self.dense_linear(dense)
        return wide + self.deep(concat_inputs(dense, sparse))
