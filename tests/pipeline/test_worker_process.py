"""Data workers fork from a forkserver that imported torch once (``ember.pipeline.worker_process``):
a worker still sees the trainer's environment as it is when the worker starts, and a change to a
variable read at import time makes the next worker start fresh, saying so once."""

from __future__ import annotations

import logging
import os
from typing import Iterator

from torch.utils.data import IterableDataset

from ember.pipeline.loader import worker_loader
from ember import once
from ember.pipeline.worker_process import WorkerEnv, worker_context


class _Probe(IterableDataset):
    """Yields the worker's pid, whether torch was imported before the job ran, and a variable."""

    def __init__(self, name: str) -> None:
        self.name, self.env = name, WorkerEnv()

    def __iter__(self) -> Iterator[tuple[int, bool, str | None]]:
        import sys

        preloaded = "torch" in sys.modules and "ember.pipeline.loader" in sys.modules
        self.env.apply()
        yield os.getpid(), preloaded, os.environ.get(self.name)


def _probe(name: str) -> tuple[int, bool, str | None]:
    (pid, preloaded, value), = list(worker_loader(_Probe(name), 1, worker_context(), (0,)))
    return int(pid), bool(preloaded), value


def test_a_forked_worker_sees_the_environment_of_its_start(monkeypatch):
    monkeypatch.setenv("WORKER_PROBE", "first")
    pid, preloaded, value = _probe("WORKER_PROBE")
    assert value == "first" and pid != os.getpid()
    assert worker_context().get_start_method() == "forkserver" and preloaded  # forked from the server that imported them
    monkeypatch.setenv("WORKER_PROBE", "second")  # set after the forkserver started: still seen
    assert _probe("WORKER_PROBE")[2] == "second"


def test_an_import_time_variable_changed_since_means_a_fresh_worker_said_once(monkeypatch, caplog):
    assert worker_context().get_start_method() == "forkserver"  # its environment is recorded by now
    monkeypatch.setenv("EMBER_WORKER_PROBE", "1")
    once.forget("worker_process.spawn")
    with caplog.at_level(logging.INFO, logger="ember.pipeline.worker_process"):
        assert worker_context().get_start_method() == "spawn"
        assert worker_context().get_start_method() == "spawn"
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "EMBER_WORKER_PROBE changed" in said[0]
    monkeypatch.delenv("EMBER_WORKER_PROBE")
    assert worker_context().get_start_method() == "forkserver"
