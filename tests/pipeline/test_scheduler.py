"""The scheduler: the same stages give the same stream in line and on threads; ends, errors
and early exits stop every thread; busy time leaves out waits."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from ember.pipeline.scheduler import END, Scheduler, Stage, idle


def _ember_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("ember-stage-") and t.is_alive()]


MODES = ["in line", "threads", "mixed"]


def _run(ahead: list[Stage], behind: list[Stage], mode: str) -> Scheduler:
    """A scheduler over the stages: all in line, all on threads, or ``mixed``: threaded with
    every ahead stage but the source and the first behind stage on the caller's thread."""
    if mode == "mixed":
        ahead = [ahead[0]] + [dataclasses.replace(st, inline=True) for st in ahead[1:]]
        behind = [dataclasses.replace(st, inline=i == 0) for i, st in enumerate(behind)]
    return Scheduler(ahead, behind, threaded=mode != "in line")


def _stages(n: int = 20) -> tuple[list[Stage], list[int]]:
    """A source, a regrouping stage (pairs, with a remainder at the end), a map; and a sink."""
    held: list[int] = []

    def pair(x: int) -> list[int]:
        held.append(x)
        if len(held) < 2:
            return []
        out = [held[0] * 100 + held[1]]
        held.clear()
        return out

    def rest() -> list[int]:
        return [h * 100 for h in held]

    ahead = [Stage("read", lambda _: range(n), expand=True), Stage("pair", pair, expand=True, finish=rest),
             Stage("neg", lambda x: -x, depth=2)]
    return ahead, []


@pytest.mark.parametrize("mode", MODES)
def test_same_stream_in_line_and_on_threads(mode):
    ahead, _ = _stages(7)
    sink: list[int] = []
    with _run(ahead, [Stage("double", lambda x: 2 * x), Stage("sink", sink.append)], mode) as s:
        out = []
        for x in s:
            out.append(x)
            s.hand_back(x)
        s.drain()
    assert out == [-1, -203, -405, -600]
    assert sink == [2 * x for x in out]
    assert _ember_threads() == []


@pytest.mark.parametrize("mode", MODES)
def test_end_from_a_middle_stage_ends_the_stream(mode):
    stages = [Stage("read", lambda _: iter(range(10**9)), expand=True),
              Stage("cut", lambda x: END if x == 5 else x)]
    with _run(stages, [], mode) as s:
        assert list(s) == [0, 1, 2, 3, 4]
    assert _ember_threads() == []


@pytest.mark.parametrize("where", ["read", "middle", "behind"])
@pytest.mark.parametrize("mode", MODES)
def test_an_error_in_any_stage_stops_everything_and_names_the_stage(where, mode):
    def boom(x: int) -> int:
        if x == 3:
            raise OSError(28, "No space left on device")
        return x

    def source(_: None):
        for i in range(10**9):  # endless: only the error can end it
            if where == "read" and i == 3:
                raise OSError(28, "No space left on device")
            yield i

    ahead = [Stage("read", source, expand=True), Stage("middle", boom if where == "middle" else (lambda x: x))]
    behind = [Stage("behind", boom if where == "behind" else (lambda x: x))]
    t0 = time.perf_counter()
    with pytest.raises(OSError, match="No space left") as e:
        with _run(ahead, behind, mode) as s:
            for x in s:
                s.hand_back(x)
                s.drain()
    assert f"(in ember pipeline stage '{where}')" in e.value.__notes__
    assert time.perf_counter() - t0 < 10
    assert _ember_threads() == []


def test_leaving_early_stops_threads_blocked_on_full_queues():
    with Scheduler([Stage("read", lambda _: iter(range(10**9)), expand=True, depth=1), Stage("m", lambda x: x)]) as s:
        for x in s:
            if x == 2:
                break
    assert _ember_threads() == []


def test_busy_time_leaves_out_waits_and_queues_report_their_fill():
    def slow(x: int) -> int:
        with idle():
            time.sleep(0.02)  # waiting, e.g. for a gate
        t = time.perf_counter()
        while time.perf_counter() - t < 0.02:  # working
            pass
        return x

    with Scheduler([Stage("read", lambda _: range(10), expand=True), Stage("slow", slow)]) as s:
        s.stats()
        for _ in s:
            with s.timing("caller"):
                pass
        stats = s.stats()
    # half of each item is a wait (counted as busy: ~1.0; the work not counted: ~0); a loaded box
    # (two test processes at a time) can stretch the 20 ms sleeps
    assert 0.2 < stats["stage.slow.busy"] < 0.8
    assert stats["stage.read.busy"] < 0.2
    assert stats["queue.read.fill"] > 0.5  # the source runs ahead of the slow stage
    assert "stage.caller.busy" in stats


def test_behind_stages_map_one_to_one():
    with pytest.raises(ValueError, match="behind stages"):
        Scheduler([Stage("read", lambda _: [], expand=True)], [Stage("b", list, expand=True)])


def test_inline_stages_run_on_the_callers_thread_and_only_at_the_ends():
    """Inline stages: the last ahead and first behind ones, on the caller's thread; others refused."""
    where: dict[str, str] = {}

    def at(name: str):
        def fn(x):
            where[name] = threading.current_thread().name
            return x
        return fn

    ahead = [Stage("read", lambda _: range(3), expand=True), Stage("a", at("a")), Stage("b", at("b"), inline=True)]
    behind = [Stage("c", at("c"), inline=True), Stage("d", at("d"))]
    with Scheduler(ahead, behind) as s:
        for x in s:
            s.hand_back(x)
        s.drain()
        stats = s.stats()
    me = threading.current_thread().name
    assert where == {"a": "ember-stage-a", "b": me, "c": me, "d": "ember-stage-d"}
    assert "queue.a.fill" in stats and "queue.b.fill" not in stats and "stage.b.busy" in stats
    with pytest.raises(ValueError, match="inline stages must be the last ahead"):
        Scheduler([ahead[0], dataclasses.replace(ahead[1], inline=True), dataclasses.replace(ahead[2], inline=False)])
    with pytest.raises(ValueError, match="inline stages must be the last ahead"):
        Scheduler(ahead[:1], [behind[1], behind[0]])
    with pytest.raises(ValueError, match="source stage 'read' cannot be inline"):
        Scheduler([dataclasses.replace(ahead[0], inline=True)])
    assert _ember_threads() == []
