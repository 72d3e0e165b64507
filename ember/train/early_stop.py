"""Early stopping: watch one eval metric, stop the run when it has not improved for ``patience``
evaluations, keep (and optionally restore) the best checkpoint.

The trainer calls ``observe`` after each evaluation during training and stops (as at
``max_steps``: pipeline drained, final checkpoint written) when ``stop_here`` says so. The
state (best value and step, evaluations without improvement) travels in every checkpoint, so a
resumed run counts on where it left off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ember.checkpoint.save import checkpoint_path, mark_best
from ember.config import RunConfig
from ember.errors import ConfigError
from ember.train.builder import Components
from ember.train.checkpointer import restore
from ember.train.config import EarlyStoppingConfig

__all__ = ["EarlyStopping", "watch_metric"]


def watch_metric(metrics: dict[str, float], metric: str, tasks: list[str]) -> float:
    """The watched value: ``auc/<task>`` as named, or ``auc`` = the mean over ``tasks``."""
    if "/" in metric:
        return metrics[metric]
    return sum(metrics[f"{metric}/{t}"] for t in tasks) / len(tasks)


class EarlyStopping:
    """Best value, its step and checkpoint, and evaluations since the last improvement.

    Example:
        >>> es = EarlyStopping(EarlyStoppingConfig(metric="logloss", patience=2), ["label"])
        >>> [es.observe(s, {"logloss/label": v})["early_stopping.bad_evals"] for s, v in [(1, .5), (2, .4), (3, .45), (4, .41)]]
        [0, 0, 1, 2]
        >>> es.best, es.best_step, es.stop_here(4), es.stopped_step
        (0.4, 2, True, 4)
    """

    def __init__(self, cfg: EarlyStoppingConfig, tasks: list[str]) -> None:
        if "/" in cfg.metric and cfg.metric.split("/", 1)[1] not in tasks:
            raise ConfigError(f"train.early_stopping.metric {cfg.metric!r} names no task; the tasks (schema.labels) "
                              f"are {tasks}: use e.g. '{cfg.metric.split('/')[0]}/{tasks[0]}', or "
                              f"'{cfg.metric.split('/')[0]}' for the mean over tasks")
        self.cfg, self.tasks = cfg, tasks
        self.best: float | None = None
        self.best_step: int | None = None
        self.best_checkpoint: str | None = None
        self.bad_evals = 0
        self.stopped_step: int | None = None

    @classmethod
    def from_run(cls, cfg: RunConfig) -> "EarlyStopping | None":
        """The run's early stopping (None when not configured); ConfigError when the run has no
        eval data to watch."""
        es = cfg.train.early_stopping
        if es is None:
            return None
        if not cfg.data.holds("eval"):
            raise ConfigError("train.early_stopping watches an eval metric, but data.eval is not set: give eval files "
                              "(or data.sql.eval_query) or remove train.early_stopping")
        return cls(es, list(cfg.schema.labels))

    def _improves(self, value: float) -> bool:
        if self.best is None:
            return True
        if self.cfg.direction == "max":
            return value > self.best + self.cfg.min_delta
        return value < self.best - self.cfg.min_delta

    def observe(self, step: int, metrics: dict[str, float], save: Callable[[], Path] | None = None) -> dict[str, Any]:
        """Take the eval at ``step``; on an improvement with ``save_best``, ``save()`` writes a
        checkpoint, marked best. Returns the fields to add to the eval record."""
        value = watch_metric(metrics, self.cfg.metric, self.tasks)
        if self._improves(value):
            self.best, self.best_step, self.bad_evals = value, step, 0
            if self.cfg.save_best and save is not None:
                path = save()
                mark_best(path)
                self.best_checkpoint = str(path)
        else:
            self.bad_evals += 1
        return {"early_stopping.best": self.best, "early_stopping.best_step": self.best_step,
                "early_stopping.bad_evals": self.bad_evals}

    def stop_here(self, step: int) -> bool:
        """Whether patience ran out; if so the run stops at ``step`` (recorded)."""
        if self.bad_evals >= self.cfg.patience:
            self.stopped_step = step
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps, so that a resumed run counts on where it left off: plain
        numbers (a metric may be a numpy float; ``float`` is exact), as a checkpoint's dense
        state takes (``ember.checkpoint.save.check_plain``)."""
        return {"best": None if self.best is None else float(self.best),
                "best_step": None if self.best_step is None else int(self.best_step), "bad_evals": int(self.bad_evals)}

    def load_state_dict(self, state: dict[str, Any] | None, checkpoints: Path, own: Path) -> None:
        """Restore ``state_dict()`` (None: a checkpoint of a run without early stopping: start
        afresh). The best checkpoint is found again by its step under ``checkpoints`` (where the
        resumed checkpoint lies) and, when that is this run's own ``checkpoints`` directory
        ``own``, marked best again (the run may have stopped between writing and marking it)."""
        if state:
            self.best, self.best_step, self.bad_evals = state["best"], state["best_step"], state["bad_evals"]
            cand = checkpoint_path(checkpoints, self.best_step) if self.best_step is not None else None
            if self.cfg.save_best and cand is not None and (cand / "manifest.json").exists():
                if checkpoints.resolve() == own.resolve():
                    mark_best(cand)
                self.best_checkpoint = str(cand)

    def summary(self) -> dict[str, Any]:
        """For ``summary.json``: whether and where the run stopped early, and the best eval."""
        return {"stopped_early": self.stopped_step is not None, "stopped_step": self.stopped_step,
                "metric": self.cfg.metric, "mode": self.cfg.direction, "best": self.best, "best_step": self.best_step,
                "best_checkpoint": self.best_checkpoint, "restored_best": self.cfg.restore_best and self.best_checkpoint is not None}

    def finish(self, parts: Components, metrics: dict[str, float], history: list[dict[str, Any]]) -> dict[str, float]:
        """At the end of the run, after the final checkpoint: with ``restore_best``, load the best
        checkpoint's weights into ``parts`` and return the best eval's metrics; else ``metrics``."""
        if not self.cfg.restore_best or self.best_checkpoint is None:
            return metrics
        restore_weights(parts, Path(self.best_checkpoint))
        best = [r for r in history if r.get("kind") == "eval" and "window_rows" not in r and r.get("step") == self.best_step][-1]
        return {k: v for k, v in best.items() if k not in ("kind", "step") and not k.startswith("early_stopping.")}


def restore_weights(parts: Components, ckpt: Path) -> None:
    """Make ``parts`` exactly the state of checkpoint ``ckpt`` (``ember.train.checkpointer.restore``,
    exact): IDs created after it are gone. Distributed, every rank calls it and loads its own
    shard of the tables (the rows it owns, whatever world size wrote ``ckpt``) and the same dense state."""
    restore(parts, ckpt, exact=True)
