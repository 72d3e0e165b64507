"""Where a data worker process (``pipeline.data_workers: 1``) comes from: forked from a
forkserver that imported torch and ember's data path once for this process, so each worker
(every epoch's, every online stream's) starts in a fraction of a second instead of the ~3 s a
fresh interpreter spends importing torch on these machines.

The forkserver is a fresh interpreter started on first use (never a fork of the trainer and
its threads), with this process's environment at that moment. A worker still sees the
trainer's environment as it is when the worker starts (``WorkerEnv``: credentials or an
endpoint set since, say). Variables read when torch or ember is imported (``EMBER_NATIVE``,
``OMP_*``...) cannot be changed that way: where they differ from the forkserver's, the worker is
spawned fresh instead, and the log says so once. Where the platform has no forkserver
(macOS, Windows), workers are spawned, as before.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from multiprocessing import forkserver
from typing import Any, Sequence

from ember import once

__all__ = ["worker_context", "forkserver_context", "WorkerEnv"]

log = logging.getLogger(__name__)

_PRELOAD = ["torch", "numpy", "pyarrow", "ember.pipeline.loader", "ember.pipeline.stream"]
# variables read at import time (torch's and ember's): a forked worker has the forkserver's
_IMPORT_ENV = ("EMBER_", "OMP_", "MKL_", "GLIBC_TUNABLES", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHON", "TORCH_",
               "CUDA_VISIBLE_DEVICES")
_server_env: dict[str, str] | None = None


def _import_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(_IMPORT_ENV)}


def _spawn(why: str) -> Any:
    if once.first("worker_process.spawn", why):
        log.info("data workers start as fresh interpreters (~3 s each, importing torch): %s", why)
    return mp.get_context("spawn")


def forkserver_context(preload: Sequence[str] = ()) -> tuple[Any, str | None]:
    """This process's forkserver context, with ``preload`` added to what it imports when it
    starts, and None; or None and why a child forked from it would not have this process's
    import-time environment (it started with another, or the platform has none). The
    forkserver is one per process: every user of it (data workers; the tests' rank harness)
    asks here, so its environment is recorded once, when first asked."""
    global _server_env
    if "forkserver" not in mp.get_all_start_methods():
        return None, "this platform has no forkserver"
    ctx = mp.get_context("forkserver")
    asked = list(getattr(getattr(forkserver, "_forkserver", None), "_preload_modules", None) or [])
    ctx.set_forkserver_preload(list(dict.fromkeys([*asked, *preload])))  # (no effect once it runs)
    if _server_env is None:
        _server_env = _import_env()
    elif _import_env() != _server_env:
        changed = sorted({k for k, _ in set(_import_env().items()) ^ set(_server_env.items())})
        return None, (f"{', '.join(changed)} changed since the forkserver started, and a process forked from it "
                      "would keep the old value")
    return ctx, None


def worker_context() -> Any:
    """The multiprocessing context a data worker starts from: the forkserver (see the module
    docstring), or spawn where it cannot be used (said once)."""
    ctx, why = forkserver_context(_PRELOAD)
    return ctx if ctx is not None else _spawn(why or "")


class WorkerEnv:
    """The trainer's environment when a worker's job was made, put in place in the worker
    (``apply``) before it reads anything."""

    def __init__(self) -> None:
        self.env = dict(os.environ)

    def apply(self) -> None:
        if os.environ != self.env:
            os.environ.clear()
            os.environ.update(self.env)
