"""A watched ``data.train``: the files of its directories and globs in arrival order, each once,
as they appear and are complete (``data.watch``; ``train.mode: online`` trains on them).

- Listing: each poll lists the patterns again: a directory gives the files under it (recursively)
  whose suffix fits the format, a glob its matches, a path the file itself. Names starting with
  ``.`` or ``_`` (and directories so named below a directory or a glob's fixed part, e.g.
  Spark's ``_temporary``) are never taken: they are files still being written under a
  temporary name (and markers such as ``_SUCCESS``).
- Complete (``ready``): ``settled`` (default) takes a file once it has not been modified for
  ``settle_s`` seconds (its mtime against this machine's clock); ``marker`` takes a file once its
  directory holds a file named ``marker`` (Hadoop / Spark / Hive's ``_SUCCESS``: a partition
  directory is complete). Writers that write under a temporary name and rename the complete file
  into place are safe under either (and under ``settled`` with ``settle_s: 0``).
- Order: each poll's newly ready files by modification time, then name (``order: mtime``), or by
  name (``order: name``), after every file taken before: a late file with an older mtime is read
  when it is found, never skipped.
- End: after ``idle_timeout_s`` with no new file (None: never), or when the caller's ``stop()``
  says so (a signal, the trainer closing the pipeline).

A pattern may be a URI of object storage (``s3://bucket/incoming/``, a glob of keys): each poll
lists the prefix (one listing request per 1,000 keys) and an object's modification time is its
upload's. An object appears only once its upload completed, so ``settle_s: 0`` is safe there.

Which files were taken is the caller's to record (``ember.pipeline.stream``: the checkpoint's
stream position), so a resumed run is seeded with them (``taken``) and takes each file once.

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "b.csv").write_text("x\\n1\\n"); _ = (d / "a.csv").write_text("x\\n2\\n")
    >>> _ = (d / ".c.csv").write_text("x\\n3\\n")  # still being written: hidden name
    >>> w = FileWatcher([str(d)], "csv", WatchOptions(settle_s=0, order="name"))
    >>> [pathlib.Path(p).name for p in w.poll()], w.poll()
    (['a.csv', 'b.csv'], [])
"""

from __future__ import annotations

import glob
import logging
import os
import time
from typing import Callable, Iterable, Iterator, Literal, Sequence, TypeVar

from pydantic import Field

from ember.config_base import ConfigModel
from ember.errors import ConfigError
from ember.source import storage
from ember.source.files import format_suffixes
from ember.source.storage import StorageOptions

__all__ = ["WatchOptions", "FileWatcher", "check_watched", "polled"]

T = TypeVar("T")

log = logging.getLogger("ember")


class WatchOptions(ConfigModel):
    """``data.watch``: ``data.train`` is watched for new files (see the module docstring)."""

    poll_s: float = Field(5.0, gt=0)
    """Seconds between listings while no ready file is waiting (a listing walks the directories)."""
    idle_timeout_s: float | None = Field(None, gt=0)
    """End the stream after this many seconds with no new ready file; None: watch until
    ``train.max_steps`` or a signal."""
    ready: Literal["settled", "marker"] = "settled"
    """When a file is complete: ``settled`` (unmodified for ``settle_s``) or ``marker`` (its
    directory holds ``marker``)."""
    settle_s: float = Field(5.0, ge=0)
    """``settled``: seconds a file must stay unmodified; 0 when files only appear by rename."""
    marker: str = Field("_SUCCESS", min_length=1)
    """``marker``: the file name that marks a directory's files complete."""
    order: Literal["mtime", "name"] = "mtime"
    """Order of the files found ready by one poll: modification time then name, or name."""


def polled(poll: Callable[[], list[T]], o: WatchOptions, stop: Callable[[], bool] = lambda: False,
           sleep: Callable[[float], None] = time.sleep, what: str = "ready file") -> Iterator[T]:
    """What ``poll()`` finds, as it appears: while it finds nothing, poll again every
    ``o.poll_s``; end after ``o.idle_timeout_s`` of waiting (counted from when the caller asked
    for the next, with a last poll at the timeout) or as soon as ``stop()`` (seen within 0.1 s).
    ``what`` names one item in the log lines (a watched table's sources use it too)."""
    idle = 0.0  # seconds waited since the last item was handed out
    said = False
    while not stop():
        found = poll()
        if found:
            idle = 0.0
            yield from found
            continue
        if idle == 0.0 and not said:
            said = True  # once: a stream that keeps up waits after every item
            log.info("data.train: every %s taken; waiting for new ones (listing every %g s%s)", what, o.poll_s,
                     "" if o.idle_timeout_s is None else f", ending after {o.idle_timeout_s:g} s without one")
        wait = o.poll_s if o.idle_timeout_s is None else min(o.poll_s, o.idle_timeout_s - idle)
        if wait <= 0:
            log.info("data.train: no new %s for %g s (data.watch.idle_timeout_s): the stream ends", what, idle)
            return
        slept = 0.0
        while slept < wait and not stop():  # short naps: a signal or a closing trainer is seen at once
            nap = min(0.1, wait - slept)
            sleep(nap)
            slept += nap
        idle += slept


