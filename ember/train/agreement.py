"""When a run stops: SIGINT / SIGTERM ask it to stop after the batches already fetched, with
one checkpoint. Distributed, the ranks agree after every step (one tiny all-reduce,
``DistributedRun.agree``) so that a signal to any rank stops them all after the same step, and
a time-based checkpoint (``train.checkpoint_every_s``) falls on the same step on every rank;
under ``data.shard: files`` the same all-reduce tells every rank the others' rows two steps
ahead (``ember.train.shards``).
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from ember.distributed.process_group import DistributedRun
from ember.pipeline.staleness import FetchGate
from ember.train.checkpointer import Checkpointer
from ember.train.shards import FileShards

__all__ = ["StopSignals", "SignalsHeld", "StopAgreement"]


class StopSignals:
    """While training (on the main thread): SIGINT and SIGTERM ask the loop to stop at the next
    batch and checkpoint (``signum`` is set); a second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class SignalsHeld:
    """SIGINT and SIGTERM are noted, not acted on, for the moment of the block (on the main
    thread; elsewhere nothing changes)."""

    def __enter__(self) -> "SignalsHeld":
        self._old: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, lambda signum, frame: None)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class StopAgreement:
    """One pass's agreement after each step (see the module docstring): ``stopping`` is the
    signal that stops the run (distributed: agreed on by every rank), None while it goes on.
    ``gate``: the pass's fetch gate, told where the pass ends; ``shards``: ``data.shard: files``."""

    def __init__(self, signals: StopSignals, dist: DistributedRun | None, checkpointer: Checkpointer,
                 gate: FetchGate, shards: FileShards | None = None) -> None:
        self.signals, self.dist, self.checkpointer, self.gate, self.shards = signals, dist, checkpointer, gate, shards
        self.stopping: int | None = None

    def first(self) -> bool:
        """Before the pass's first step: under file shards, agree on the rows of its first steps;
        False when no rank has a row (e.g. header-only files): the pass takes no step."""
        if self.shards is None:
            return True
        assert self.dist is not None
        self.shards.start(self.dist)
        if self.shards.end == 0:
            return False
        if self.shards.end is not None:
            self.gate.end_at(self.shards.end)
        return True

    def after(self, index: int, step: int) -> int | None:
        """After step ``step`` (the pass's ``index``-th): the stopping signal, if any; a stop
        lets the batches already fetched train, but fetches no more."""
        if self.dist is None:
            self.stopping = self.signals.signum
        else:  # one tiny all-reduce: every rank stops after the same step, and checkpoints it
            shards = self.shards  # (files: and learns every rank's rows two steps ahead; the pass ends where none has any)
            agreed = self.dist.agree([self.signals.signum or 0, int(self.checkpointer.time_due())]
                                     + (shards.ask(index) if shards is not None else []))
            signum, time_due = agreed[:2]
            if shards is not None:
                shards.hear(index, agreed[2:])
                if shards.end is not None:
                    self.gate.end_at(shards.end)
            self.stopping = signum or None
            if time_due:  # at step + 2: its batch is not fetched yet (the pipeline's fetch
                self.checkpointer.mark(step + 2)  # of step + 1 may be), so the fetch gate holds after it
        if self.stopping is not None:
            self.gate.stop()  # no more fetches; the batches already fetched still train
        return self.stopping

    def after_pass(self) -> int | None:
        """Once the pass is over: the stopping signal (one process: also one during the last step)."""
        if self.dist is None:
            self.stopping = self.signals.signum
        return self.stopping
