"""A run lists its data files once: preflight's check, the row count, every epoch and every
evaluation share one listing per split (on an object store each listing is requests over a
prefix), and the next run lists again, so it sees files added since."""

from __future__ import annotations

import collections

import pyarrow.csv as pacsv

from ember.config import from_dict
from ember.source import files
from ember.testing.clicks import clicks, clicks_run
from ember.train.loop import train


def test_a_run_lists_each_split_once_and_the_next_run_lists_again(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    pacsv.write_csv(clicks(0, 300, 0), data / "a.csv")
    pacsv.write_csv(clicks(1, 100, 1000), tmp_path / "eval.csv")
    listed: collections.Counter[str] = collections.Counter()
    expand = files._expand

    def counting(patterns, format, storage_options, what):
        listed[what] += 1
        return expand(patterns, format, storage_options, what)

    monkeypatch.setattr(files, "_expand", counting)
    cfg = from_dict(clicks_run(tmp_path / "runs", "r", {"format": "csv", "train": str(data), "eval": str(tmp_path / "eval.csv")},
                               epochs=3))
    first = train(cfg)
    assert listed == {"data.train": 1, "data.eval": 1}, listed
    assert first.step == 3 * -(-300 // 64) and "auc/label" in first.metrics, (first.step, first.metrics)

    pacsv.write_csv(clicks(2, 200, 5000), data / "b.csv")  # a later run sees it
    listed.clear()
    cfg = from_dict(clicks_run(tmp_path / "runs", "r2", {"format": "csv", "train": str(data), "eval": str(tmp_path / "eval.csv")},
                               epochs=1))
    second = train(cfg)
    assert listed == {"data.train": 1, "data.eval": 1}, listed
    assert second.step == -(-500 // 64), second.step  # (both files: batches run on across them)


def test_a_distributed_runs_file_check_takes_the_runs_listing(tmp_path, monkeypatch):
    """The ranks' check that they see the same files (``check_same_files``) reads the run's one
    listing of data.train, not a listing of its own."""
    from ember.source.protocol import one_source_per_config, source_for
    from ember.train.distributed import check_same_files

    data = tmp_path / "data"
    data.mkdir()
    for k in range(3):
        pacsv.write_csv(clicks(k, 50, 1000 * k), data / f"{k}.csv")
    listed: collections.Counter[str] = collections.Counter()
    expand = files._expand

    def counting(patterns, format, storage_options, what):
        listed[what] += 1
        return expand(patterns, format, storage_options, what)

    class TwoRanks:  # (both ranks list the same files)
        def all_gather(self, x):
            return [x, x]

    monkeypatch.setattr(files, "_expand", counting)
    cfg = from_dict(clicks_run(tmp_path / "runs", "r", {"format": "csv", "train": str(data), "eval": str(data / "0.csv")}))
    with one_source_per_config():
        check_same_files(cfg, TwoRanks())
        assert source_for(cfg.data).count("train").bytes == sum(f.stat().st_size for f in data.iterdir())
    assert listed == {"data.train": 1}, listed
