"""DCNv2: a cross network over concat(dense, sparse), stacked before or parallel to an MLP."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from ember.models.base import ModelConfigBase, ModelInputs, concat_inputs
from ember.models.layers.interaction import CrossNetwork
from ember.models.layers.mlp import MLP, MLPConfig

__all__ = ["DCN", "DCNConfig"]


class DCNConfig(ModelConfigBase):
    """DCN-V2 (Wang et al. 2021).

    ``structure``: ``stacked`` feeds the cross output to the MLP; ``parallel`` concatenates
    the cross output with the MLP output. ``low_rank``: None for full D×D cross matrices,
    else the rank r of the ``U V`` factorisation (cheaper when D is a few hundred).

    Example:
        >>> DCNConfig(low_rank=64).num_cross_layers
        3
    """

    type: Literal["dcn"] = "dcn"
    """`dcn`: DCNv2, cross layers plus a deep MLP."""
    num_cross_layers: int = Field(3, ge=1)
    """Cross layers."""
    low_rank: int | None = Field(None, ge=1)
    """Rank of each cross matrix; unset: full D x D matrices."""
    structure: Literal["stacked", "parallel"] = "stacked"
    """`stacked` (cross then deep) or `parallel` (side by side)."""
    deep_mlp: MLPConfig = Field(default_factory=lambda: MLPConfig(sizes=[512, 256]))
    """The deep part's MLP."""


class DCN(nn.Module):
    """x0 = concat(dense, sparse) [B, D0]; cross network; MLP; Linear to T logits.

    Shapes:
        dense [B, Dd], sparse F_s × [B, D_i] -> logits [B, T]

    Example:
        >>> import torch
        >>> model = DCN(DCNConfig(deep_mlp=[32], low_rank=8), ModelInputs(13, [16] * 26, 1))
        >>> model(torch.randn(4, 13), [torch.randn(4, 16)] * 26).shape
        torch.Size([4, 1])
    """

    wants_linear = False
    __jit_ignored_attributes__ = ("config",)

    def __init__(self, config: DCNConfig, inputs: ModelInputs) -> None:
        super().__init__()
        self.config = config
        self.parallel: bool = config.structure == "parallel"
        in_dim = inputs.concat_dim
        self.cross = CrossNetwork(in_dim, config.num_cross_layers, config.low_rank)
        self.deep = MLP(in_dim, config.deep_mlp)
        head_in = self.deep.out_dim + (in_dim if self.parallel else 0)
        self.head = nn.Linear(head_in, inputs.num_tasks)

    def forward(
        self, dense: Tensor, sparse: list[Tensor], linear: list[Tensor] | None = None
    ) -> Tensor:
        x0 = concat_inputs(dense, sparse)
        if self.parallel:
            return self.head(torch.cat([self.cross(x0), self.deep(x0)], dim=1))
        return self.head(self.deep(self.cross(x0)))
