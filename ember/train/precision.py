"""Reduced-precision dense compute: autocast for the model, fp32 master weights, and dynamic
loss scaling for fp16 that covers the embedding gradients too.

``train.precision``: ``fp32`` (default), ``bf16`` (bfloat16 autocast: fp32's range, so no loss
scaling) or ``fp16`` (float16 autocast with a dynamic loss scale). Parameters, optimizer state,
embedding rows and the loss stay fp32; only the model's matmuls and convolutions run in the
reduced type (torch.autocast's op lists). The pooled embeddings enter the model in fp32.

Loss scaling (fp16): the loss is multiplied by ``scale`` before backward so small gradients do
not flush to zero; the dense and the embedding gradients are divided by it again before any
optimizer sees them. A step whose gradients hold an inf or NaN is skipped whole (no dense step,
no row update) and the scale halves; after ``growth_interval`` clean steps it doubles. Unlike
``torch.amp.GradScaler``, which only knows the dense optimizer's parameters, this scaler checks
and unscales the embedding gradients as well, so one overflow never updates half a model.

Distributed, each rank sees only its own gradients before the exchange (the embedding
gradients of its slice): the ranks agree on the overflow (``agree``: a MAX all-reduce of the
flag) before the scaler decides, so every rank skips the same steps and keeps the same scale.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterable, Literal

import torch
from torch import Tensor

__all__ = ["Precision", "LossScaler", "autocast", "DTYPES"]

log = logging.getLogger(__name__)

Precision = Literal["fp32", "bf16", "fp16"]
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, precision: Precision) -> contextlib.AbstractContextManager[Any]:
    """The autocast context of ``precision`` on ``device`` (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[precision])


class LossScaler:
    """Dynamic loss scale for fp16 training (see the module docstring).

    Args:
        agree: distributed: ``agree(overflowed here)`` returns whether any rank overflowed (a
            collective every rank calls at the same step); None: one process.

    Example:
        >>> s = LossScaler(init_scale=8.0, growth_interval=2)
        >>> g = torch.tensor([8.0, 16.0])
        >>> s.unscale_([g]), g.tolist(), s.scale
        (True, [1.0, 2.0], 8.0)
        >>> s.unscale_([torch.tensor([float("inf")])]), s.scale, s.skipped
        (False, 4.0, 1)
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, agree: Callable[[bool], bool] | None = None) -> None:
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.clean_steps = 0  # consecutive steps without overflow
        self.skipped = 0  # steps skipped for an overflow, in total
        self.agree = agree

    def scaled(self, loss: Tensor) -> Tensor:
        """``loss * scale``, to call backward on."""
        return loss * self.scale

    def unscale_(self, grads: Iterable[Tensor | None]) -> bool:
        """Divide ``grads`` by the scale in place and update the scale; False when any of them
        holds an inf or NaN (the step must then be skipped); distributed, False on every rank
        when any rank's do."""
        inv = 1.0 / self.scale
        flags = []
        for g in grads:
            if g is not None:
                g.mul_(inv)
                flags.append(torch.isfinite(g).all())
        finite = bool(torch.stack(flags).all()) if flags else True
        if self.agree is not None:
            finite = not self.agree(not finite)
        if finite:
            self.clean_steps += 1
            if self.clean_steps >= self.growth_interval:
                self.scale *= self.growth_factor
                self.clean_steps = 0
        else:
            self.scale *= self.backoff_factor
            self.clean_steps = 0
            self.skipped += 1
            log.info("fp16 loss scale: gradients overflowed, step skipped, scale now %g", self.scale)
        return finite

    def state_dict(self) -> dict[str, float | int]:
        return {"scale": self.scale, "clean_steps": self.clean_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.clean_steps, self.skipped = int(state["clean_steps"]), int(state["skipped"])
