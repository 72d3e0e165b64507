"""What every model is built from (:class:`ModelInputs`) and small shared checks."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from ember.config_base import ConfigModel
from ember.errors import ConfigError
from ember.models.distill import DistillConfig

__all__ = ["DenseInit", "ModelConfigBase", "ModelInputs", "concat_inputs", "dense_linear", "require_equal_dims", "sum_linear"]


@dataclass(frozen=True)
class ModelInputs:
    """The input layout a model is built for; the trainer derives it from the schema.

    Args:
        num_dense: Dd, dense features per sample (may be 0).
        sparse_dims: D_i, the pooled embedding width of each sparse feature, in schema order.
        num_tasks: T, logits per sample.
        feature_names: the sparse features' names, in the same order (for models that place
            features by name, e.g. DMT's towers; may be empty).

    Example:
        >>> inputs = ModelInputs(num_dense=13, sparse_dims=[16] * 26, num_tasks=1)
        >>> inputs.num_sparse, inputs.concat_dim
        (26, 429)
    """

    num_dense: int
    sparse_dims: list[int] = field(default_factory=list)
    num_tasks: int = 1
    feature_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_dense < 0:
            raise ConfigError(f"ModelInputs: num_dense must be >= 0, got {self.num_dense}")
        if any(d <= 0 for d in self.sparse_dims):
            raise ConfigError(f"ModelInputs: every sparse dim must be > 0, got {self.sparse_dims}")
        if self.num_tasks < 1:
            raise ConfigError(f"ModelInputs: num_tasks must be >= 1, got {self.num_tasks}")
        if self.num_dense == 0 and not self.sparse_dims:
            raise ConfigError("ModelInputs: no features (num_dense=0 and no sparse_dims)")

    @property
    def num_sparse(self) -> int:
        """Number of sparse features F_s."""
        return len(self.sparse_dims)

    @property
    def concat_dim(self) -> int:
        """Width of ``concat(dense, *sparse)``: Dd + sum D_i."""
        return self.num_dense + sum(self.sparse_dims)


class ModelConfigBase(ConfigModel):
    """Keys every model config has: ``distill`` (learn from a teacher's scores, see
    ``ember.models.distill``; None: no teacher)."""

    distill: DistillConfig | None = None
    """Learn from a teacher model's scores (`schema.teacher` columns); unset: no teacher."""


def require_equal_dims(model: str, dims: Sequence[int], expected: int, remedy: str) -> None:
    """Raise ConfigError unless every sparse dim equals ``expected`` (for dot/FM interactions).

    Example:
        >>> require_equal_dims("DLRM", [16, 16], 16, "")
    """
    bad = [(i, d) for i, d in enumerate(dims) if d != expected]
    if bad:
        shown = ", ".join(f"feature {i}: {d}" for i, d in bad[:5])
        raise ConfigError(
            f"{model}: every sparse embedding dim must be {expected} for the pairwise "
            f"interaction, got {shown}{' ...' if len(bad) > 5 else ''}; {remedy}"
        )


def sum_linear(linear: list[Tensor] | None, num_sparse: int, dense: Tensor) -> Tensor:
    """Sum of the per-feature first-order terms, [B, 1]; raises if the trainer passed none.

    Example:
        >>> sum_linear([torch.ones(2, 1), torch.ones(2, 1)], 2, torch.zeros(2, 0))
        tensor([[2.],
                [2.]])
    """
    if linear is None:
        raise ValueError(
            "this model has wants_linear=True: pass linear=[one [B, 1] tensor per sparse feature]"
        )
    if len(linear) != num_sparse:
        raise ValueError(
            "linear: expected " + str(num_sparse) + " tensors (one per sparse feature), got "
            + str(len(linear))
        )
    if num_sparse == 0:
        return torch.zeros(dense.shape[0], 1, dtype=dense.dtype, device=dense.device)
    return torch.cat(linear, dim=1).sum(dim=1, keepdim=True)


def concat_inputs(dense: Tensor, sparse: list[Tensor]) -> Tensor:
    """``concat(dense, *sparse)`` along features: [B, Dd + sum D_i].

    Example:
        >>> concat_inputs(torch.zeros(2, 0), [torch.ones(2, 3)]).shape
        torch.Size([2, 3])
    """
    return torch.cat([dense] + sparse, dim=1)


NORMAL_STD = 0.01  # DenseInit's std of type normal, unless set


class DenseInit(ConfigModel):
    """How the first-order weights over the dense features (``dense_linear``: w·dense + b) start.

    - ``zeros`` (default): w = 0 and b = 0, what plain logistic-regression baselines do. The
      first logit is 0 whatever the scale of the dense features, so runs differ only by data
      order, not by where w happened to start.
    - ``normal``: w ~ N(0, std²) (``std`` default 0.01), b = 0: a small symmetry-breaking start.
    - ``torch``: PyTorch's ``nn.Linear`` default, w and b ~ U(±1/√Dd). With unscaled dense
      inputs this starts far from 0: on Criteo (log1p counts, means up to ~7) the first logits
      differ by seed by about ±1.5, and a short run (one epoch of a small sample) does not
      recover (measured, LR on the Criteo sample, batch 128, default optimizers: AUC
      0.700 ± 0.025 over 5 seeds vs 0.720 ± 0.003 with ``zeros``; bench/RESULTS.md).

    A bare string is short for ``{type: <string>}``.

    Example:
        >>> DenseInit.parse("normal").type, DenseInit().type
        ('normal', 'zeros')
    """

    type: Literal["zeros", "normal", "torch"] = "zeros"
    """`zeros`: w = 0, b = 0, as plain logistic regression does: the first logit is 0 whatever the scale of the
    dense inputs; `normal`: w ~ N(0, std²), b = 0; `torch`: PyTorch's `nn.Linear` default, U(±1/√Dd) for w and
    b (on Criteo's log1p counts it starts each seed's logits ~±1.5 apart: one epoch of LR on the sample, batch
    128, default optimizers, ended at AUC 0.700 ± 0.025 over 5 seeds, against 0.720 ± 0.003 with `zeros`;
    `bench/RESULTS.md`)."""
    std: float | None = Field(None, gt=0)
    """Standard deviation for `normal` only; unset: 0.01."""

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"type": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _check(self) -> "DenseInit":
        if self.type != "normal" and self.std is not None:
            raise ValueError(f"dense_init: 'std' is only used by type 'normal', not {self.type!r}; remove it or set type: normal")
        return self


def dense_linear(num_dense: int, out_dim: int, init: DenseInit | None = None) -> nn.Linear:
    """``nn.Linear(Dd, out_dim)`` started as ``init`` says (default: all zero, see
    :class:`DenseInit`); with Dd = 0 it is a learned bias, which starts at zero.

    Example:
        >>> dense_linear(0, 1)(torch.zeros(3, 0))
        tensor([[0.],
                [0.],
                [0.]], grad_fn=<AddmmBackward0>)
        >>> dense_linear(13, 1).weight.abs().sum().item()
        0.0
    """
    init = init or DenseInit()
    with warnings.catch_warnings():  # Dd = 0: "Initializing zero-element tensors is a no-op"
        warnings.simplefilter("ignore", UserWarning)
        layer = nn.Linear(num_dense, out_dim)  # draws torch's default init (type: torch)
    with torch.no_grad():
        if num_dense == 0 or init.type != "torch":
            layer.bias.zero_()
        if init.type == "zeros":
            layer.weight.zero_()
        elif init.type == "normal":
            layer.weight.normal_(0.0, NORMAL_STD if init.std is None else init.std)
    return layer
