"""Held-out evaluation during and at the end of a run, with early stopping watching it.

``evaluate(step, state)`` scores ``data.eval`` (``eval.max_batches``), logs an ``eval`` record and,
during training, lets early stopping watch it (an improvement with ``save_best`` saves the
state through the ``Checkpointer``). ``finish`` makes sure the final state was scored and
applies ``restore_best``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ember.config import RunConfig
from ember.pipeline.loader import make_batches
from ember.train.builder import Components
from ember.train.checkpointer import Checkpointer
from ember.train.early_stop import EarlyStopping
from ember.train.evaluate import evaluate
from ember.train.history import History
from ember.train.run_state import RunState

__all__ = ["Evaluator"]


class Evaluator:
    """Evaluates ``parts`` for a run and logs to ``history``; ``early`` (``train.early_stopping``)
    watches the evaluations made during training. ``metrics``: the last evaluation's."""

    def __init__(self, cfg: RunConfig, parts: Components, history: History, checkpointer: Checkpointer,
                 early: EarlyStopping | None = None) -> None:
        self.cfg, self.parts, self.history, self.checkpointer, self.early = cfg, parts, history, checkpointer, early
        self.metrics: dict[str, float] = {}

    def resume(self, dense: dict[str, Any], ckpt: Path, run_dir: Path) -> None:
        """Early stopping counts on from a resumed checkpoint's state (``dense``: its dense state)."""
        if self.early is not None:
            self.early.load_state_dict(dense.get("early_stopping"), ckpt.parent, run_dir / "checkpoints")

    def evaluate(self, step: int, state: RunState | None = None) -> dict[str, float]:
        """Evaluate at ``step`` and log; during training (``state``: where the run stands) early
        stopping watches it and may save ``state``. No eval data: {}."""
        cfg = self.cfg
        if not cfg.data.holds("eval"):
            return {}
        batches = make_batches(cfg.data, cfg.schema, "eval", threaded=cfg.pipeline.enabled, depth=cfg.pipeline.depth)
        m = evaluate(self.parts, batches, cfg.eval.max_batches)
        watched = {}
        if self.early is not None and state is not None:
            watched = self.early.observe(step, m, lambda: self.checkpointer.save(state))
        self.history.log({"kind": "eval", "step": step, **m, **watched})
        self.metrics = m
        return m

    def stops(self, step: int) -> bool:
        """Whether early stopping's patience ran out at ``step`` (the run stops there)."""
        return self.early is not None and self.early.stop_here(step)

    def finish(self, step: int) -> dict[str, float]:
        """At the end of the run, after the final checkpoint: evaluate the final state unless the
        last record already is its held-out eval; with early stopping, log its summary and (with
        ``restore_best``) make the parts and the returned metrics the best eval's."""
        records = self.history.records
        last = records[-1] if records else {}
        if not self.metrics or last.get("kind") != "eval" or last.get("step") != step or "window_rows" in last:
            self.evaluate(step)
        metrics = self.metrics
        if self.early is not None:
            self.history.log({"kind": "early_stopping", "step": step, **self.early.summary()})
            metrics = self.early.finish(self.parts, metrics, records)
        return metrics

    def summary(self) -> dict[str, Any]:
        """``summary.json``'s early-stopping entry (empty without early stopping)."""
        return {"early_stopping": self.early.summary()} if self.early is not None else {}
