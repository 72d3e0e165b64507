"""Writing output files so that a failure never leaves a partial file where a good one is expected.

Every writer (checkpoints, exports, predictions, metrics, the disk tier's files) writes under a
temporary name beside its target, fsyncs, and renames; on any error the temporary is removed.
A full disk (``ENOSPC`` / ``EDQUOT``) becomes the caller's ember error naming the path, the bytes
the write needed and the bytes free, instead of a bare ``OSError`` and a truncated file.

Example:
    >>> import tempfile
    >>> from ember.errors import WriteError
    >>> p = Path(tempfile.mkdtemp()) / "out.txt"
    >>> with atomic_file(p, WriteError, needed=2) as tmp:
    ...     _ = tmp.write_bytes(b"ok")
    >>> p.read_bytes(), sorted(x.name for x in p.parent.iterdir())
    (b'ok', ['out.txt'])
"""

from __future__ import annotations

import errno
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Union

from ember.errors import EmberError

__all__ = ["is_no_space", "no_space_error", "atomic_file", "atomic_dir", "write_bytes_atomic", "fsync_dir",
           "free_bytes", "fmt_bytes", "nearest_existing"]

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
Needed = Union[int, Callable[[], int], None]  # bytes a write needs; a callable is asked only on failure


def is_no_space(e: BaseException) -> bool:
    """Whether ``e`` says the disk (or the user's quota) is full."""
    return isinstance(e, OSError) and e.errno in _NO_SPACE


def fmt_bytes(b: int) -> str:
    """``1536`` -> ``'1.50 KiB'``: sizes in messages."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{b / size:.2f} {unit}"
    return f"{b} B"


def nearest_existing(path: str | os.PathLike) -> Path:
    """``path`` itself or its nearest existing parent: where a file at ``path`` would live."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def free_bytes(path: str | os.PathLike) -> int:
    """Free bytes on the volume that holds ``path`` (or would hold it: its nearest existing parent)."""
    return shutil.disk_usage(nearest_existing(path)).free


def no_space_error(error: type[EmberError], path: str | os.PathLike, needed: Needed, cause: OSError,
                   hint: str = "") -> EmberError:
    """The ``error`` for a write of ``needed`` bytes (None: unknown) to ``path`` that ran out of disk."""
    if callable(needed):
        needed = needed()
    try:
        free = fmt_bytes(free_bytes(path))
    except OSError:
        free = "unknown"
    need = f"needed about {fmt_bytes(needed)} ({needed} bytes)" if needed is not None else "size needed unknown"
    return error(f"{path}: no space left on device ({cause.strerror or cause}); the write {need}, {free} is free "
                 f"there; nothing was left behind. Free space or write elsewhere{hint and '; ' + hint}")


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory (so a rename in it survives a crash), or a file by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


@contextmanager
def atomic_file(path: str | os.PathLike, error: type[EmberError], needed: Needed = None,
                hint: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends, fsync it and rename it onto
    ``path``. On any error the temporary is removed (``path`` keeps its old content, if any); a
    full disk raises ``error`` naming ``path`` and ``needed`` bytes."""
    final = Path(path)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        fsync_dir(tmp)  # the file's own data, by path
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except BaseException as e:
        _remove(tmp)
        if is_no_space(e):
            raise no_space_error(error, final, needed, e, hint) from e  # type: ignore[arg-type]
        raise


@contextmanager
def atomic_dir(path: str | os.PathLike, error: type[EmberError], needed: Needed = None,
               hint: str = "") -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``path``; when the block ends, put it in place of
    ``path`` (an old ``path`` is moved aside first and deleted only after the rename). On any
    error the temporary directory is removed; a full disk raises ``error`` naming ``path``."""
    final = Path(path)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    _remove(tmp)
    try:
        tmp.mkdir(parents=True)
        yield tmp
        fsync_dir(tmp)
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
        fsync_dir(final.parent)
    except BaseException as e:
        _remove(tmp)
        if old.exists() and not final.exists():  # put the old one back
            os.rename(old, final)
        if is_no_space(e):
            raise no_space_error(error, final, needed, e, hint) from e  # type: ignore[arg-type]
        raise
    _remove(old)


def write_bytes_atomic(path: str | os.PathLike, data: bytes, error: type[EmberError], hint: str = "") -> None:
    """Replace ``path`` with ``data`` (temporary name, fsync, rename); see :func:`atomic_file`."""
    with atomic_file(path, error, len(data), hint) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
