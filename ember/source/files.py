"""Expand path patterns (files, globs, directories) into a sorted, deterministic file list.

A directory is read the way tools write one: only the files whose name ends in a suffix of
the format (``.csv``, ``.csv.gz``, ``.csv.bz2``, ``.csv.zst``, ``.csv.lz4``; ``.tsv...``;
``.parquet``/``.pq``; ``.orc``) are data, so ``README.md``, ``_SUCCESS``, ``.part-0.csv.crc`` or
a ``notes.txt`` beside the data are skipped, named in one log line, and hidden or ``_``
directories (Spark's ``_temporary``) are not entered. A ``.txt`` is read as
CSV/TSV only when asked: name it (the file itself, or a glob such as ``data/*.txt``). A glob
takes every file it matches except hidden and marker files (a name starting with ``.`` or
``_``), unless the glob spells that ``.``/``_`` itself.
"""

from __future__ import annotations

import glob
import logging
import os
import threading
from typing import Sequence

from ember.errors import ConfigError

__all__ = ["expand_paths", "format_suffixes"]

log = logging.getLogger("ember")

_COMPRESSIONS = ("", ".gz", ".bz2", ".zst", ".lz4")  # what pyarrow's CompressedInputStream decodes by extension
_SUFFIXES = {
    "csv": tuple(".csv" + c for c in _COMPRESSIONS),
    "tsv": tuple(".tsv" + c for c in _COMPRESSIONS),
    "parquet": (".parquet", ".pq"),
    "orc": (".orc",),
}
_SHOWN = 8  # skipped files named in the log line
_reported: set[tuple[str, tuple[str, ...]]] = set()  # (pattern, skipped files) already logged
_reported_lock = threading.Lock()


def format_suffixes(format: str) -> tuple[str, ...]:
    """File name suffixes a directory's files of ``format`` end with (lower case)."""
    return _SUFFIXES.get(format, ())


def _hidden(name: str) -> bool:
    """Hidden or marker files tools leave beside data (``.x.crc``, ``_SUCCESS``, ``_metadata``)."""
    return name.startswith((".", "_"))


def _in_directory(pat: str, format: str) -> tuple[list[str], list[str]]:
    """The data files under directory ``pat`` (recursively, hidden directories left out), and
    the other files (skipped)."""
    found, skipped = [], []
    for root, dirs, files in os.walk(pat):
        dirs[:] = [d for d in dirs if not _hidden(d)]
        for f in files:
            path = os.path.join(root, f)
            ok = f.lower().endswith(format_suffixes(format)) and not _hidden(f)
            (found if ok else skipped).append(path)
    return sorted(found), sorted(skipped)


def _in_glob(pat: str) -> tuple[list[str], list[str]]:
    """The files glob ``pat`` matches, less hidden and marker files (unless ``pat`` spells the
    leading ``.`` or ``_`` of that part itself), and those left out."""
    spelled = {part[0] for part in pat.split(os.sep) if part and part[0] in "._"}
    found, skipped = [], []
    for p in sorted(glob.glob(pat, recursive=True)):
        if not os.path.isfile(p):
            continue
        hidden = any(_hidden(part) and part[0] not in spelled for part in p.split(os.sep)[-_depth(pat):])
        (skipped if hidden else found).append(p)
    return found, skipped


def _depth(pat: str) -> int:
    """How many trailing path parts of a match the wildcards of ``pat`` chose."""
    parts = pat.split(os.sep)
    first = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    return len(parts) - first if "**" not in pat else 64


def _log_skipped(pat: str, skipped: list[str], format: str) -> None:
    """One log line per pattern naming the files it holds that were not read."""
    key = (pat, tuple(skipped))
    with _reported_lock:
        if not skipped or key in _reported:
            return
        _reported.add(key)
    names = [os.path.relpath(s, pat) if os.path.isdir(pat) else s for s in skipped]
    shown = ", ".join(names[:_SHOWN]) + (f", ... ({len(names)} in all)" if len(names) > _SHOWN else "")
    if os.path.isdir(pat):
        how = (f"a file is read when its name ends in {'/'.join(format_suffixes(format))}, or when you name it "
               f"(the file, or a glob such as '{_glob_hint(pat, skipped)}')")
    else:
        how = "a glob leaves out hidden and marker files (a name starting with '.' or '_') unless it spells them"
    log.info("data path '%s': skipped %d file(s) that are not %s data (%s); %s", pat, len(skipped), format, shown, how)


def _glob_hint(directory: str, skipped: list[str]) -> str:
    """A glob naming the skipped files of ``directory`` by the extension of the first that has one."""
    for s in skipped:
        name = os.path.basename(s)
        if not _hidden(name) and "." in name:
            return os.path.join(directory, "*" + name[name.index("."):])
    return os.path.join(directory, "*.txt")


def expand_paths(patterns: Sequence[str], format: str) -> list[str]:
    """Files matched by ``patterns``, in order: each pattern's matches sorted by name.

    A directory contributes the files in it (recursively) whose suffix fits ``format``; a glob
    its sorted matches but hidden and marker files; a file itself. Files left out are named in
    one log line. A pattern that matches nothing raises ConfigError.

    Example:
        >>> expand_paths([], "csv")
        []
    """
    out: list[str] = []
    for pat in patterns:
        pat = os.path.expanduser(pat)
        skipped: list[str] = []
        if os.path.isdir(pat):
            found, skipped = _in_directory(pat, format)
        elif glob.has_magic(pat):
            found, skipped = _in_glob(pat)
        else:
            found = [pat] if os.path.isfile(pat) else []
        if not found:
            held = ""
            if skipped:
                names = ", ".join(os.path.basename(s) for s in skipped[:_SHOWN])
                held = (f" (it holds {len(skipped)} other file(s): {names}; a {format} file's name ends in "
                        f"{'/'.join(format_suffixes(format))}: to read others, name them, e.g. with a glob "
                        f"'{_glob_hint(pat, skipped)}')" if os.path.isdir(pat) else
                        f" (only hidden or marker files: {names})")
            raise ConfigError(f"data path '{pat}' matches no {format} file{held}; check the path (cwd: {os.getcwd()})")
        _log_skipped(pat, skipped, format)
        out.extend(f for f in found if f not in out)
    return out
