"""Multi-task models over concat(dense, sparse): MMoE and the shared-bottom baseline."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from ember.models.base import ModelConfigBase, ModelInputs, concat_inputs
from ember.models.layers.mlp import MLP, MLPConfig
from ember.models.layers.moe import MMoELayer

__all__ = ["MMoE", "MMoEConfig", "SharedBottom", "SharedBottomConfig"]


class MMoEConfig(ModelConfigBase):
    """MMoE (Ma et al. 2018): ``num_experts`` expert MLPs, a softmax gate and tower per task.

    Example:
        >>> MMoEConfig(num_experts=8).expert_mlp.sizes
        [256, 128]
    """

    type: Literal["mmoe"] = "mmoe"
    """`mmoe`: multi-gate mixture of experts, one gate and tower per label."""
    num_experts: int = Field(4, ge=1)
    """Experts shared by the tasks."""
    expert_mlp: MLPConfig = Field(default_factory=lambda: MLPConfig(sizes=[256, 128]))
    """Each expert's MLP."""
    tower_mlp: MLPConfig = Field(default_factory=lambda: MLPConfig(sizes=[64]))
    """Each task tower's MLP."""


class MMoE(nn.Module):
    """MMoE over x = concat(dense, sparse); one logit per task.

    Shapes:
        dense [B, Dd], sparse F_s × [B, D_i] -> logits [B, T]

    Example:
        >>> import torch
        >>> config = MMoEConfig(num_experts=2, expert_mlp=[32], tower_mlp=[8])
        >>> model = MMoE(config, ModelInputs(13, [16] * 26, num_tasks=2))
        >>> model(torch.randn(4, 13), [torch.randn(4, 16)] * 26).shape
        torch.Size([4, 2])
    """

    wants_linear = False
    __jit_ignored_attributes__ = ("config",)

    def __init__(self, config: MMoEConfig, inputs: ModelInputs) -> None:
        super().__init__()
        self.config = config
        self.moe = MMoELayer(
            inputs.concat_dim, inputs.num_tasks, config.num_experts, config.expert_mlp,
            config.tower_mlp,
        )

    def forward(
        self, dense: Tensor, sparse: list[Tensor], linear: list[Tensor] | None = None
    ) -> Tensor:
        return self.moe(concat_inputs(dense, sparse))


class SharedBottomConfig(ModelConfigBase):
    """Shared-bottom multi-task baseline: one shared MLP, then a tower per task.

    Example:
        >>> SharedBottomConfig().bottom_mlp.sizes
        [256, 128]
    """

    type: Literal["shared_bottom"] = "shared_bottom"
    """`shared_bottom`: one shared MLP, one tower per label."""
    bottom_mlp: MLPConfig = Field(default_factory=lambda: MLPConfig(sizes=[256, 128]))
    """The shared MLP."""
    tower_mlp: MLPConfig = Field(default_factory=lambda: MLPConfig(sizes=[64]))
    """Each task tower's MLP."""


class SharedBottom(nn.Module):
    """towers_t(MLP(concat(dense, sparse))) for t < T.

    Shapes:
        dense [B, Dd], sparse F_s × [B, D_i] -> logits [B, T]

    Example:
        >>> import torch
        >>> config = SharedBottomConfig(bottom_mlp=[32], tower_mlp=[8])
        >>> model = SharedBottom(config, ModelInputs(13, [16] * 26, num_tasks=3))
        >>> model(torch.randn(4, 13), [torch.randn(4, 16)] * 26).shape
        torch.Size([4, 3])
    """

    wants_linear = False
    __jit_ignored_attributes__ = ("config",)

    def __init__(self, config: SharedBottomConfig, inputs: ModelInputs) -> None:
        super().__init__()
        self.config = config
        self.bottom = MLP(inputs.concat_dim, config.bottom_mlp)
        towers = []
        for _ in range(inputs.num_tasks):
            body = MLP(self.bottom.out_dim, config.tower_mlp)
            towers.append(nn.Sequential(body, nn.Linear(body.out_dim, 1)))
        self.towers = nn.ModuleList(towers)

    def forward(
        self, dense: Tensor, sparse: list[Tensor], linear: list[Tensor] | None = None
    ) -> Tensor:
        shared = self.bottom(concat_inputs(dense, sparse))
        logits: list[Tensor] = []
        for tower in self.towers:
            logits.append(tower(shared))
        return torch.cat(logits, dim=1)
