"""Disaggregated Multi-Tower (DMT): features in towers; each tower interacts and compresses its
own embeddings, and only the towers' compressed outputs meet in the global interaction.

Why: in DLRM every pair of the F features interacts (F² dot products on F·D floats per sample),
and under sharding every embedding crosses the network to meet the others. DMT splits the
features into K towers of related features; a tower module (its features' pairwise dots plus
their concatenation, through a small MLP) turns each tower into ``tower_vectors`` vectors of the
embedding dim, and DLRM's dot interaction then runs over the dense bottom output and those K x
``tower_vectors`` vectors only. With a tower's tables placed on one node, only the compressed
outputs cross nodes (``distributed.placement: towers``, ``ember.distributed.towers``). Good
towers group features whose embeddings interact strongly: ``ember towers --checkpoint RUN
--towers K`` proposes them from a trained model (``ember.models.towers``).

Config ``towers``: lists of sparse feature names (every feature in exactly one tower), or
``num_towers: K`` to cut the features in schema order into K towers of near-equal size (default
4 towers when neither is given).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from ember.errors import ConfigError
from ember.models.base import ModelConfigBase, ModelInputs, require_equal_dims
from ember.models.layers.interaction import DotInteraction
from ember.models.layers.mlp import MLP, MLPConfig

__all__ = ["DMT", "DMTConfig", "DMTHead", "tower_indices"]

DEFAULT_TOWERS = 4  # without towers or num_towers (or fewer, with fewer features)


class DMTConfig(ModelConfigBase):
    """DMT's keys. ``bottom_mlp`` (dense features) must end in the embedding dim D, as in DLRM.

    Example:
        >>> DMTConfig(num_towers=2).tower_mlp.sizes
        [128]
    """

    type: Literal["dmt"] = "dmt"
    """`dmt`: Disaggregated Multi-Tower, DLRM whose interaction runs over compressed tower outputs."""
    towers: list[list[str]] | None = None
    """Lists of sparse feature names, each feature in exactly one tower."""
    num_towers: int | None = Field(None, ge=1)
    """K towers cut in schema order, when `towers` is not given (default 4)."""
    tower_mlp: MLPConfig = Field(default_factory=lambda: MLPConfig(sizes=[128]))
    """MLP of each tower over its features' concatenation and pairwise dots."""
    tower_vectors: int = Field(2, ge=1)
    """Vectors of the embedding dim each tower outputs."""
    bottom_mlp: MLPConfig = Field(default_factory=lambda: MLPConfig(sizes=[512, 256, 16]))
    """MLP over the dense features; must end in the embedding dim."""
    top_mlp: MLPConfig = Field(default_factory=lambda: MLPConfig(sizes=[512, 256]))
    """MLP over the interaction output."""

    @model_validator(mode="after")
    def _one_way(self) -> "DMTConfig":
        if self.towers is not None and self.num_towers is not None:
            raise ValueError("give towers (lists of feature names) or num_towers, exactly one of them")
        if self.towers is not None and any(not t for t in self.towers):
            raise ValueError("towers: every tower needs at least one feature")
        return self


