"""When a run stops: SIGINT / SIGTERM ask it to stop after the batches already fetched, with
one checkpoint. Distributed, the ranks agree after every step (one tiny all-reduce,
``DistributedRun.agree``) so that a signal to any rank stops them all after the same step, and
a time-based checkpoint (``checkpoint.every_s``) falls on the same step on every rank;
a time-based export (``export.every_s``) and window report (``eval.window_every_s``) likewise;
under ``data.shard: files`` the same all-reduce tells every rank the others' rows two steps
ahead (``ember.train.shards``), online the others' stream batches (``ember.train.stream_ranks``).
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable, Protocol

from ember.distributed.process_group import DistributedRun
from ember.pipeline.staleness import FetchGate
from ember.train.checkpointer import Checkpointer

__all__ = ["StopSignals", "SignalsHeld", "StopAgreement", "Ahead", "Timed"]


class Ahead(Protocol):
    """What the ranks agree on ahead (``FileShards``, ``StreamRanks``: ``ahead`` steps)."""

    end: int | None

    def start(self, dist: DistributedRun) -> None: ...

    def ask(self, step: int) -> list[int]: ...

    def hear(self, step: int, agreed: list[int]) -> None: ...


class Timed(Protocol):
    """A report due by the clock (a checkpoint, an export, a window report): ``time_due()`` on
    this rank; ``mark(step)``: due after ``step`` on every rank."""

    def time_due(self) -> bool: ...

    def mark(self, step: int) -> None: ...


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
    thread; elsewhere nothing changes), or for the rest of the process after ``keep()``."""

    def __enter__(self) -> "SignalsHeld":
        self._old: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, lambda signum, frame: None)
        return self

    def keep(self) -> None:
        """Leave the signals held when the block ends: the process is ending with an error of
        its own, and a signal now (torchrun's SIGTERM to the ranks left after one died) must not
        turn its exit code into the signal's."""
        self._old.clear()

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class StopAgreement:
    """One pass's agreement after each step (see the module docstring): ``stopping`` is the
    signal that stops the run (distributed: agreed on by every rank), None while it goes on.
    ``gate``: the pass's fetch gate, told where the pass ends; ``shards``: what the ranks agree
    on ahead (``data.shard: files``, an online stream); ``timed``: reports due by the clock
    besides the checkpoint (an export, a window report); ``ahead``: how many steps ahead a report
    due by the clock is marked (``ember.train.shards.ahead_of`` the run's staleness: past the
    furthest step any rank's fetch may have reached)."""

    def __init__(self, signals: StopSignals, dist: DistributedRun | None, checkpointer: Checkpointer,
                 gate: FetchGate, shards: Ahead | None = None, timed: tuple[Timed, ...] = (), ahead: int = 2) -> None:
        self.signals, self.dist, self.checkpointer, self.gate, self.shards = signals, dist, checkpointer, gate, shards
        self.ahead = ahead
        self.timed: tuple[Timed, ...] = (checkpointer, *timed)
        self.stopping: int | None = None
        self._pending: Callable[[], list[int]] | None = None  # the last step's agreement, read after the next

    def first(self) -> bool:
        """Before the pass's first step: under file shards (online), agree on the rows (batches)
        of its first steps; False when the pass has no step (no rank has a row, e.g. header-only
        files; online: some rank's stream has no batch)."""
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
        lets the batches already fetched train, but fetches no more.

        Distributed without ``shards``, the all-reduce is read one step late: the one asked after
        step t runs across step t + 1's compute and is read after it, so that no rank waits for
        a round trip of the network on every step (on a slow link, behind the embedding
        exchange's traffic). Every rank reads the same answer after the same step, so a signal
        still stops them all after one step, and a report due by the clock falls on one step
        (marked ``ahead`` past the step it is read after, as when read at once). With
        ``shards`` the answer is read at once: it carries the rows of the next steps."""
        if self.dist is None:
            self.stopping = self.signals.signum
        else:  # one tiny all-reduce: every rank stops after the same step, and checkpoints it
            shards = self.shards  # (files: and learns every rank's rows two steps ahead; the pass ends where none has any)
            ask = [self.signals.signum or 0] + [int(t.time_due()) for t in self.timed] + (
                shards.ask(index) if shards is not None else [])
            if shards is not None:
                self._hear(self.dist.agree(ask), index, step)
            else:
                earlier, self._pending = self._pending, self.dist.agree_later(ask)
                if earlier is not None:
                    self._hear(earlier(), index, step)
        if self.stopping is not None:
            self.gate.stop()  # no more fetches; the batches already fetched still train
        return self.stopping

    def _hear(self, agreed: list[int], index: int, step: int) -> None:
        """Act on an agreement read after step ``step``."""
        n = 1 + len(self.timed)
        if self.shards is not None:
            self.shards.hear(index, agreed[n:])
            if self.shards.end is not None:
                self.gate.end_at(self.shards.end)
        self.stopping = self.stopping or agreed[0] or None
        for timed, due in zip(self.timed, agreed[1:n]):
            if due:  # at step + ahead: its batch is not fetched yet on any rank (the
                timed.mark(step + self.ahead)  # fetch may be at step + ahead - 1), so the gate holds after it

    def after_pass(self) -> int | None:
        """Once the pass is over: the stopping signal (one process: also one during the last step;
        distributed: the answer of the last step's agreement, if not read yet)."""
        if self.dist is None:
            self.stopping = self.signals.signum
        elif self._pending is not None:
            pending, self._pending = self._pending, None
            agreed = pending()
            self.stopping = self.stopping or agreed[0] or None
        return self.stopping
