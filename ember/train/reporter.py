"""What a run reports as it trains: the ``train`` records (loss, samples/s, learning rates,
table and pipeline statistics, bytes exchanged), the progress bar, and the rolling window's
``eval`` records (``eval.window_rows``: progressive validation, ``ember.train.window``).

Reporting only reads the run: the tables' TTL sweep (``expire_tables``) is the loop's to call.
"""

from __future__ import annotations

import time
from typing import Any

from ember.config import RunConfig
from ember.distributed.process_group import DistributedRun
from ember.pipeline.loader import Loader
from ember.pipeline.scheduler import Scheduler
from ember.train import clock
from ember.train.builder import Components
from ember.train.history import History
from ember.train.metrics import json_safe
from ember.train.progress import Progress
from ember.train.run_state import RunState
from ember.train.schedule import lr_record
from ember.train.stages import TrainStages
from ember.train.window import RollingWindow, merged

__all__ = ["Reporter", "WindowReports", "expire_tables", "table_stats", "fmt_metrics"]


class WindowReports:
    """When the rolling window is reported: every ``eval.window_every`` steps (default
    ``train.log_every``), and, with ``eval.window_every_s``, after the first step whose batch
    is fetched that long after the last report (decided at the fetch, like time-based
    checkpoints, so the fetch gate and the loop agree; distributed, the ranks agree on it after
    each step: ``time_due`` / ``mark``). Distributed (``dist``), the window reported is every
    rank's together (``ember.train.window.merged``: one gather per report, on every rank)."""

    def __init__(self, window: RollingWindow | None, every: int | None, every_s: float | None,
                 dist: DistributedRun | None = None) -> None:
        self.window, self.every, self.every_s, self.dist = window, every, every_s, dist
        self.due: set[int] = set()
        self.last = -1  # the step last reported
        self._at = clock.now() if window is not None and every_s is not None else 0.0  # when it was

    @classmethod
    def of_run(cls, cfg: RunConfig, tasks: list[str], dist: DistributedRun | None = None) -> "WindowReports":
        """``eval.window_rows``' window (``window``: None when unset) and when to report it."""
        e = cfg.eval
        window = RollingWindow(e.window_rows, tasks, e) if e.window_rows is not None else None
        every = e.window_every or (cfg.train.log_every if e.window_every_s is None else None)
        return cls(window, every, e.window_every_s, dist)

    def time_due(self) -> bool:
        """Whether ``window_every_s`` passed since the last report, with none marked yet."""
        return self.window is not None and self.every_s is not None and not self.due and clock.now() - self._at >= self.every_s

    def mark(self, s: int) -> None:
        if self.window is not None:
            self.due.add(s)

    def decide(self, s: int) -> None:
        if self.time_due():
            self.mark(s)

    def metrics(self) -> dict[str, Any]:
        """The window's metrics (distributed: every rank's window together; call on every rank)."""
        assert self.window is not None
        if self.dist is None:
            return self.window.metrics()
        return merged(self.dist.all_gather(self.window.tagged()), self.window.rows, self.window.tasks, self.window.config)

    def after(self, s: int) -> bool:
        return self.window is not None and (bool(self.every and s % self.every == 0) or s in self.due)

    def log(self, step: int, history: History) -> None:
        """One ``eval`` record of the window (``window_rows``: the pairs it held) at ``step``."""
        m = self.metrics()
        if m:
            history.log({"kind": "eval", "step": step, **m})
        self.due.discard(step)
        self.last = step
        if self.every_s is not None:
            self._at = clock.now()


class Reporter:
    """The run's reports to ``history`` and ``progress`` (see the module docstring)."""

    def __init__(self, cfg: RunConfig, parts: Components, history: History, progress: Progress, step: int) -> None:
        self.cfg, self.parts, self.history, self.progress = cfg, parts, history, progress
        self.windows = WindowReports.of_run(cfg, parts.task_names, parts.dist)
        self.window = self.windows.window
        self._final: dict[str, Any] = {}
        self._logged = step  # the step of the last train record (bytes are reported per step since)
        self._t0 = time.perf_counter()

    def start_pass(self, loader: Loader) -> None:
        """A pass over ``loader`` starts: samples/s counts from here; the progress bar watches
        its reads (a CSV epoch's estimated total)."""
        self.progress.watch(loader)
        self._t0 = time.perf_counter()

    def log_due(self, step: int) -> bool:
        return step % self.cfg.train.log_every == 0

    def train_record(self, state: RunState, stages: TrainStages, run: Scheduler) -> None:
        """Log the ``train`` record of the steps since the last one (on a quiet engine)."""
        step, parts = state.step, self.parts
        loss_sum, seen = stages.take_metrics()
        now = time.perf_counter()
        rec: dict[str, Any] = {"kind": "train", "step": step, "epoch": state.epoch, "loss": loss_sum / max(seen, 1),
                               "samples_per_s": seen / (now - self._t0)}
        rec.update(lr_record(parts, step))
        stats = table_stats(parts)
        if parts.dist is not None and parts.dist.embedding_ranks:  # rank 0 holds no rows: the first embedding rank's
            stats = parts.dist.broadcast(stats, src=parts.dist.embedding_ranks[0])
        rec.update(stats)
        if parts.dist is not None:  # this rank's tables; bytes exchanged per step
            rec.update(parts.dist.exchange.take_stats(step - self._logged))
            self._logged = step
        rec.update({f"pipeline.{key}": v for key, v in run.stats().items()})
        self.history.log(rec)
        self.progress.update(step, rec)
        self._t0 = now

    def window_after(self, step: int) -> None:
        """Log the rolling window when its report is due after ``step``."""
        if self.windows.after(step):
            self.windows.log(step, self.history)

    def note(self, metrics: dict[str, float]) -> None:
        """Show an evaluation's metrics beside the progress bar."""
        self.progress.note(fmt_metrics(metrics))

    def finish(self, step: int, first_step: int) -> None:
        """As the run ends: report the window unless this step's is; keep its metrics for the
        summary (on every rank)."""
        if self.window is not None and self.windows.last != step and step > first_step:
            self.windows.log(step, self.history)
        self._final = self.windows.metrics() if self.window is not None else {}

    def summary(self) -> dict[str, Any]:
        """``summary.json``'s window entry (empty without a window), as ``finish`` found it."""
        return {"window": json_safe(self._final)} if self.window is not None else {}


def expire_tables(parts: Components) -> None:
    """The TTL sweep of every table (bounded work; rows past their TTL are dropped)."""
    for ec in parts.collections():
        for table in ec.tables.values():
            table.expire()


def table_stats(parts: Components) -> dict[str, float]:
    """Per-table rows and tier metrics since the last call (hit rates, promotions, evictions)."""
    out: dict[str, float] = {}
    for ec in parts.collections():
        for name, table in ec.tables.items():
            for key, value in table.stats().items():
                out[f"{name}/{key}"] = value
            table.reset_step_stats()
    return out


def fmt_metrics(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4f}" for k, v in metrics.items() if k != "rows")
