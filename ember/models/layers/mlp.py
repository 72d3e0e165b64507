"""MLP block: Linear -> [BatchNorm] -> activation -> [Dropout], repeated."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, model_validator
from torch import Tensor, nn

from ember.config_base import ConfigModel

__all__ = ["MLP", "Activation", "MLPConfig", "make_activation"]

Activation = Literal["relu", "leaky_relu", "gelu", "silu", "tanh", "sigmoid", "identity"]


def make_activation(name: str) -> nn.Module:
    """A fresh activation module by name (one of :data:`Activation`).

    Example:
        >>> make_activation("leaky_relu")
        LeakyReLU(negative_slope=0.01)
    """
    table = {
        "relu": nn.ReLU,
        "leaky_relu": nn.LeakyReLU,
        "gelu": nn.GELU,
        "silu": nn.SiLU,
        "tanh": nn.Tanh,
        "sigmoid": nn.Sigmoid,
        "identity": nn.Identity,
    }
    if name not in table:
        raise ValueError(f"unknown activation {name!r}; allowed: {', '.join(table)}")
    return table[name]()


class MLPConfig(ConfigModel):
    """Hidden sizes and per-layer options of an MLP. A bare list is read as ``sizes``.

    Example:
        >>> MLPConfig.parse([64, 32]).sizes
        [64, 32]
        >>> MLPConfig(sizes=[8], dropout=0.1).activation
        'relu'
    """

    sizes: list[int] = Field(min_length=1)
    """Output size of each layer."""
    activation: Activation = "relu"
    """Activation after each layer: relu, leaky_relu, gelu, silu, tanh, sigmoid or identity."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout probability after each activation."""
    batchnorm: bool = False
    """BatchNorm after each linear layer (not under distributed training)."""

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, data: Any) -> Any:
        if isinstance(data, (list, tuple)):
            return {"sizes": list(data)}
        return data

    @model_validator(mode="after")
    def _positive_sizes(self) -> MLPConfig:
        if any(s <= 0 for s in self.sizes):
            raise ValueError(f"every MLP size must be > 0, got {self.sizes}")
        return self


class MLP(nn.Module):
    """Stack of ``Linear -> [BatchNorm1d] -> activation -> [Dropout]`` blocks.

    The last block's activation is ``final_activation`` (default: the hidden one). Use
    ``"identity"`` when the output feeds a dot product or a loss (a ReLU there can die).

    Args:
        in_dim: input width D_in (may be 0: the MLP then learns a constant).
        config: an :class:`MLPConfig` or just the list of sizes.
        final_activation: activation after the last layer; ``None`` = ``config.activation``.

    Shapes:
        [B, D_in] -> [B, sizes[-1]]

    Example:
        >>> import torch
        >>> mlp = MLP(13, [64, 16], final_activation="identity")
        >>> mlp(torch.randn(4, 13)).shape
        torch.Size([4, 16])
    """

    def __init__(
        self, in_dim: int, config: MLPConfig | Sequence[int], final_activation: str | None = None
    ) -> None:
        super().__init__()
        if not isinstance(config, MLPConfig):
            config = MLPConfig.parse(list(config), where="mlp")
        layers: list[nn.Module] = []
        for i, size in enumerate(config.sizes):
            last = i == len(config.sizes) - 1
            layers.append(nn.Linear(in_dim, size))
            if config.batchnorm:
                layers.append(nn.BatchNorm1d(size))
            act = final_activation if (last and final_activation is not None) else config.activation
            layers.append(make_activation(act))
            if config.dropout > 0:
                layers.append(nn.Dropout(config.dropout))
            in_dim = size
        self.layers = nn.Sequential(*layers)
        self.out_dim: int = in_dim

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)
