"""The loop's collaborators on their own: Evaluator, Reporter (and its window cadence), StopAgreement."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from ember.config import from_dict
from ember.pipeline.staleness import FetchGate
from ember.train import clock
from ember.train.agreement import StopAgreement, StopSignals
from ember.train.builder import build_components
from ember.train.checkpointer import Checkpointer
from ember.train.early_stop import EarlyStopping
from ember.train.evaluator import Evaluator
from ember.train.history import History
from ember.train.progress import Progress
from ember.train.reporter import Reporter, WindowReports, expire_tables
from ember.train.run_state import RunState
from ember.train.window import RollingWindow


def _cfg(tmp_path, **train):
    return from_dict({
        "data": {"preset": "synthetic", "synthetic": {"rows": 512, "eval_rows": 256, "vocab_size": 500, "num_sparse": 2},
                 "batch_size": 128},
        "model": {"type": "lr"},
        "embedding": {"dim": 1, "ttl_steps": 5},
        "train": {"out_dir": str(tmp_path), "run_name": "r", "progress": False, "log_every": 2, **train},
    })


def test_evaluator_logs_and_early_stopping_saves_the_state_it_watched(tmp_path):
    cfg = _cfg(tmp_path, early_stopping={"metric": "logloss", "patience": 1})
    parts = build_components(cfg)
    history = History(tmp_path, write=False)
    early = EarlyStopping.from_run(cfg)
    ck = Checkpointer(cfg, parts, tmp_path, early)
    ev = Evaluator(cfg, parts, history, ck, early)
    m = ev.evaluate(4, RunState(4, 1, 2))
    assert history.records[-1]["kind"] == "eval" and history.records[-1]["step"] == 4 and ev.metrics == m
    assert history.records[-1]["early_stopping.best_step"] == 4
    assert (tmp_path / "checkpoints" / "step-00000004").exists()  # the improvement, saved at the state watched
    assert not ev.stops(4)
    ev.evaluate(6, RunState(6, 1, 4))  # the same weights: no improvement, patience 1
    assert ev.stops(6) and not (tmp_path / "checkpoints" / "step-00000006").exists()
    n = len(history.records)
    assert ev.finish(6) == m and history.records[n]["kind"] == "early_stopping"  # the last record was the final eval
    assert ev.summary()["early_stopping"]["stopped_step"] == 6


def test_evaluator_finish_scores_the_final_state_once(tmp_path):
    cfg = _cfg(tmp_path)
    parts = build_components(cfg)
    history = History(tmp_path, write=False)
    ev = Evaluator(cfg, parts, history, Checkpointer(cfg, parts, tmp_path))
    metrics = ev.finish(3)
    assert [r["kind"] for r in history.records] == ["eval"] and "auc/label" in metrics and ev.summary() == {}
    csv = from_dict({"data": {"format": "csv", "train": str(tmp_path / "t.csv"), "batch_size": 8},
                     "schema": {"labels": ["y"], "sparse": [{"name": "c"}]}, "model": {"type": "lr"}})
    assert Evaluator(csv, parts, history, Checkpointer(csv, parts, tmp_path)).evaluate(1) == {}  # no data.eval


def test_reporting_does_not_sweep_the_tables(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    parts = build_components(cfg)
    history = History(tmp_path, write=False)
    reporter = Reporter(cfg, parts, history, Progress(cfg, enabled=False), 0)
    swept = []
    for ec in parts.collections():
        for name, table in ec.tables.items():
            monkeypatch.setattr(table, "expire", lambda name=name: swept.append(name) or 0)
    stages = SimpleNamespace(take_metrics=lambda: (6.0, 12))
    run = SimpleNamespace(stats=lambda: {"stage.fetch": 0.5})
    reporter.train_record(RunState(2, 0, 2), stages, run)
    rec = history.records[-1]
    assert rec["kind"] == "train" and rec["step"] == 2 and rec["loss"] == 0.5 and rec["pipeline.stage.fetch"] == 0.5
    assert swept == []  # a report only reads the run
    expire_tables(parts)
    assert sorted(swept) == sorted(n for ec in parts.collections() for n in ec.tables)


def test_window_reports_by_steps_and_by_time(monkeypatch):
    now = iter(range(100))
    monkeypatch.setattr(clock, "monotonic", lambda: float(next(now)))
    window = RollingWindow(10, ["label"])
    by_steps = WindowReports(window, 3, None)
    assert [s for s in range(1, 10) if by_steps.after(s)] == [3, 6, 9]
    by_time = WindowReports(window, None, 2.0)  # the clock reads 0
    by_time.decide(1)  # 1 s
    by_time.decide(2)  # 2 s: due after step 2
    by_time.decide(3)  # one at a time
    assert [s for s in range(1, 5) if by_time.after(s)] == [2]
    assert not WindowReports(None, 1, None).after(1)  # no window: never


def test_a_signal_stops_after_the_step_and_no_more_is_fetched(tmp_path):
    cfg = _cfg(tmp_path)
    parts = build_components(cfg)
    gate = FetchGate(0)
    with StopSignals() as signals:
        agreement = StopAgreement(signals, None, Checkpointer(cfg, parts, tmp_path), gate)
        assert agreement.first() and agreement.after(0, 1) is None and gate.enter(0)
        signals.signum = signal.SIGTERM
        assert agreement.after(1, 2) == signal.SIGTERM and agreement.after_pass() == signal.SIGTERM
        assert not gate.enter(1)  # the batches already fetched still train; no later one is fetched


class _TwoRanks:
    """A DistributedRun's agreement for two ranks in one process: the other rank's values are
    set by the test; ``agree_later`` answers when read (the max of both), as the all-reduce."""

    def __init__(self) -> None:
        self.other: list[int] | None = None
        self.asked: list[list[int]] = []
        self.read = 0

    def agree_later(self, values: list[int]):
        other = self.other or [0] * len(values)
        self.asked.append(values)

        def answer() -> list[int]:
            self.read += 1
            return [max(a, b) for a, b in zip(values, other)]

        return answer

    def agree(self, values: list[int]) -> list[int]:
        return self.agree_later(values)()


class _Timed:
    def __init__(self) -> None:
        self.marks: list[int] = []

    def time_due(self) -> bool:
        return False

    def mark(self, step: int) -> None:
        self.marks.append(step)


def test_distributed_agreement_is_read_one_step_late_and_the_last_after_the_pass(tmp_path):
    """Distributed (no file shards), the all-reduce asked after step t is read after step t + 1:
    another rank's signal at step 1 stops this one after step 2, and a report due by the clock
    is marked ``ahead`` past the step it is read after; the last step's answer is read by
    after_pass."""
    cfg = _cfg(tmp_path)
    parts = build_components(cfg)
    gate, dist, timed = FetchGate(2), _TwoRanks(), _Timed()
    with StopSignals() as signals:
        agreement = StopAgreement(signals, dist, Checkpointer(cfg, parts, tmp_path), gate, timed=(timed,), ahead=2)
        assert agreement.after(0, 1) is None and dist.read == 0  # asked, not read: no wait on the network
        dist.other = [signal.SIGTERM, 0, 1]  # the other rank: a signal, and its export due by the clock
        assert agreement.after(1, 2) is None and dist.read == 1  # step 1's answer (nothing yet)
        assert agreement.after(2, 3) == signal.SIGTERM and timed.marks == [3 + 2]  # step 2's: after step 3
        assert not gate.enter(5)
        assert agreement.after_pass() == signal.SIGTERM and dist.read == 3  # the last answer read


def test_a_signal_in_the_last_step_is_heard_by_after_pass(tmp_path):
    cfg = _cfg(tmp_path)
    parts = build_components(cfg)
    dist = _TwoRanks()
    with StopSignals() as signals:
        agreement = StopAgreement(signals, dist, Checkpointer(cfg, parts, tmp_path), FetchGate(0))
        assert agreement.after(0, 1) is None
        signals.signum = signal.SIGINT
        assert agreement.after(1, 2) is None  # asked after step 2, not read yet
        assert agreement.after_pass() == signal.SIGINT


def test_signals_held_and_kept_outlast_the_block_so_a_late_sigterm_leaves_the_exit_code():
    """A rank that lost a peer exits 1 naming it; torchrun's SIGTERM to the ranks left, arriving
    while that rank exits, must not turn its exit code into -15 (``SignalsHeld.keep``)."""
    import os

    from ember.train.agreement import SignalsHeld

    def exit_code(keep: bool) -> int:
        pid = os.fork()
        if pid == 0:  # the child: hold (and keep, or not), then a SIGTERM, then exit 1
            try:
                with SignalsHeld() as held:
                    if keep:
                        held.keep()
                os.kill(os.getpid(), signal.SIGTERM)
            finally:
                os._exit(1)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    assert exit_code(keep=True) == 1
    assert exit_code(keep=False) == -signal.SIGTERM
