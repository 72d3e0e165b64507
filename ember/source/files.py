"""Expand path patterns (files, globs, directories) into a sorted, deterministic file list."""

from __future__ import annotations

import glob
import os
from typing import Sequence

from ember.errors import ConfigError

__all__ = ["expand_paths", "format_suffixes"]

_SUFFIXES = {
    "csv": (".csv", ".csv.gz", ".csv.bz2", ".txt", ".txt.gz"),
    "tsv": (".tsv", ".tsv.gz", ".tsv.bz2", ".txt", ".txt.gz"),
    "parquet": (".parquet", ".pq"),
    "orc": (".orc",),
}


def format_suffixes(format: str) -> tuple[str, ...]:
    """File name suffixes a directory's files of ``format`` end with (lower case)."""
    return _SUFFIXES.get(format, ())


def expand_paths(patterns: Sequence[str], format: str) -> list[str]:
    """Files matched by ``patterns``, in order: each pattern's matches sorted by name.

    A directory contributes the files in it (recursively) whose suffix fits ``format``; a glob
    its sorted matches; a file itself. A pattern that matches nothing raises ConfigError.

    Example:
        >>> expand_paths([], "csv")
        []
    """
    out: list[str] = []
    for pat in patterns:
        pat = os.path.expanduser(pat)
        if os.path.isdir(pat):
            found = sorted(
                os.path.join(root, f)
                for root, _, files in os.walk(pat)
                for f in files
                if f.lower().endswith(format_suffixes(format)) and not f.startswith((".", "_"))
            )
        elif glob.has_magic(pat):
            found = sorted(p for p in glob.glob(pat, recursive=True) if os.path.isfile(p))
        else:
            found = [pat] if os.path.isfile(pat) else []
        if not found:
            raise ConfigError(f"data path '{pat}' matches no {format} file; check the path (cwd: {os.getcwd()})")
        out.extend(f for f in found if f not in out)
    return out
