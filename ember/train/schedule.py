"""Learning-rate schedules in the trainer: the rates of every optimizer for the log (the dense
optimizer's lr is set before each step by ``Components.backward``). Both are pure functions of the global step
(``ember.optim.schedule``), so a resumed run uses the same rates as an uninterrupted one."""

from __future__ import annotations

from ember.optim import rule_lr
from ember.optim.schedule import scheduled_lr
from ember.train.builder import Components

__all__ = ["lr_record"]


def lr_record(parts: Components, steps_done: int) -> dict[str, float]:
    """The rates the last step (``steps_done - 1``) used: ``lr`` (dense) and ``<table>/lr`` for
    every table whose optimizer has an lr (FTRL has none), for ``metrics.jsonl``."""
    at = max(steps_done - 1, 0)
    out: dict[str, float] = {}
    cfg = parts.dense_config
    if cfg is not None:
        out["lr"] = scheduled_lr(cfg.lr, cfg.schedule, at)
    for ec in parts.collections():
        for name, table in ec.tables.items():
            rule = table.optimizer
            if hasattr(rule, "lr"):
                lr = rule_lr(rule, at)
                out[f"{name}/lr"] = float(rule.lr if lr is None else lr)  # type: ignore[union-attr]  # hasattr above
    return out
