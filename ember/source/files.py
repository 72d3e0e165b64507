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
from typing import Sequence

from ember.errors import ConfigError
from ember.source import storage
from ember.source.storage import StorageOptions
from ember import once

__all__ = ["expand_listed", "expand_paths", "expand_sized", "format_suffixes", "with_sizes"]

log = logging.getLogger("ember")
_Found = tuple[str, int | None]  # a file, and its size in bytes where a listing gave it (else None)

_COMPRESSIONS = ("", ".gz", ".bz2", ".zst", ".lz4")  # what pyarrow's CompressedInputStream decodes by extension
_SUFFIXES = {
    "csv": tuple(".csv" + c for c in _COMPRESSIONS),
    "tsv": tuple(".tsv" + c for c in _COMPRESSIONS),
    "parquet": (".parquet", ".pq"),
    "orc": (".orc",),
}
_SHOWN = 8  # skipped files named in the log line


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


def _held(pat: str, skipped: list[str], format: str, is_dir: bool) -> str:
    """What a pattern that matched nothing holds instead, for its error."""
    if not skipped:
        return ""
    names = ", ".join(s.rsplit("/", 1)[-1] for s in skipped[:_SHOWN])
    if is_dir:
        return (f" (it holds {len(skipped)} other file(s): {names}; a {format} file's name ends in "
                f"{'/'.join(format_suffixes(format))}: to read others, name them, e.g. with a glob "
                f"'{_glob_hint(pat, skipped)}')")
    return f" (only hidden or marker files: {names})"


def _log_skipped(pat: str, skipped: list[str], format: str, is_dir: bool) -> None:
    """One log line per pattern naming the files it holds that were not read."""
    if not skipped or not once.first("files.skipped", (pat, tuple(skipped))):
        return
    names = [(s[len(pat.rstrip("/")) + 1:] if storage.is_remote(pat) else os.path.relpath(s, pat)) if is_dir else s
             for s in skipped]
    shown = ", ".join(names[:_SHOWN]) + (f", ... ({len(names)} in all)" if len(names) > _SHOWN else "")
    if is_dir:
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


def _remote(pat: str, format: str, options: StorageOptions | None) -> tuple[list[_Found], list[str], bool]:
    """``_in_directory`` / ``_in_glob`` / a file, for a URI: (found, skipped, is a directory);
    each found object with its size where a listing gave it (None for an object named alone)."""
    pat = pat.rstrip("/") if not pat.endswith("://") else pat
    scheme, rest = storage.split_uri(pat)
    if not glob.has_magic(rest):
        kind = storage.stat(pat, options)
        if kind == "file":
            return [(pat, None)], [], False
        if kind is None:
            return [], [], False
        found, skipped = [], []
        for e in storage.walk(pat, options):
            parts = e.uri[len(pat):].lstrip("/").split("/")
            if any(_hidden(d) for d in parts[:-1]):  # a hidden or marker directory is not entered
                continue
            if parts[-1].lower().endswith(format_suffixes(format)) and not _hidden(parts[-1]):
                found.append((e.uri, e.size))
            else:
                skipped.append(e.uri)
        return found, skipped, True
    parts = rest.split("/")
    first = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    root = f"{scheme}://" + "/".join(parts[:first])
    depth = len(parts) - first if "**" not in rest else 64
    spelled = {part[0] for part in parts if part and part[0] in "._"}
    found, skipped = [], []
    for e in storage.walk(root, options):
        got = storage.split_uri(e.uri)[1].split("/")
        if not storage.match_glob(parts, got):
            continue
        if any(_hidden(part) and part[0] not in spelled for part in got[-depth:]):
            skipped.append(e.uri)
        else:
            found.append((e.uri, e.size))
    return found, skipped, False


def expand_paths(patterns: Sequence[str], format: str, storage_options: StorageOptions | None = None,
                 what: str = "the data paths") -> list[str]:
    """Files matched by ``patterns``, in order: each pattern's matches sorted by name (``what``:
    where the patterns were given, for messages, e.g. ``data.train``).

    A directory contributes the files in it (recursively) whose suffix fits ``format``; a glob
    its sorted matches but hidden and marker files; a file itself. Files left out are named in
    one log line. A pattern that matches nothing raises ConfigError, as does a file that two
    patterns name (compared by real path; a URI as it is). A URI (``s3://...``) is listed
    through its filesystem, reached with ``storage_options``.

    Example:
        >>> expand_paths([], "csv")
        []
    """
    return [f for f, _ in _expand(patterns, format, storage_options, what)]


