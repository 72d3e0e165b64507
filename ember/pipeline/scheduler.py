"""Scheduler: runs a chain of stages over a stream of items, on threads or in line.

A stage is a function over one item that knows nothing of its neighbours. The scheduler owns
the queues between them. Stages come in two chains around the caller's own work:

``ahead`` stages turn a source into items the caller iterates (read -> featurize -> plan ->
fetch -> ...); ``behind`` stages take each item the caller hands back (sparse update ->
metrics). Threaded, every stage has a thread and a bounded queue after it; in line, the same
functions run one after another on the caller's thread (the reference the threaded run is
tested against, and what ``pipeline.enabled: false`` runs). A threaded scheduler can also keep
single stages on the caller's thread (``Stage.inline``): the last ahead stages (the caller
runs them on each item it takes from the threads) and the first behind stages (run by
``hand_back`` before the rest go to threads); e.g. the embedding stages of a CPU dense step,
which a thread of their own would only take cores from.

Ends and errors: a stage returning ``END`` ends the stream there (the stages after it finish
what they hold); an exception in any stage stops every stage within one item and is re-raised
to the caller with a note naming the stage; ``close()`` (or leaving the ``with`` block) stops
and joins every thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

__all__ = ["Stage", "Scheduler", "END", "idle"]

log = logging.getLogger("ember.pipeline")


class _End:
    def __repr__(self) -> str:
        return "END"


END: Any = _End()
"""Returned (or yielded) by a stage to end the stream at that point."""


@dataclass
class Stage:
    """One step of the pipeline.

    ``fn(item)`` returns the item for the next stage (or ``END``); with ``expand=True`` it
    returns an iterable of 0..n items instead (a source, or a stage that regroups items), and
    ``finish()`` may return the items it still holds when its input ends. The first ``ahead``
    stage is called once, with ``None``: it is the source. ``depth``: the queue after it.
    ``inline``: on the caller's thread even when the scheduler is threaded (only the last
    ahead stages and the first behind stages may be; no queue after it).
    """

    name: str
    fn: Callable[[Any], Any]
    depth: int = 1
    expand: bool = False
    finish: Callable[[], Iterable[Any]] | None = None
    inline: bool = False


_waits = threading.local()  # per thread: seconds the running stage spent in ``idle()``


@contextmanager
def idle() -> Iterator[None]:
    """Inside a stage function: the block waits (for a lock, a gate), it does not work; its
    time is not counted as the stage's busy time."""
    t = time.perf_counter()
    try:
        yield
    finally:
        _waits.seconds = getattr(_waits, "seconds", 0.0) + time.perf_counter() - t


def _work_since(t: float) -> float:
    """Seconds since ``t`` spent working (the ``idle()`` time of this thread taken out)."""
    waited = getattr(_waits, "seconds", 0.0)
    _waits.seconds = 0.0
    return time.perf_counter() - t - waited


class _Stopped(Exception):
    """Raised inside the scheduler when it stops while a thread waits."""


class _Queue:
    """A bounded FIFO whose waits end when the scheduler stops; integrates its fill over time."""

    def __init__(self, name: str, depth: int, stop: threading.Event) -> None:
        self.name, self.depth, self._stop = name, depth, stop
        self._items: deque = deque()
        self._cv = threading.Condition()
        self._area = 0.0
        self._since = self._t = time.perf_counter()

    def _account(self) -> None:
        now = time.perf_counter()
        self._area += len(self._items) * (now - self._t)
        self._t = now

    def put(self, item: Any) -> None:
        with self._cv:
            while len(self._items) >= self.depth:
                if self._stop.is_set():
                    raise _Stopped
                self._cv.wait(0.1)
            self._account()
            self._items.append(item)
            self._cv.notify_all()

    def get(self) -> Any:
        with self._cv:
            while not self._items:
                if self._stop.is_set():
                    raise _Stopped
                self._cv.wait(0.1)
            self._account()
            item = self._items.popleft()
            self._cv.notify_all()
            return item

    def wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def mean_fill(self) -> float:
        """Mean number of items held since the last call."""
        with self._cv:
            self._account()
            span = self._t - self._since
            out = self._area / span if span > 0 else 0.0
            self._area, self._since = 0.0, self._t
            return out


