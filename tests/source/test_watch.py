"""The watched data.train: arrival order, each file once, files still being written (settling,
temporary names, missing markers) never taken, idle timeout and stop end the stream; config
errors name what to set."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ember.config import from_dict
from ember.errors import ConfigError
from ember.source.watch import FileWatcher, WatchOptions, check_watched


def _write(path: Path, mtime: float | None = None, text: str = "y,c\n1,a\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def _names(paths: list[str]) -> list[str]:
    return [Path(p).name for p in paths]


def test_order_by_mtime_then_name_or_by_name_each_file_once(tmp_path):
    _write(tmp_path / "c.csv", 1000.0)
    _write(tmp_path / "a.csv", 3000.0)
    _write(tmp_path / "b.csv", 1000.0)  # same mtime as c: name breaks the tie
    w = FileWatcher([str(tmp_path)], "csv", WatchOptions(settle_s=0))
    assert _names(w.poll()) == ["b.csv", "c.csv", "a.csv"]
    assert w.poll() == []  # taken once
    _write(tmp_path / "0-late.csv", 10.0)  # found later with an older mtime: after the others, not lost
    _write(tmp_path / "d.csv", 5000.0)
    assert _names(w.poll()) == ["0-late.csv", "d.csv"]
    by_name = FileWatcher([str(tmp_path)], "csv", WatchOptions(settle_s=0, order="name"), taken=[str(tmp_path / "b.csv")])
    assert _names(by_name.poll()) == ["0-late.csv", "a.csv", "c.csv", "d.csv"]  # a taken file is never returned


def test_temporary_names_other_formats_and_underscore_directories_are_not_taken(tmp_path):
    _write(tmp_path / "ok.csv")
    _write(tmp_path / ".ok2.csv.inprogress")
    _write(tmp_path / "_tmp.csv")
    _write(tmp_path / "ok3.csv._COPYING_")  # hadoop fs -put's temporary name
    _write(tmp_path / "x.parquet")
    _write(tmp_path / "_temporary" / "0" / "part.csv")  # Spark's staging directory
    _write(tmp_path / "day=1" / "part-0.csv")
    w = FileWatcher([str(tmp_path)], "csv", WatchOptions(settle_s=0, order="name"))
    assert _names(w.poll()) == ["part-0.csv", "ok.csv"]
    g = FileWatcher([str(tmp_path / "*.csv*")], "csv", WatchOptions(settle_s=0, order="name"))
    assert _names(g.poll()) == ["ok.csv", "ok3.csv._COPYING_"]  # a glob takes what it matches, hidden names aside
    deep = FileWatcher([str(tmp_path / "**" / "*.csv")], "csv", WatchOptions(settle_s=0, order="name"))
    assert [str(Path(p).relative_to(tmp_path)) for p in deep.poll()] == ["day=1/part-0.csv", "ok.csv"]


def test_settled_a_file_modified_recently_is_not_taken_until_it_settles(tmp_path):
    now = [10_000.0]
    f = _write(tmp_path / "a.csv", 9_999.0)  # modified 1 s ago: maybe still being written
    w = FileWatcher([str(tmp_path)], "csv", WatchOptions(settle_s=5), clock=lambda: now[0])
    assert w.poll() == []
    now[0] = 10_003.0
    _write(f, 10_003.0, "y,c\n1,a\n0,b\n")  # the writer appended: the clock restarts
    now[0] = 10_006.0
    assert w.poll() == []
    now[0] = 10_008.0
    assert _names(w.poll()) == ["a.csv"]


def test_marker_a_directory_is_taken_once_it_holds_the_marker(tmp_path):
    _write(tmp_path / "h=00" / "part-0.csv")
    _write(tmp_path / "h=01" / "part-0.csv")
    _write(tmp_path / "h=01" / "part-1.csv")
    w = FileWatcher([str(tmp_path)], "csv", WatchOptions(ready="marker", order="name"))
    assert w.poll() == []
    (tmp_path / "h=01" / "_SUCCESS").touch()
    assert [str(Path(p).relative_to(tmp_path)) for p in w.poll()] == ["h=01/part-0.csv", "h=01/part-1.csv"]
    (tmp_path / "h=00" / "_SUCCESS").touch()
    assert [str(Path(p).relative_to(tmp_path)) for p in w.poll()] == ["h=00/part-0.csv"]


def test_files_waits_for_new_files_and_ends_after_the_idle_timeout(tmp_path):
    _write(tmp_path / "a.csv", 1.0)
    slept: list[float] = []

    def sleep(s: float) -> None:  # a fake clock: a file appears after 1 s of waiting
        slept.append(s)
        if abs(sum(slept) - 1.0) < 1e-9:
            _write(tmp_path / "b.csv", 2.0)

    w = FileWatcher([str(tmp_path)], "csv", WatchOptions(poll_s=0.5, idle_timeout_s=2.0, settle_s=0))
    assert _names(list(w.files(sleep=sleep))) == ["a.csv", "b.csv"]
    assert sum(slept) == pytest.approx(3.0)  # 1 s until b, then 2 s idle
    assert max(slept) <= 0.1 + 1e-9  # short naps, so a stop is seen at once


def test_stop_ends_a_stream_that_waits(tmp_path):
    calls = [0]

    def stop() -> bool:
        calls[0] += 1
        return calls[0] > 5

    w = FileWatcher([str(tmp_path)], "csv", WatchOptions(poll_s=60))  # no timeout: only stop ends it
    assert list(w.files(stop, sleep=lambda s: None)) == []


def test_config_errors_name_what_to_set(tmp_path):
    base = {"data": {"format": "csv", "train": str(tmp_path), "watch": {"settle_s": 0}},
            "schema": {"labels": ["y"], "sparse": [{"name": "c"}]}, "model": {"type": "lr"}}

    def err(**sections: dict) -> str:
        raw = {**base, **{k: {**base.get(k, {}), **v} for k, v in sections.items()}}
        with pytest.raises(ConfigError) as e:
            from_dict(raw)
        return str(e.value)

    assert "set train.mode: online" in err()
    online = {"mode": "online"}
    cfg = from_dict({**base, "train": online})
    assert cfg.data.shuffle_buffer == 0 and cfg.train.mode == "online"  # arrival order by default
    assert "set it to 0" in err(train=online, data={"shuffle_buffer": 10})
    assert "train.epochs (3) does not apply" in err(train={**online, "epochs": 3})
    assert "data.watch watches" in err(train=online, data={"format": "synthetic"})
    assert "set data.format" in err(train=online, data={"format": "synthetic", "watch": None})
    assert "set window_rows too" in err(train=online, eval={"window_every": 5})
    assert "unknown key 'data.watch.poll'" in err(train=online, data={"watch": {"poll": 1}})
    with pytest.raises(ConfigError, match="nope does not exist; create the directory"):
        check_watched([str(tmp_path / "nope")])
    with pytest.raises(ConfigError, match="nope does not exist"):  # a typo in a glob's directory
        check_watched([str(tmp_path / "nope" / "*" / "*.csv")])
    check_watched([str(tmp_path / "*.csv"), str(tmp_path / "**" / "*.csv")])  # a glob may match nothing yet
