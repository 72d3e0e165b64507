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
from typing import Callable, Iterable, Iterator, Literal, Sequence

from pydantic import Field

from ember.config_base import ConfigModel
from ember.errors import ConfigError
from ember.source.files import format_suffixes

__all__ = ["WatchOptions", "FileWatcher", "check_watched"]

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


class FileWatcher:
    """The ready files of ``patterns`` not taken yet, in order (``poll``), or as a stream that
    waits for them (``files``). ``taken``: files a previous run already took (never taken again).
    ``clock``: wall-clock seconds, compared with file mtimes (tests replace it)."""

    def __init__(self, patterns: Sequence[str], format: str, options: WatchOptions, taken: Iterable[str] = (),
                 clock: Callable[[], float] = time.time) -> None:
        self.patterns = [os.path.expanduser(p) for p in patterns]
        self.format, self.options, self.clock = format, options, clock
        self._taken = set(taken)

    def poll(self) -> list[str]:
        """List the patterns once: the files ready now and not taken before, in order; they are
        taken (a later poll never returns them again)."""
        o = self.options
        now = self.clock()
        found: list[tuple[float, str]] = []
        marked: dict[str, bool] = {}
        for path in self._listing():
            if path in self._taken:
                continue
            try:
                st = os.stat(path)
            except FileNotFoundError:  # renamed or removed since the listing
                continue
            if o.ready == "settled":
                if now - st.st_mtime < o.settle_s:
                    continue
            else:
                folder = os.path.dirname(path)
                if folder not in marked:
                    marked[folder] = os.path.exists(os.path.join(folder, o.marker))
                if not marked[folder]:
                    continue
            found.append((st.st_mtime_ns if o.order == "mtime" else 0, path))
        found.sort()
        out = [p for _, p in found]
        self._taken.update(out)
        return out

    def files(self, stop: Callable[[], bool] = lambda: False, sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
        """Ready files as they appear: while none is ready, list again every ``poll_s``; end
        after ``idle_timeout_s`` of waiting (counted from when the caller asked for the next
        file, with a last listing at the timeout) or as soon as ``stop()`` (seen within 0.1 s)."""
        o = self.options
        idle = 0.0  # seconds waited since the last file was handed out
        said = False
        while not stop():
            found = self.poll()
            if found:
                idle = 0.0
                yield from found
                continue
            if idle == 0.0 and not said:
                said = True  # once: a stream that keeps up waits after every file
                log.info("data.train: every ready file taken; waiting for new ones (listing every %g s%s)", o.poll_s,
                         "" if o.idle_timeout_s is None else f", ending after {o.idle_timeout_s:g} s without one")
            wait = o.poll_s if o.idle_timeout_s is None else min(o.poll_s, o.idle_timeout_s - idle)
            if wait <= 0:
                log.info("data.train: no new file for %g s (data.watch.idle_timeout_s): the stream ends", idle)
                return
            slept = 0.0
            while slept < wait and not stop():  # short naps: a signal or a closing trainer is seen at once
                nap = min(0.1, wait - slept)
                sleep(nap)
                slept += nap
            idle += slept

    def _listing(self) -> Iterator[str]:
        suffixes = format_suffixes(self.format)
        for pat in self.patterns:
            if os.path.isdir(pat):
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


def check_watched(patterns: Sequence[str]) -> None:
    """Up-front check of watched patterns: a plain path must be an existing directory or file,
    a glob's fixed leading directory must exist (it may match nothing yet). Raises ConfigError
    naming the path."""
    for pat in patterns:
        p = os.path.expanduser(pat)
        where = _fixed_prefix(p) if glob.has_magic(p) else p
        if not os.path.exists(where):
            raise ConfigError(f"data.train '{pat}' (watched: data.watch): {where} does not exist; create the directory "
                              f"the files will appear in, or fix the path (cwd: {os.getcwd()})")