class Scheduler:
    """Runs ``ahead`` stages into the caller's loop and ``behind`` stages after it.

    Args:
        ahead: stages producing the items the caller iterates; the first is the source.
        behind: stages run on each item given to ``hand_back`` (one output per input).
        threaded: a thread per stage with bounded queues (True), or all in line (False).
        stop_timeout_s: how long ``close`` waits for each thread to finish its current item.

    Example:
        >>> src = Stage("read", lambda _: range(5), expand=True)
        >>> sq = Stage("square", lambda x: x * x)
        >>> out = []
        >>> with Scheduler([src, sq], [Stage("keep", out.append)], threaded=True) as s:
        ...     for x in s:
        ...         s.hand_back(x + 1)
        ...     s.drain()
        >>> out
        [1, 2, 5, 10, 17]
    """

    def __init__(self, ahead: Sequence[Stage], behind: Sequence[Stage] = (), threaded: bool = True,
                 stop_timeout_s: float = 10.0) -> None:
        if not ahead:
            raise ValueError("Scheduler needs at least one ahead stage (the source)")
        if any(s.expand for s in behind):
            raise ValueError("behind stages map one item to one item (expand is for ahead stages)")
        if ahead[0].inline and threaded:
            raise ValueError(f"the source stage '{ahead[0].name}' cannot be inline in a threaded scheduler "
                             "(run it with threaded=False)")
        n_ahead = len(ahead) - _inline_run(reversed(ahead))
        n_behind = _inline_run(behind)
        if any(st.inline for st in [*ahead[:n_ahead], *behind[n_behind:]]):
            raise ValueError("inline stages must be the last ahead stages and the first behind stages: "
                             + ", ".join(st.name for st in [*ahead, *behind] if st.inline))
        self.ahead, self.behind = list(ahead), list(behind)
        # threaded: the stages on threads (the rest, inline, run on the caller's thread)
        self._ahead_threads, self._ahead_inline = self.ahead[:n_ahead], self.ahead[n_ahead:]
        self._behind_inline, self._behind_threads = self.behind[:n_behind], self.behind[n_behind:]
        self.threaded = threaded
        self.stop_timeout_s = stop_timeout_s
        self._stop = threading.Event()
        self._error: tuple[str, BaseException] | None = None
        self._busy: dict[str, float] = {s.name: 0.0 for s in [*self.ahead, *self.behind]}
        self._busy_lock = threading.Lock()
        self._since = time.perf_counter()
        self._threads: list[threading.Thread] = []
        self._handed = 0
        self._done = 0
        self._done_cv = threading.Condition()
        self._started = False
        self._queues: list[_Queue] = []
        self._behind_in: _Queue | None = None

    # ---- the caller's side -----------------------------------------------------------------
    def __enter__(self) -> "Scheduler":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Any]:
        if self._started:
            raise RuntimeError("a Scheduler runs its stream once")
        self._started = True
        stream: Iterator[Any] = iter([None])  # in line: every ahead stage runs here, from the source on
        inline = self.ahead
        if self.threaded:
            self._start_threads()
            stream = self._from_threads(self._queues[len(self._ahead_threads) - 1])
            inline = self._ahead_inline
        for stage in inline:
            stream = self._inline_stage(stage, stream)
        for item in stream:
            if self._stop.is_set():
                break
            yield item
        self._raise_error()

    def _from_threads(self, out: _Queue) -> Iterator[Any]:
        """The items of the last threaded ahead stage, until its END (or a stop)."""
        while True:
            try:
                item = out.get()
            except _Stopped:
                self._raise_error()
                return
            if item is END:
                self._raise_error()
                return
            yield item

    def hand_back(self, item: Any) -> None:
        """Give an item the caller finished to the ``behind`` stages."""
        self._raise_error()
        if not self.behind:
            return
        if not self.threaded:
            for stage in self.behind:
                item = self._call(stage, item)
            return
        if not self._started:
            raise RuntimeError("hand_back before iterating the Scheduler")
        for stage in self._behind_inline:
            item = self._call(stage, item)
        if self._behind_in is None:  # every behind stage is inline
            return
        self._handed += 1
        try:
            self._behind_in.put(item)
        except _Stopped:
            self._raise_error()
            raise RuntimeError("the pipeline was stopped") from None

    def drain(self) -> None:
        """Wait until every item handed back has passed all ``behind`` stages."""
        if not self.threaded or not self._behind_threads:
            self._raise_error()
            return
        with self._done_cv:
            while self._done < self._handed and not self._stop.is_set():
                self._done_cv.wait(0.1)
        self._raise_error()

    @contextmanager
    def timing(self, name: str) -> Iterator[None]:
        """Count the block's time as busy time of the caller's stage ``name`` (see ``stats``);
        an exception leaving it is noted as raised in that stage."""
        _waits.seconds = 0.0
        t = time.perf_counter()
        try:
            yield
        except BaseException as e:
            _note(e, name)
            raise
        finally:
            self._add_busy(name, _work_since(t))

    def stats(self) -> dict[str, float]:
        """Since the last call: each stage's busy fraction of the wall time (``stage.<name>.busy``)
        and each queue's mean fill in items (``queue.<name>.fill``, named after the stage that
        writes it). The busiest stage is the pipeline's bottleneck."""
        now = time.perf_counter()
        span = max(now - self._since, 1e-9)
        with self._busy_lock:
            out = {f"stage.{k}.busy": round(v / span, 4) for k, v in self._busy.items()}
            self._busy = dict.fromkeys(self._busy, 0.0)
        self._since = now
        for q in self._queues:
            out[f"queue.{q.name}.fill"] = round(q.mean_fill(), 3)
        return out

    def close(self) -> None:
        """Stop every stage and join its thread (each gets ``stop_timeout_s`` to finish)."""
        self._stop.set()
        for q in self._queues:
            q.wake()
        with self._done_cv:
            self._done_cv.notify_all()
        late = []
        for th in self._threads:
            th.join(self.stop_timeout_s)
            if th.is_alive():
                late.append(th.name)
        if late:
            log.warning("pipeline stage thread(s) %s did not stop within %.0f s; they end with the process",
                        ", ".join(late), self.stop_timeout_s)
        self._threads = []

    # ---- stages ----------------------------------------------------------------------------
    def _add_busy(self, name: str, dt: float) -> None:
        with self._busy_lock:
            self._busy[name] = self._busy.get(name, 0.0) + dt

    def _call(self, stage: Stage, item: Any) -> Any:
        _waits.seconds = 0.0
        t = time.perf_counter()
        try:
            return stage.fn(item)
        except BaseException as e:
            _note(e, stage.name)
            raise
        finally:
            self._add_busy(stage.name, _work_since(t))

    def _outputs(self, stage: Stage, item: Any) -> Iterator[Any]:
        """What ``stage`` makes of one input, timed (an expanding stage: each output's share)."""
        if not stage.expand:
            yield self._call(stage, item)
            return
        it = iter(self._call(stage, item))
        yield from self._timed(stage, it)

    def _timed(self, stage: Stage, it: Iterator[Any]) -> Iterator[Any]:
        while True:
            _waits.seconds = 0.0
            t = time.perf_counter()
            try:
                out = next(it)
            except StopIteration:
                return
            except BaseException as e:
                _note(e, stage.name)
                raise
            finally:
                self._add_busy(stage.name, _work_since(t))
            yield out

    def _finish(self, stage: Stage) -> Iterator[Any]:
        finish = stage.finish
        if finish is not None:
            yield from self._outputs(Stage(stage.name, lambda _: finish(), expand=True), None)

    def _inline_stage(self, stage: Stage, upstream: Iterator[Any]) -> Iterator[Any]:
        for item in upstream:
            for out in self._outputs(stage, item):
                if out is END:
                    return
                yield out
        yield from self._finish(stage)

    # ---- threads ---------------------------------------------------------------------------
    def _start_threads(self) -> None:
        self._queues = [_Queue(s.name, s.depth, self._stop) for s in self._ahead_threads]
        for i, stage in enumerate(self._ahead_threads):
            inq = self._queues[i - 1] if i else None
            self._spawn(stage, self._run_ahead, stage, inq, self._queues[i])
        if self._behind_threads:
            ins = [_Queue(f"{s.name}.in", s.depth, self._stop) for s in self._behind_threads]
            self._behind_in = ins[0]
            self._queues += ins
            for i, stage in enumerate(self._behind_threads):
                nxt = ins[i + 1] if i + 1 < len(ins) else None
                self._spawn(stage, self._run_behind, stage, ins[i], nxt)

    def _spawn(self, stage: Stage, target: Callable[..., None], *args: Any) -> None:
        th = threading.Thread(target=self._guard, args=(stage, target, *args), name=f"ember-stage-{stage.name}", daemon=True)
        self._threads.append(th)
        th.start()

    def _guard(self, stage: Stage, target: Callable[..., None], *args: Any) -> None:
        try:
            target(*args)
        except _Stopped:
            pass
        except BaseException as e:  # handed to the caller, who re-raises it
            _note(e, stage.name)
            if self._error is None:
                self._error = (stage.name, e)
            self._stop.set()
            for q in self._queues:
                q.wake()
            with self._done_cv:
                self._done_cv.notify_all()

    def _run_ahead(self, stage: Stage, inq: _Queue | None, outq: _Queue) -> None:
        def inputs() -> Iterator[Any]:
            if inq is None:
                yield None
                return
            while (item := inq.get()) is not END:
                yield item

        for item in inputs():
            for out in self._outputs(stage, item):
                if out is END:
                    outq.put(END)
                    return
                outq.put(out)
                if self._stop.is_set():
                    raise _Stopped
        for out in self._finish(stage):
            outq.put(out)
        outq.put(END)

    def _run_behind(self, stage: Stage, inq: _Queue, outq: _Queue | None) -> None:
        while True:
            item = inq.get()
            out = self._call(stage, item)
            if outq is not None:
                outq.put(out)
            else:
                with self._done_cv:
                    self._done += 1
                    self._done_cv.notify_all()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error[1]


def _inline_run(stages: Iterable[Stage]) -> int:
    """How many of ``stages``, from the first, are inline."""
    n = 0
    for st in stages:
        if not st.inline:
            break
        n += 1
    return n


def _note(e: BaseException, stage: str) -> None:
    """Name the stage on the exception (once), so the user's message says where it failed."""
    note = f"(in ember pipeline stage '{stage}')"
    if note not in getattr(e, "__notes__", []):
        e.add_note(note)
