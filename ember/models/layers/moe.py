"""Multi-gate mixture of experts (MMoE): shared experts, one softmax gate and tower per task."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ember.models.layers.mlp import MLP, MLPConfig

__all__ = ["MMoELayer"]


class MMoELayer(nn.Module):
    """E expert MLPs; task t mixes them with its gate softmax(G_t x) and feeds its tower.

    Args:
        in_dim: D_in, the input width.
        num_tasks: T, one gate, tower and output logit per task.
        num_experts: E.
        expert: sizes/options of every expert MLP (output width D_e = expert.sizes[-1]).
        tower: sizes/options of every task tower; a final Linear maps it to one logit.

    Shapes:
        [B, D_in] -> [B, T] logits

    Example:
        >>> layer = MMoELayer(10, num_tasks=2, num_experts=3, expert=[16], tower=[8])
        >>> layer(torch.randn(4, 10)).shape
        torch.Size([4, 2])
    """

    def __init__(
        self,
        in_dim: int,
        num_tasks: int,
        num_experts: int,
        expert: MLPConfig | list[int],
        tower: MLPConfig | list[int],
    ) -> None:
        super().__init__()
        self.experts = nn.ModuleList([MLP(in_dim, expert) for _ in range(num_experts)])
        expert_dim = self.experts[0].out_dim
        self.gates = nn.ModuleList([nn.Linear(in_dim, num_experts) for _ in range(num_tasks)])
        towers = []
        for _ in range(num_tasks):
            body = MLP(expert_dim, tower)
            towers.append(nn.Sequential(body, nn.Linear(body.out_dim, 1)))
        self.towers = nn.ModuleList(towers)

    def forward(self, x: Tensor) -> Tensor:
        outs: list[Tensor] = []
        for expert in self.experts:
            outs.append(expert(x))
        experts = torch.stack(outs, dim=1)  # [B, E, D_e]
        logits: list[Tensor] = []
        for gate, tower in zip(self.gates, self.towers):
            weights = torch.softmax(gate(x), dim=-1).unsqueeze(-1)  # [B, E, 1]
            logits.append(tower((weights * experts).sum(dim=1)))
        return torch.cat(logits, dim=1)
