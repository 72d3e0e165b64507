"""Who stopped: heartbeats of the ranks in the rendezvous store, so that a rank that dies (or
hangs, or fails on its own) stops the others within seconds with an error naming it, instead of
a hang until ``distributed.timeout_s`` or a traceback from inside torch.distributed.

Every rank runs one daemon thread. Each second it

- bumps its own counter ``beat/<r>`` in the store torchrun already runs for the rendezvous
  (a connection of its own, keys under a prefix of the run),
- watches one neighbour, rank ``r + 1 mod N`` (so the store sees O(N) requests, not O(N²)):
  the neighbour is lost when its process is gone (same kernel and pid namespace: its pid no
  longer runs) or its counter has not moved for ``heartbeat_timeout_s``, unless it said it
  finished (``done/<r>``),
- reads the one shared ``verdict`` key, where the first rank that knows who stopped writes it
  (a watcher, or a rank that fails with an error of its own: its message goes there).

The main thread asks ``explain`` when a collective raised (gloo: "connection reset by peer"):
it waits for a verdict, bounded by the heartbeat timeout, and gets the message naming the rank.
A collective that never returns (a peer that hangs, a machine that vanished without closing its
sockets) would hold the main thread until ``timeout_s``: so when a verdict stands and the main
thread has not taken it within a few seconds, **this thread ends the process itself**: it
prints the verdict to stderr and calls ``os._exit(1)`` (no clean-up runs; the last complete
checkpoint is untouched, and every rank has stopped).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import threading
import time
from typing import Callable

import torch.distributed as dist

__all__ = ["Watchdog", "process_gone"]


def pid_space() -> str:
    """What makes a pid mean one process: this kernel boot and this pid namespace (hosts, and
    containers, may share a name, never both of these)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""  # unknown: a pid is never checked, the heartbeat alone decides


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` on this host has ended (gone, or a zombie awaiting its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc (not Linux): ask the kernel instead
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


class Watchdog:
    """Heartbeat of this rank and watch over its neighbour (see the module docstring).

    Args:
        store: a store every rank reaches (a client of the rendezvous store, under a prefix).
        rank, world_size: this rank and the number of ranks.
        timeout_s: a neighbour whose heartbeat has not moved for this long is lost.
        where: the store's address, for the message when the store itself is gone.
        interval_s: seconds between beats (and checks).
        grace_s: how long a verdict waits for the main thread before this thread ends the process.
        exit: how the process ends (tests replace it).
    """

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout_s: float, where: str,
                 interval_s: float = 1.0, grace_s: float = 3.0, exit: Callable[[int], None] = os._exit) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.timeout_s, self.where, self.interval_s, self.grace_s = timeout_s, where, interval_s, grace_s
        self._exit = exit
        self._lock = threading.Lock()  # one request at a time on the connection
        self._stop = threading.Event()
        self._verdict: str | None = None
        self._verdict_seen: float | None = None  # monotonic time this rank first saw it
        self.leaving = False  # the main thread handles the end itself (explain, close): never end it here
        self._neighbour = (rank + 1) % world_size
        self._who: dict[int, dict[str, object]] = {}
        self._last = (-1, time.monotonic())  # neighbour's counter, and when it last moved
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "pid_space": pid_space()}
        self._thread = threading.Thread(target=self._run, name="ember-watchdog", daemon=True)

    def start(self) -> None:
        """Say who this rank is, beat once, and start watching."""
        with self._lock:
            self.store.set(f"who/{self.rank}", json.dumps(self.me))
            self.store.add(f"beat/{self.rank}", 1)
        self._thread.start()

    def describe(self, rank: int) -> str:
        """``rank 1 (host, pid 123)``, as far as it is known."""
        who = self.me if rank == self.rank else self._who.get(rank)
        if who is None:
            try:
                with self._lock:
                    if self.store.check([f"who/{rank}"]):
                        who = self._who[rank] = json.loads(self.store.get(f"who/{rank}"))
            except Exception:
                who = None
        return f"rank {rank}" + (f" ({who['host']}, pid {who['pid']})" if who else "")

    def verdict(self) -> str | None:
        """Who stopped, once some rank knows (else None)."""
        return self._verdict

    def post(self, message: str, leaving: bool = True) -> None:
        """Tell every rank why the run stops (the first message wins); ``leaving``: this rank
        leaves because of it (the main thread handles its own end)."""
        if leaving:
            self.leaving = True
        try:
            with self._lock:
                self.store.compare_set("verdict", "", message)
        except Exception:
            pass  # the store is gone too: the others learn it from its silence

    def failed(self, error: BaseException) -> None:
        """This rank stops with ``error`` of its own: the others will name it with it."""
        self.post(f"{self.describe(self.rank)} failed: {type(error).__name__}: {error}")

    def explain(self, wait_s: float | None = None) -> str | None:
        """After a collective raised: wait (at most the heartbeat timeout and two beats) for the
        verdict naming the rank that stopped; None when no rank is known to have stopped."""
        self.leaving = True
        deadline = time.monotonic() + (self.timeout_s + 2 * self.interval_s if wait_s is None else wait_s)
        while self._verdict is None and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.05)
        return self._verdict

    def close(self) -> None:
        """This rank finished (or is leaving): say so, so that its silence is not a loss; stop.
        Rank 0 then waits (at most the heartbeat timeout) until every rank said so: without
        torchrun it holds the store, and a rank still finishing must not lose it."""
        self.leaving = True
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 5)
        try:
            with self._lock:
                self.store.set(f"done/{self.rank}", "1")
            deadline = time.monotonic() + self.timeout_s
            while self.rank == 0 and time.monotonic() < deadline:
                with self._lock:
                    if self.store.check(["verdict"]) or self.store.check([f"done/{r}" for r in range(self.world_size)]):
                        return
                time.sleep(0.05)
        except Exception:
            pass  # the store is gone: nothing to tell or wait for

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self._verdict is None:
                try:
                    self._check()
                except Exception as e:
                    self._verdict = (f"lost the rendezvous store at {self.where} ({type(e).__name__}: "
                                     f"{str(e).splitlines()[0] if str(e) else ''}): the process holding it is gone "
                                     "(torchrun's agent on node 0, or rank 0 when launched without torchrun); "
                                     "see node 0's log for the first failure")
            if self._verdict is not None:
                if self._verdict_seen is None:
                    self._verdict_seen = time.monotonic()
                if not self.leaving and time.monotonic() - self._verdict_seen >= self.grace_s:
                    # the main thread is stuck in a collective that will not return: end it here
                    print(f"ember: error: {self._verdict}; this rank stops too (exit 1)", file=sys.stderr, flush=True)
                    self._exit(1)
                    return
                if self.leaving:
                    return

    def _check(self) -> None:
        """One beat, one look at the neighbour and at the shared verdict."""
        with self._lock:
            self.store.add(f"beat/{self.rank}", 1)
            if self.store.check(["verdict"]):
                self._verdict = self.store.get("verdict").decode()
                return
            n = self._neighbour
            if n == self.rank or self.store.check([f"done/{n}"]):
                return
            count = self.store.add(f"beat/{n}", 0)
        lost = self._lost(n, count)
        if lost is not None:
            self.post(lost, leaving=False)
            with self._lock:
                self._verdict = self.store.get("verdict").decode()  # this one, or an earlier one

    def _lost(self, n: int, count: int) -> str | None:
        """Why neighbour ``n`` is lost, or None while it lives."""
        now = time.monotonic()
        if count != self._last[0]:
            self._last = (count, now)
        name = self.describe(n)
        who = self._who.get(n)
        if who is not None and who["pid_space"] and who["pid_space"] == self.me["pid_space"] and process_gone(int(who["pid"])):  # type: ignore[arg-type]
            return f"{name} exited (its process is gone: killed, or crashed without a word)"
        if now - self._last[1] > self.timeout_s:
            return (f"{name} stopped responding: no heartbeat for {now - self._last[1]:.0f} s "
                    f"(distributed.heartbeat_timeout_s={self.timeout_s:g}; its machine or process is gone or hung)")
        return None


def connect(addr: str, port: int, prefix: str, timeout_s: float) -> dist.Store:
    """A connection of this rank's own to the rendezvous store at ``addr:port``, under ``prefix``."""
    store = dist.TCPStore(addr, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.PrefixStore(prefix, store)
