"""ember.fileio: a write that fails (full disk) leaves the old file or nothing, never a partial one."""

from __future__ import annotations

import errno

import pytest

import ember.fileio as fileio
from ember.errors import CheckpointError, WriteError
from ember.fileio import atomic_dir, atomic_file, write_bytes_atomic


def _no_space(*args, **kwargs):  # type: ignore[no-untyped-def]
    raise OSError(errno.ENOSPC, "No space left on device")


def test_atomic_file_full_disk_keeps_the_old_file_and_names_path_and_bytes(tmp_path, monkeypatch):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    monkeypatch.setattr(fileio, "fsync_dir", _no_space)  # the data is in the temporary file; fsync fails
    with pytest.raises(WriteError) as err:
        write_bytes_atomic(target, b"x" * 1000, WriteError)
    assert str(target) in str(err.value) and "1000 bytes" in str(err.value)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_atomic_file_other_errors_pass_through_and_clean_up(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with atomic_file(tmp_path / "a.txt", WriteError) as tmp:
            tmp.write_text("half")
            1 / 0
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_full_disk_restores_the_old_directory(tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    (out / "keep").write_text("v1")
    with pytest.raises(CheckpointError) as err:
        with atomic_dir(out, CheckpointError, needed=lambda: 4096) as tmp:
            (tmp / "part").write_text("half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert str(out) in str(err.value) and "4096 bytes" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    assert (out / "keep").read_text() == "v1" and not (out / "part").exists()


def test_atomic_dir_replaces_on_success(tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    (out / "old").write_text("1")
    with atomic_dir(out, WriteError) as tmp:
        (tmp / "new").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
