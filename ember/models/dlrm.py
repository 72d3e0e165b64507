"""DLRM: bottom MLP on dense, pairwise dot interaction with the sparse embeddings, top MLP."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from ember.errors import ConfigError
from ember.models.base import ModelConfigBase, ModelInputs, require_equal_dims
from ember.models.layers.interaction import DotInteraction
from ember.models.layers.mlp import MLP, MLPConfig

__all__ = ["DLRM", "DLRMConfig"]


class DLRMConfig(ModelConfigBase):
    """DLRM (Naumov et al. 2019). ``bottom_mlp`` must end in the embedding dim D.

    ``bottom_final_activation`` defaults to ``identity``: a ReLU on the narrow (D=16) last
    bottom layer can kill every unit and silently drop the dense signal (see BENCHMARKING.md);
    the dot products and the top MLP do not need that output to be non-negative.

    Example:
        >>> DLRMConfig(bottom_mlp=[64, 16]).top_mlp.sizes
        [512, 256]
    """

    type: Literal["dlrm"] = "dlrm"
    """`dlrm`: bottom MLP over dense features, dot interaction with the embeddings, top MLP."""
    bottom_mlp: MLPConfig = Field(default_factory=lambda: MLPConfig(sizes=[512, 256, 16]))
    """MLP over the dense features; must end in the embedding dim."""
    top_mlp: MLPConfig = Field(default_factory=lambda: MLPConfig(sizes=[512, 256]))
    """MLP over the interaction output (the logit layer is added)."""
    bottom_final_activation: Literal["identity", "leaky_relu", "relu"] = "identity"
    """Activation of the bottom MLP's last layer: `identity`, `relu` or `leaky_relu`."""


class DLRM(nn.Module):
    """DLRM over F = 1 + F_s vectors of width D (F_s without dense features).

    Top input is ``concat(bottom_out, dot pairs)``; without dense features it is the pairs alone.

    Shapes:
        dense [B, Dd], sparse F_s × [B, D] -> logits [B, T]

    Example:
        >>> import torch
        >>> inputs = ModelInputs(num_dense=13, sparse_dims=[16] * 26, num_tasks=1)
        >>> model = DLRM(DLRMConfig(bottom_mlp=[32, 16], top_mlp=[32]), inputs)
        >>> model(torch.randn(4, 13), [torch.randn(4, 16)] * 26).shape
        torch.Size([4, 1])
    """

    wants_linear = False
    __jit_ignored_attributes__ = ("config",)

    def __init__(self, config: DLRMConfig, inputs: ModelInputs) -> None:
        super().__init__()
        self.config = config
        self.has_dense: bool = inputs.num_dense > 0
        if self.has_dense:
            dim = config.bottom_mlp.sizes[-1]
            if inputs.sparse_dims and inputs.sparse_dims[0] != dim:
                raise ConfigError(
                    f"DLRM: bottom_mlp must end in the embedding dim {inputs.sparse_dims[0]}, "
                    f"got {config.bottom_mlp.sizes}; set its last size to {inputs.sparse_dims[0]}"
                )
            self.bottom: nn.Module = MLP(
                inputs.num_dense, config.bottom_mlp, config.bottom_final_activation
            )
        else:
            dim = inputs.sparse_dims[0]
            self.bottom = nn.Identity()
        require_equal_dims("DLRM", inputs.sparse_dims, dim, "DLRM needs one shared dim")
        num_features = inputs.num_sparse + int(self.has_dense)
        self.interaction = DotInteraction(num_features)
        top_in = self.interaction.num_pairs + (dim if self.has_dense else 0)
        if top_in == 0:
            raise ConfigError("DLRM: a single sparse feature and no dense gives no interaction")
        top = MLP(top_in, config.top_mlp)
        self.top = nn.Sequential(top, nn.Linear(top.out_dim, inputs.num_tasks))

    def forward(
        self, dense: Tensor, sparse: list[Tensor], linear: list[Tensor] | None = None
    ) -> Tensor:
        if self.has_dense:
            bottom = self.bottom(dense)
            pairs = self.interaction(torch.stack([bottom] + sparse, dim=1))
            top_in = torch.cat([bottom, pairs], dim=1)
        else:
            top_in = self.interaction(torch.stack(sparse, dim=1))
        return self.top(top_in)
