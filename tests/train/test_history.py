"""History on a full disk: metrics.jsonl never ends in half a record, metrics.png is never half a PNG."""

from __future__ import annotations

import errno
import json

import pytest

import ember.fileio as fileio
import ember.train.history as history_mod
from ember.errors import WriteError
from ember.train.history import History


def test_log_on_a_full_disk_cuts_the_half_record_off(tmp_path, monkeypatch):
    h = History(tmp_path)
    h.log({"kind": "train", "step": 1, "loss": 0.5})
    good = h.path.read_bytes()
    real_write, calls = history_mod.os.write, []

    def write(fd, data):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:  # a short write: half the record reaches the file
            return real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(history_mod.os, "write", write)
    record = {"kind": "train", "step": 2, "loss": 0.25}
    with pytest.raises(WriteError) as err:
        h.log(record)
    monkeypatch.undo()
    assert str(h.path) in str(err.value) and f"({len(json.dumps(record)) + 1} bytes)" in str(err.value)
    assert h.path.read_bytes() == good and len(h.records) == 1
    h.log(record)  # space again: the history goes on, every line whole
    assert [json.loads(x)["step"] for x in h.path.read_text().splitlines()] == [1, 2]


def test_plot_on_a_full_disk_keeps_the_previous_plot(tmp_path, monkeypatch):
    h = History(tmp_path)
    h.log({"kind": "train", "step": 1, "loss": 0.5})
    h.plot()
    before = h.plot_path.read_bytes()
    h.log({"kind": "train", "step": 2, "loss": 0.4})

    def no_space(path):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "fsync_dir", no_space)
    with pytest.raises(WriteError, match="metrics.png"):
        h.plot()
    assert h.plot_path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "metrics.png"]