class FileWatcher:
    """The ready files of ``patterns`` not taken yet, in order (``poll``), or as a stream that
    waits for them (``files``). ``taken``: files a previous run already took (never taken again).
    ``clock``: wall-clock seconds, compared with file mtimes (tests replace it).
    ``storage_options``: how to reach patterns given as URIs."""

    def __init__(self, patterns: Sequence[str], format: str, options: WatchOptions, taken: Iterable[str] = (),
                 clock: Callable[[], float] = time.time, storage_options: StorageOptions | None = None) -> None:
        self.patterns = [p if storage.is_remote(p) else os.path.expanduser(p) for p in patterns]
        self.format, self.options, self.clock = format, options, clock
        self.storage_options = storage_options
        self._taken = set(taken)

    def poll(self) -> list[str]:
        """List the patterns once: the files ready now and not taken before, in order; they are
        taken (a later poll never returns them again)."""
        o = self.options
        now = self.clock()
        found: list[tuple[float, str]] = []
        marked: dict[str, bool] = {}
        listed: dict[str, int] = {}  # URIs listed with their mtimes: no request per object
        for path, mtime_ns in self._entries(listed):
            if path in self._taken:
                continue
            if o.ready == "settled":
                if now - mtime_ns / 1e9 < o.settle_s:
                    continue
            else:
                folder = path.rsplit("/", 1)[0] if storage.is_remote(path) else os.path.dirname(path)
                if folder not in marked:
                    marker = f"{folder}/{o.marker}"
                    marked[folder] = marker in listed or storage.is_file(marker, self.storage_options) \
                        if storage.is_remote(path) else os.path.exists(os.path.join(folder, o.marker))
                if not marked[folder]:
                    continue
            found.append((mtime_ns if o.order == "mtime" else 0, path))
        found.sort()
        out = [p for _, p in found]
        self._taken.update(out)
        return out

    def files(self, stop: Callable[[], bool] = lambda: False, sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
        """Ready files as they appear: while none is ready, list again every ``poll_s``; end
        after ``idle_timeout_s`` of waiting (counted from when the caller asked for the next
        file, with a last listing at the timeout) or as soon as ``stop()`` (seen within 0.1 s)."""
        return polled(self.poll, self.options, stop, sleep, "ready file")

    def _entries(self, listed: dict[str, int]) -> Iterator[tuple[str, int]]:
        """(path, mtime in ns) of each listed file; ``listed`` collects every object a remote
        listing saw (markers included)."""
        for path in self._listing(listed):
            if storage.is_remote(path):
                yield path, listed[path]
                continue
            try:
                st = os.stat(path)
            except FileNotFoundError:  # renamed or removed since the listing
                continue
            yield path, st.st_mtime_ns

    def _remote(self, pat: str, listed: dict[str, int]) -> Iterator[str]:
        """A URI pattern's objects, as ``_listing`` takes local files."""
        suffixes = format_suffixes(self.format)
        scheme, rest = storage.split_uri(pat)
        magic = glob.has_magic(rest)
        parts = rest.rstrip("/").split("/")
        first = next((i for i, p in enumerate(parts) if glob.has_magic(p)), len(parts))
        root = f"{scheme}://" + "/".join(parts[:first])
        kind = None if magic else storage.stat(pat, self.storage_options)
        if kind == "file":
            entries = [e for e in storage.walk(root.rsplit("/", 1)[0], self.storage_options) if e.uri == root]
        else:
            entries = storage.walk(root, self.storage_options)
        for e in entries:
            listed[e.uri] = e.mtime_ns
            below = e.uri[len(root):].lstrip("/").split("/")
            if any(part.startswith((".", "_")) for part in below if part):
                continue
            if magic:
                if storage.match_glob(parts, storage.split_uri(e.uri)[1].split("/")):
                    yield e.uri
            elif kind == "file" or e.uri.rsplit("/", 1)[-1].lower().endswith(suffixes):
                yield e.uri

    def _listing(self, listed: dict[str, int]) -> Iterator[str]:
        suffixes = format_suffixes(self.format)
        for pat in self.patterns:
            if storage.is_remote(pat):
                yield from self._remote(pat, listed)
            elif os.path.isdir(pat):
                for root, dirs, names in os.walk(pat):
                    dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
                    for name in names:
                        if name.lower().endswith(suffixes) and not name.startswith((".", "_")):
                            yield os.path.join(root, name)
            elif glob.has_magic(pat):
                root = _fixed_prefix(pat)
                for p in glob.glob(pat, recursive=True):
                    parts = os.path.relpath(p, root).split(os.sep)  # below the fixed part: no hidden name
                    if not any(part.startswith((".", "_")) for part in parts) and os.path.isfile(p):
                        yield p
            elif os.path.isfile(pat):
                yield pat


def _fixed_prefix(pattern: str) -> str:
    """The directory a glob starts from: its leading components without wildcards."""
    parts = pattern.split(os.sep)
    first = next(i for i, p in enumerate(parts) if glob.has_magic(p))
    return os.sep.join(parts[:first]) or ("/" if pattern.startswith(os.sep) else ".")


def check_watched(patterns: Sequence[str], storage_options: StorageOptions | None = None) -> None:
    """Up-front check of watched patterns: a plain path must be an existing directory or file,
    a glob's fixed leading directory must exist (it may match nothing yet); a URI's bucket must
    exist and be readable (its prefix may hold nothing yet). Raises ConfigError naming the path."""
    for pat in patterns:
        if storage.is_remote(pat):
            scheme, rest = storage.split_uri(pat)
            fixed = rest.split("/")
            first = next((i for i, p in enumerate(fixed) if glob.has_magic(p)), len(fixed))
            storage.stat(f"{scheme}://" + "/".join(fixed[:first]), storage_options)  # a missing bucket, a denial: raises
            continue
        p = os.path.expanduser(pat)
        where = _fixed_prefix(p) if glob.has_magic(p) else p
        if not os.path.exists(where):
            raise ConfigError(f"data.train '{pat}' (watched: data.watch): {where} does not exist; create the directory "
                              f"the files will appear in, or fix the path (cwd: {os.getcwd()})")
