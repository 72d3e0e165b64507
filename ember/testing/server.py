"""``ember serve``'s application on 127.0.0.1 in a thread: what the serving and fuzz tests
score against over real HTTP (FastAPI's TestClient needs a package this environment lacks, and a
real socket is what users hit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["LocalServer"]


class LocalServer:
    """Serves ``app`` on a free port of 127.0.0.1 for the with-block (``url``: its address)."""

    def __init__(self, app: Any, log_level: str = "warning") -> None:
        import uvicorn

        self._uvicorn, self._app, self._log_level = uvicorn, app, log_level
        self.url = ""

    @classmethod
    def for_export(cls, export: str | Path, log_level: str = "warning") -> "LocalServer":
        """What ``ember serve --export`` serves (an export, or a run's export series), not polled."""
        from ember.serving.server import make_app, open_source

        return cls(make_app(open_source(export, poll_s=3600)), log_level)

    def __enter__(self) -> "LocalServer":
        import socket
        import threading
        import time

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.server = self._uvicorn.Server(self._uvicorn.Config(self._app, host="127.0.0.1", port=port,
                                                                log_level=self._log_level))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started and time.time() < deadline:
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def post(self, path: str, body: bytes) -> tuple[int, str]:
        """POST ``body`` as JSON; the status and the answer's text."""
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.url + path, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
