"""What the scoring server serves: one loaded model and its version (``Served``), and the
polling every source shares (``PolledSource``): a background thread calls the source's
``refresh`` every ``poll_s`` seconds until ``stop``.

Two sources build on it: ``ember.serving.server.ModelSource`` (one export directory, reloaded
when its manifest changes) and ``ember.serving.follow.SeriesSource`` (a training run's series
of full and delta exports). Each swaps ``current`` by one reference assignment, so a request
sees one version whole.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from ember.serving.predictor import Predictor

__all__ = ["Served", "PolledSource"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """One loaded export and its version."""

    predictor: Predictor
    version: str


class PolledSource:
    """A served model that a background thread refreshes (``start`` / ``stop``); subclasses
    give ``refresh`` and set ``current``. The poller never dies on an error of ``refresh``: it
    logs it and the served version stays."""

    current: Served
    thread_name = "ember-serve-poll"

    def __init__(self, root: str | Path, poll_s: float, trust_torchscript: bool = False) -> None:
        self.root = Path(root)
        self.poll_s = poll_s
        self.trust_torchscript = trust_torchscript  # every export it loads (``Predictor``)
        self.served = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> bool:
        """Serve a newer version if there is one; True when it did."""
        raise NotImplementedError

    def start(self) -> None:
        """Poll for new exports in the background until ``stop``."""
        def loop() -> None:
            while not self._stop.wait(self.poll_s):
                try:
                    self.refresh()
                except Exception:  # never let the poller die: the served version stays
                    log.exception("serve: following %s failed; still serving version %s", self.root,
                                  self.current.version)

        self._thread = threading.Thread(target=loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