def expand_sized(patterns: Sequence[str], format: str, storage_options: StorageOptions | None = None,
                 what: str = "the data paths") -> list[tuple[str, int]]:
    """``expand_paths``'s files, each with its size in bytes: for objects found by listing a
    prefix or a glob, the listing's (no request per object); else the file's or object's own."""
    return with_sizes(_expand(patterns, format, storage_options, what), storage_options)


def with_sizes(found: Sequence[tuple[str, int | None]], storage_options: StorageOptions | None = None) -> list[tuple[str, int]]:
    """``expand_listed``'s files with every size filled in: the listing's where it gave one, else
    the file's or object's own (one request each)."""
    return [(f, size if size is not None else storage.file_size(f, storage_options)) for f, size in found]


def expand_listed(patterns: Sequence[str], format: str, storage_options: StorageOptions | None = None,
                  what: str = "the data paths") -> list[tuple[str, int | None]]:
    """``expand_paths``' files, each with its size where a listing of a prefix or a glob gave
    it, else None (no request made for it: ``storage.file_size`` when needed)."""
    return _expand(patterns, format, storage_options, what)


def _expand(patterns: Sequence[str], format: str, storage_options: StorageOptions | None,
            what: str) -> list[_Found]:
    """``expand_paths``' work: each file with its size where a listing gave it, else None."""
    out: list[_Found] = []
    named: dict[str, tuple[int, str, str]] = {}  # a file (its real path, or the URI) -> the pattern that named it

    def add(i: int, pat: str, found: list[_Found]) -> None:
        """``found`` into ``out``: ConfigError when an earlier pattern named a file too (so
        ``[t.csv, ./t.csv]`` never reads it twice an epoch, nor ``[t.csv, t.csv]`` once)."""
        for f, size in found:
            key = f if storage.is_remote(f) else os.path.realpath(f)
            if key in named and named[key][0] != i:
                _, first_pat, first = named[key]
                raise ConfigError(f"{what}: the file {first!r} is named twice, {_as(first_pat, first)} and "
                                  f"{_as(pat, f)}; name each file once (a directory or glob names every file it "
                                  "matches)")
            named.setdefault(key, (i, pat, f))
            out.append((f, size))

    for i, pat in enumerate(patterns):
        if storage.is_remote(pat):
            found, skipped, is_dir = _remote(pat, format, storage_options)
            if not found:
                scheme, rest = storage.split_uri(pat)
                storage.stat(f"{scheme}://{rest.split('/', 1)[0]}", storage_options)  # a missing bucket raises
                if not is_dir and not skipped and not glob.has_magic(rest):
                    raise ConfigError(f"data path '{pat}': no such object (nor a prefix holding objects) in bucket "
                                      f"'{rest.split('/', 1)[0]}'; check the key (a directory is a prefix: "
                                      f"'{pat.rstrip('/').rsplit('/', 1)[0]}/' lists what is there)")
                raise ConfigError(f"data path '{pat}' matches no {format} file{_held(pat, skipped, format, is_dir)}; "
                                  "check the path (objects are listed by key prefix: a directory is a prefix "
                                  "ending in '/')")
            _log_skipped(pat, skipped, format, is_dir)
            add(i, pat, found)
            continue
        pat = os.path.expanduser(pat)
        skipped = []
        if os.path.isdir(pat):
            found, skipped = _in_directory(pat, format)
        elif glob.has_magic(pat):
            found, skipped = _in_glob(pat)
        else:
            found = [pat] if os.path.isfile(pat) else []
        if not found:
            held = _held(pat, skipped, format, os.path.isdir(pat))
            raise ConfigError(f"data path '{pat}' matches no {format} file{held}; check the path (cwd: {os.getcwd()})")
        _log_skipped(pat, skipped, format, os.path.isdir(pat))
        add(i, pat, [(f, None) for f in found])
    return out


def _as(pattern: str, file: str) -> str:
    """How a data path named a file: ``'t.csv'``, or ``'data/' (as 'data/t.csv')``."""
    return repr(pattern) if pattern == file else f"{pattern!r} (as {file!r})"
