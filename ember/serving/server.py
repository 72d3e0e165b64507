"""A scoring server over HTTP (FastAPI + uvicorn, the ``serve`` extra) that follows an export
directory and swaps in each new export without a restart.

- ``POST /score`` with ``{"rows": [{column: value, ...}, ...]}`` returns
  ``{"version": V, "tasks": [...], "scores": [[p, ...], ...]}``: one probability per task per row,
  rows featurized by the export's own schema exactly as ``ember predict`` does.
- ``GET /health`` returns ``{"status": "ok", "version": V, "export": PATH, "served": N}``.
- Swaps: a background thread polls the export's ``manifest.json`` (every ``poll_s`` seconds);
  when it changes, the new export is loaded and verified completely, then replaces the served
  one in a single reference assignment. A request takes the model once when it starts, so it is
  scored by the model before or after a swap, never by half of each; its response names that
  model's version (the export's manifest digest, and its step when recorded). A new export that
  fails to load is logged and the served one stays.
- Follow mode: ``--export`` naming a training run's export series (``<run>/exports``, written
  with ``export.every_steps`` / ``every_s``) serves its newest full export and applies each
  delta export as it appears, atomically (``ember.serving.follow.SeriesSource``); the version is
  the export's name (``000007-delta``).
- Bad requests get a 4xx with a message and never stop the server: 413 for a body over
  ``max_body_bytes``, 400 for a body that is not JSON or lacks ``rows`` (a list of objects), 422
  for a row the export cannot score: ``{"error": message, "row": i, "column": name, "reason":
  why}`` (``row``: the 0-based index in ``rows``), e.g. 4.5 in an integer-ID column, a boolean,
  list or object where a scalar belongs, or a column the export does not read (with a "did you
  mean"). Each value is first brought to its column's type in training
  (``ember.featurize.canonical``): ``{"C3": 4}``, ``{"C3": 4.0}`` and ``{"C3": "4"}`` score alike.
"""


import errno
import hashlib
import json
import logging
import socket
from pathlib import Path
from typing import Any, Callable

from ember.errors import ConfigError, DataError, Diverged, EmberError, SchemaError
from ember.featurize.canonical import BadValue
from ember.serving.predictor import Predictor
from ember.serving.source import PolledSource, Served

__all__ = ["ModelSource", "Served", "make_app", "serve", "bind", "open_source"]

log = logging.getLogger(__name__)


def _version(root: Path) -> str:
    manifest = (root / "manifest.json").read_bytes()
    try:
        parsed = json.loads(manifest)
    except ValueError:  # damaged: its version is its digest (Predictor.load says what is wrong)
        parsed = None
    step = parsed.get("step") if isinstance(parsed, dict) else None
    digest = hashlib.sha256(manifest).hexdigest()[:12]
    return f"{step}-{digest}" if step is not None else digest


class ModelSource(PolledSource):
    """The export being served, swapped atomically when its manifest changes."""

    def __init__(self, export: str | Path, poll_s: float = 2.0, trust_torchscript: bool = False) -> None:
        super().__init__(export, poll_s, trust_torchscript)
        self.current = Served(Predictor.load(self.root, trust_torchscript=trust_torchscript), _version(self.root))
        self._refused: str | None = None  # the version whose load failed last (its warning said once)

    def refresh(self) -> bool:
        """Load the export again if its manifest changed; True when a new model is served."""
        version = None
        try:
            version = _version(self.root)
            if version == self.current.version:
                return False
            fresh = Served(Predictor.load(self.root, trust_torchscript=self.trust_torchscript), version)  # verified first
        except (OSError, ValueError, EmberError) as e:  # half-written or damaged: keep serving the old one
            if version is None or version != self._refused:  # said once per version, tried again every poll
                log.warning("serve: export %s could not be loaded (%s); still serving version %s",
                            self.root, e, self.current.version)
            self._refused = version
            return False
        self.current = fresh  # one reference assignment: each request sees the old or the new model
        log.info("serve: now serving version %s", version)
        return True


class _DuplicateKey(ValueError):
    """A JSON object giving one key twice (JSON parsers keep the last: a row would silently lose a value)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' objects, refusing a key given twice."""
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))  # type: ignore[func-returns-value]
    return d


