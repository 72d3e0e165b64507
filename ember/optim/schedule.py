"""Learning-rate schedules: linear warmup, then a decay, as a pure function of the global step.

The learning rate of an optimizer step depends only on (base lr, schedule, step), never on
state held by an optimizer, so a resumed run uses exactly the rates an uninterrupted one would,
and the sparse update rules take the scheduled rate as an argument (nothing is rebuilt).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from ember.config_base import ConfigModel

__all__ = ["ScheduleConfig", "scheduled_lr"]

_NEEDS = {  # decay -> keys it uses besides warmup_steps
    "constant": set(),
    "linear": {"decay_steps", "final_ratio"},
    "cosine": {"decay_steps", "final_ratio"},
    "step": {"decay_steps", "gamma"},
    "exponential": {"decay_steps", "gamma"},
}


class ScheduleConfig(ConfigModel):
    """Multiplier of an optimizer's ``lr`` at each step ``s`` (0 for the first step).

    Warmup: ``(s + 1) / warmup_steps`` for ``s < warmup_steps`` (the first step already moves;
    step ``warmup_steps - 1`` reaches the full lr). After it, with ``p = s - warmup_steps``:

    - ``constant``: 1;
    - ``linear``: from 1 down to ``final_ratio`` over ``decay_steps`` steps, then ``final_ratio``;
    - ``cosine``: ``final_ratio + (1 - final_ratio) * (1 + cos(pi * min(p / decay_steps, 1))) / 2``;
    - ``step``: ``gamma ** floor(p / decay_steps)`` (a drop every ``decay_steps`` steps);
    - ``exponential``: ``gamma ** (p / decay_steps)`` (smooth; Keras' ExponentialDecay).

    Example:
        >>> s = ScheduleConfig(warmup_steps=2, decay="linear", decay_steps=4)
        >>> [s.factor(i) for i in range(7)]
        [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    """

    warmup_steps: int = Field(0, ge=0)
    """Steps `s < warmup_steps` use `lr · (s + 1) / warmup_steps` (the first step already moves)."""
    decay: Literal["constant", "linear", "cosine", "step", "exponential"] = "constant"
    """After warmup, with `p = s - warmup_steps`: `constant`; `linear` (1 → `final_ratio` over `decay_steps`,
    then flat); `cosine` (`final_ratio + (1 - final_ratio)(1 + cos(π·min(p/decay_steps, 1)))/2`); `step`
    (`gamma^floor(p/decay_steps)`); `exponential` (`gamma^(p/decay_steps)`)."""
    decay_steps: int | None = Field(None, ge=1)
    """Steps of the decay (`linear`, `cosine`) or between drops (`step`, `exponential`); required but for
    `constant`."""
    final_ratio: float | None = Field(None, ge=0, le=1)
    """`linear`, `cosine`: the final lr as a fraction of `lr`; unset: 0."""
    gamma: float | None = Field(None, gt=0, le=1)
    """`step`, `exponential`: the factor per `decay_steps`; unset: 0.1."""

    @model_validator(mode="after")
    def _keys_fit_decay(self) -> "ScheduleConfig":
        needs = _NEEDS[self.decay]
        if "decay_steps" in needs and self.decay_steps is None:
            raise ValueError(f"decay '{self.decay}' needs decay_steps (steps after warmup over which the lr "
                             "decays; e.g. train.max_steps minus warmup_steps)")
        for key in ("decay_steps", "final_ratio", "gamma"):
            if getattr(self, key) is not None and key not in needs:
                users = [d for d, n in _NEEDS.items() if key in n]
                raise ValueError(f"'{key}' has no effect with decay '{self.decay}' (it is for {', '.join(users)}); "
                                 "remove it or pick one of those")
        return self

    def factor(self, step: int) -> float:
        """The lr multiplier of optimizer step ``step`` (0-based count of steps before it)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.decay == "constant":
            return 1.0
        assert self.decay_steps is not None  # checked by the validator
        p = (step - self.warmup_steps) / self.decay_steps
        if self.decay in ("linear", "cosine"):
            final = self.final_ratio or 0.0
            q = min(p, 1.0)
            shape = 1.0 - q if self.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * q))
            return final + (1.0 - final) * shape
        gamma = 0.1 if self.gamma is None else self.gamma
        return gamma ** (math.floor(p) if self.decay == "step" else p)


def scheduled_lr(lr: float, schedule: ScheduleConfig | None, step: int) -> float:
    """``lr`` at optimizer step ``step`` (0-based) under ``schedule`` (None: constant ``lr``)."""
    return lr if schedule is None else lr * schedule.factor(step)