def tower_indices(config: DMTConfig, names: list[str]) -> list[list[int]]:
    """Each tower's feature positions in ``names`` (schema order), checked: every feature in
    exactly one tower."""
    if config.towers is None:
        if not names and config.num_towers is None:
            return []  # dense features only: no towers
        k = config.num_towers or min(DEFAULT_TOWERS, len(names))
        if k > len(names):
            raise ConfigError(f"model.num_towers: {k} towers for {len(names)} sparse features; use at most {len(names)}")
        cuts = [i * len(names) // k for i in range(k + 1)]
        return [list(range(cuts[i], cuts[i + 1])) for i in range(k)]
    where = {n: i for i, n in enumerate(names)}
    unknown = [n for t in config.towers for n in t if n not in where]
    if unknown:
        raise ConfigError(f"model.towers: unknown sparse feature(s) {unknown}; the features are {names}")
    listed = [n for t in config.towers for n in t]
    twice = sorted({n for n in listed if listed.count(n) > 1})
    missing = [n for n in names if n not in listed]
    if twice or missing:
        raise ConfigError(f"model.towers: every sparse feature must be in exactly one tower; "
                          f"in several: {twice}; in none: {missing}")
    return [[where[n] for n in t] for t in config.towers]


class _Tower(nn.Module):
    """One tower: its features of [B, F_s, D] -> [B, V, D] (their pairwise dots and
    concatenation, an MLP, V vectors)."""

    def __init__(self, index: list[int], dim: int, mlp: MLPConfig, vectors: int) -> None:
        super().__init__()
        self.register_buffer("index", torch.tensor(index, dtype=torch.int64), persistent=False)
        self.interaction = DotInteraction(len(index))
        self.mlp = MLP(len(index) * dim + self.interaction.num_pairs, mlp)
        self.out = nn.Linear(self.mlp.out_dim, vectors * dim)
        self.vectors, self.dim = vectors, dim

    def forward(self, x_all: Tensor) -> Tensor:
        x = x_all.index_select(1, self.index)
        local = torch.cat([x.flatten(1), self.interaction(x)], dim=1)
        return self.out(self.mlp(local)).view(-1, self.vectors, self.dim)


class DMT(nn.Module):
    """Towers over the sparse features, then DLRM's dot interaction over the dense bottom output
    and the towers' outputs, then the top MLP.

    Shapes:
        dense [B, Dd], sparse F_s × [B, D] -> logits [B, T]

    Example:
        >>> inputs = ModelInputs(num_dense=3, sparse_dims=[8] * 4, num_tasks=1, feature_names=["a", "b", "c", "d"])
        >>> model = DMT(DMTConfig(towers=[["a", "c"], ["b", "d"]], bottom_mlp=[16, 8], top_mlp=[16]), inputs)
        >>> model(torch.randn(5, 3), [torch.randn(5, 8)] * 4).shape
        torch.Size([5, 1])
    """

    wants_linear = False
    __jit_ignored_attributes__ = ("config",)

    def __init__(self, config: DMTConfig, inputs: ModelInputs) -> None:
        super().__init__()
        self.config = config
        dim = inputs.sparse_dims[0] if inputs.sparse_dims else config.bottom_mlp.sizes[-1]  # no towers without them
        require_equal_dims("DMT", inputs.sparse_dims, dim, "DMT needs one shared dim")
        names = inputs.feature_names or [f"f{i}" for i in range(inputs.num_sparse)]
        groups = tower_indices(config, names)
        self.has_dense: bool = inputs.num_dense > 0
        if self.has_dense and config.bottom_mlp.sizes[-1] != dim:
            raise ConfigError(f"DMT: bottom_mlp must end in the embedding dim {dim}, got {config.bottom_mlp.sizes}; "
                              f"set its last size to {dim}")
        self.bottom: nn.Module = MLP(inputs.num_dense, config.bottom_mlp, "identity") if self.has_dense else nn.Identity()
        self.num_towers: int = len(groups)
        self.towers = nn.ModuleList([_Tower(g, dim, config.tower_mlp, config.tower_vectors) for g in groups])
        vectors = int(self.has_dense) + len(groups) * config.tower_vectors
        self.interaction = DotInteraction(vectors)
        top_in = self.interaction.num_pairs + (dim if self.has_dense else 0)
        if top_in == 0:
            raise ConfigError("DMT: one tower with one output vector and no dense features gives no interaction; "
                              "raise tower_vectors")
        top = MLP(top_in, config.top_mlp)
        self.top = nn.Sequential(top, nn.Linear(top.out_dim, inputs.num_tasks))

    def forward(self, dense: Tensor, sparse: list[Tensor], linear: list[Tensor] | None = None) -> Tensor:
        outs: list[Tensor] = []
        if len(sparse) > 0:
            x = torch.stack(sparse, dim=1)  # [B, F_s, D]
            for tower in self.towers:
                outs.append(tower(x))
        return self.head(dense, outs)

    def head(self, dense: Tensor, outs: list[Tensor]) -> Tensor:
        """Everything after the towers: the bottom MLP, the global interaction over its output
        and the towers' outputs ``outs`` (K x [B, V, D]), the top MLP -> logits [B, T]."""
        if self.has_dense:
            bottom = self.bottom(dense)
            pairs = self.interaction(torch.cat([bottom.unsqueeze(1)] + outs, dim=1))
            return self.top(torch.cat([bottom, pairs], dim=1))
        return self.top(self.interaction(torch.cat(outs, dim=1)))


class DMTHead(nn.Module):
    """A DMT's head (``DMT.head``) as a module of its own, sharing the DMT's bottom, interaction
    and top: what tower placement runs data-parallel over every rank while the towers live on
    their nodes (``ember.distributed.towers``)."""

    def __init__(self, dmt: DMT) -> None:
        super().__init__()
        self.bottom, self.interaction, self.top, self.has_dense = dmt.bottom, dmt.interaction, dmt.top, dmt.has_dense

    def forward(self, dense: Tensor, outs: list[Tensor]) -> Tensor:
        return DMT.head(self, dense, outs)  # type: ignore[arg-type]  # the same attributes