def make_app(source: ModelSource, max_body_bytes: int = 1 << 20) -> Any:
    """The FastAPI application serving ``source``."""
    try:
        from fastapi import FastAPI, Request
        from fastapi.responses import Response
        from starlette.concurrency import run_in_threadpool
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ConfigError("ember serve needs FastAPI and uvicorn: pip install 'ember[serve]'") from e

    app = FastAPI(title="ember scoring server")

    def error(status: int, message: str, **where: Any) -> Any:
        # ASCII JSON: a message quotes the request's text, which may not be encodable as UTF-8 (a
        # lone surrogate from a "\\ud800" escape): escaped, it is answered instead of a 500
        return Response(json.dumps({"error": message, **where}), status_code=status, media_type="application/json")

    @app.get("/health")
    def health() -> dict[str, Any]:
        cur = source.current
        info = source.info() if hasattr(source, "info") else {}
        return {"status": "ok", "version": cur.version, "export": str(source.root), "served": source.served, **info}

    @app.post("/score")
    async def score(request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            return error(413, f"request body of {declared} bytes is over the limit of {max_body_bytes}")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body_bytes:
                return error(413, f"request body is over the limit of {max_body_bytes} bytes")
        try:
            payload = json.loads(body, object_pairs_hook=_unique_keys)
        except _DuplicateKey as e:
            return error(400, f"an object in the body gives the key {e.args[0]!r} twice; give each column once")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return error(400, f"the body is not JSON: {e}")
        except ValueError:  # (Python reads integers of at most sys.get_int_max_str_digits() digits)
            return error(400, "the body holds a number of thousands of digits, which no column can hold; send "
                              "IDs of at most 19 digits (or as strings), numbers within the float range")
        except RecursionError:  # (Python's parser recurses per nesting level)
            return error(400, "the body is JSON nested too deeply to read; send "
                              '{"rows": [{"column": value, ...}, ...]} with plain values')
        rows = payload.get("rows") if isinstance(payload, dict) else None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            return error(400, 'expected {"rows": [{"column": value, ...}, ...]}')
        unknown = sorted(k for k in payload if k != "rows")
        if unknown:  # (a misspelt option would otherwise be ignored without a word)
            return error(400, f"unknown key(s) {unknown} in the body; it holds only \"rows\"")
        cur = source.current  # this request's model, whatever swaps happen meanwhile
        try:
            probs = await run_in_threadpool(cur.predictor.predict_records, rows)  # off the event loop
        except BadValue as e:
            return error(422, str(e), row=e.row, column=e.column, reason=e.reason)
        except (DataError, SchemaError) as e:  # bad input is never a 5xx
            return error(422, str(e))
        except Diverged as e:  # the export's weights are not finite: the server's fault, said plainly
            return error(500, str(e))
        source.served += len(rows)
        return {"version": cur.version, "tasks": cur.predictor.tasks, "scores": probs.tolist()}

    return app


def serve(export: str | Path, host: str = "127.0.0.1", port: int = 8000, poll_s: float = 2.0,
          max_body_bytes: int = 1 << 20, on_ready: Callable[[str, int], None] | None = None,
          trust_torchscript: bool = False) -> None:
    """Run the server until interrupted (``ember serve``).

    The export is opened and the port bound before anything is served, so a bad export or a
    busy port is a ConfigError at once; then ``on_ready(host, port)`` (the port bound: ``port``
    0 picks a free one) announces it and requests are served on that socket.
    ``trust_torchscript``: see ``Predictor``.
    """
    try:
        import uvicorn
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ConfigError("ember serve needs FastAPI and uvicorn: pip install 'ember[serve]'") from e
    source = open_source(export, poll_s, trust_torchscript)
    sock = bind(host, port)
    try:
        source.start()
        try:
            if on_ready is not None:
                on_ready(host, sock.getsockname()[1])
            server = uvicorn.Server(uvicorn.Config(make_app(source, max_body_bytes), host=host, port=port,
                                                   log_level="warning"))
            server.run(sockets=[sock])
        finally:
            source.stop()
    finally:
        sock.close()


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening (as uvicorn binds one: SO_REUSEADDR,
    inheritable, its backlog), so a client that connects once the server is announced waits in
    the backlog instead of being refused; ConfigError naming the port when another process holds
    it, or the host when it is not an address of this machine."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise ConfigError(f"--host {host} does not resolve to an address ({e.strerror}); give an address of this "
                          "machine, e.g. 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # uvicorn's default backlog
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is in use; pick another with --port") from None
        if e.errno == errno.EACCES:
            raise ConfigError(f"port {port} on {host} needs privileges this process lacks (ports below 1024 do); "
                              "pick another with --port, e.g. 8000") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(f"--host {host} is not an address of this machine; give one of its addresses, e.g. "
                              "127.0.0.1 (this machine only) or 0.0.0.0 (every interface)") from None
        raise
    sock.set_inheritable(True)
    return sock


def open_source(export: str | Path, poll_s: float = 2.0, trust_torchscript: bool = False) -> Any:
    """What ``--export`` names: an export directory (``ModelSource``), or a training run's
    export series of full and delta exports (``SeriesSource``, follow mode)."""
    root = Path(export)
    if (root / "manifest.json").exists():
        return ModelSource(root, poll_s, trust_torchscript)
    if not root.is_dir():
        raise ConfigError(f"--export {root}: no such directory; give an export directory or a run's exports/ directory")
    from ember.serving.follow import SeriesSource

    return SeriesSource(root, poll_s, trust_torchscript)
