"""The progress bar: a total and an ETA for every source (CSV estimated from bytes read, marked
~), and a line even on runs shorter than log_every."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.orc as po
import pyarrow.parquet as pq
import pytest

from ember.config import from_dict
from ember.pipeline.loader import make_batches
from ember.train.loop import train
from ember.train.progress import EpochRows, Progress, epoch_rows, estimate_rows, planned_steps

SCHEMA = {"labels": ["label"], "dense": [{"name": "d1"}], "sparse": [{"name": "c1"}, {"name": "c2"}]}


def _rows(n: int) -> list[str]:
    return [f"{i % 2},{i % 7},a{i % 13},b{i % (5 + i % 300)}" for i in range(n)]  # lines of varying length


def _csv(path: Path, n: int) -> Path:
    path.write_text("\n".join(["label,d1,c1,c2"] + _rows(n)) + "\n")
    return path


def _table(n: int) -> pa.Table:
    return pa.table({"label": [str(i % 2) for i in range(n)], "d1": [float(i % 7) for i in range(n)],
                     "c1": [f"a{i % 13}" for i in range(n)], "c2": [f"b{i % 5}" for i in range(n)]})


def _cfg(tmp_path: Path, data: dict, **train) -> object:
    return from_dict({"data": {"batch_size": 100, "shuffle_buffer": 0, **data}, "schema": SCHEMA,
                      "model": {"type": "lr"}, "embedding": {"dim": 4},
                      "train": {"out_dir": str(tmp_path), "run_name": "p", "progress": True, **train}})


def test_estimate_rows_and_planned_steps():
    assert estimate_rows(10_000, 2_500, 100) == 400
    assert estimate_rows(10_000, 10_000, 397) == 397  # read through: exact
    assert estimate_rows(10_000, 0, 0) is None and estimate_rows(10_000, 100, 0) is None
    assert planned_steps(1001, 100, False, 3, None) == 33 and planned_steps(1001, 100, True, 3, None) == 30
    assert planned_steps(1001, 100, False, 3, 7) == 7


def test_epoch_rows_exact_from_metadata(tmp_path):
    pq.write_table(_table(700), tmp_path / "a.parquet")
    pq.write_table(_table(300), tmp_path / "b.parquet")
    po.write_table(_table(450), tmp_path / "c.orc")
    assert epoch_rows(_cfg(tmp_path, {"format": "parquet", "train": str(tmp_path / "*.parquet")}).data).rows == 1000
    assert epoch_rows(_cfg(tmp_path, {"format": "orc", "train": str(tmp_path / "c.orc")}).data).rows == 450
    synth = from_dict({"data": {"preset": "synthetic", "synthetic": {"rows": 1234, "num_sparse": 2}}, "model": {"type": "lr"}})
    assert epoch_rows(synth.data).rows == 1234
    csv = _cfg(tmp_path, {"format": "csv", "train": str(_csv(tmp_path / "t.csv", 50))})
    est = epoch_rows(csv.data)
    assert est.rows is None and est.total_bytes == (tmp_path / "t.csv").stat().st_size


def test_csv_estimate_is_refined_as_the_file_is_read(tmp_path):
    n = 20_000
    path = _csv(tmp_path / "t.csv", n)
    cfg = _cfg(tmp_path, {"format": "csv", "train": str(path), "csv": {"block_bytes": 16_384}})
    total = epoch_rows(cfg.data).total_bytes
    loader = make_batches(cfg.data, cfg.schema, "train")
    estimates = []
    for _ in loader:
        estimates.append(estimate_rows(total, loader.read.bytes, loader.read.rows))
        assert not loader.read.finished or len(estimates) >= n // 100 - 2
    mid = estimates[len(estimates) // 4]
    assert mid is not None and abs(mid - n) / n < 0.15, mid  # a fair estimate a quarter of the way in
    assert mid != n  # an estimate, not the count
    assert loader.read.finished and loader.read.bytes == total and estimates[-1] == n  # read through: exact


def test_compressed_csv_counts_bytes_as_stored(tmp_path):
    """A .gz file's estimate uses its compressed bytes (what its size on disk measures)."""
    import random

    from ember.source.csv import read_csv

    rng = random.Random(0)
    n = 60_000
    text = "y,a\n" + "".join(f"{i % 2},{rng.getrandbits(64):x}\n" for i in range(n))  # hardly compressible
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(text.encode()))
    size = path.stat().st_size
    consumed, rows, estimates = [0], 0, []
    for chunk in read_csv(str(path), ["y", "a"], block_bytes=32_768, consumed=consumed):
        rows += chunk.batch.num_rows
        estimates.append(estimate_rows(size, consumed[0], rows))
    assert consumed[0] == size and rows == n
    mid = estimates[len(estimates) // 2]
    assert mid is not None and abs(mid - n) / n < 0.15, mid


class _FakeLoader:
    def __init__(self) -> None:
        from ember.pipeline.loader import ReadCounter

        self.read = ReadCounter()


def test_csv_bar_total_is_marked_as_an_estimate_until_read_through(tmp_path):
    path = _csv(tmp_path / "t.csv", 1000)
    size = path.stat().st_size
    cfg = _cfg(tmp_path, {"format": "csv", "train": str(path)}, epochs=2)
    bar = Progress(cfg)
    assert bar.bar.total is None  # nothing read yet, no max_steps
    loader = _FakeLoader()
    bar.watch(loader)  # type: ignore[arg-type]
    loader.read.rows, loader.read.bytes = 250, size // 4
    bar.advance(1)
    assert bar.bar.total == planned_steps(estimate_rows(size, size // 4, 250), 100, False, 2, None)
    assert "/~{total_fmt}" in bar.bar.bar_format and "<~{remaining}" in bar.bar.bar_format
    loader.read.rows, loader.read.bytes = 1000, size
    bar.advance(2)
    assert "/~" in bar.bar.bar_format  # every byte read, but the reader may still hold rows
    loader.read.finished = True
    bar.advance(3)
    assert bar.bar.total == 20 and "~" not in bar.bar.bar_format
    bar.close()


def _bar_lines(err: str) -> list[str]:
    return [s for s in re.split(r"[\r\n]", err) if "step/s" in s or "s/step" in s]


def test_short_run_prints_the_bar_with_total_and_eta(tmp_path, capsys):
    cfg = from_dict({"data": {"preset": "synthetic", "synthetic": {"rows": 1000, "eval_rows": 200, "num_sparse": 2},
                              "batch_size": 100},
                     "model": {"type": "lr"}, "embedding": {"dim": 4},
                     "train": {"out_dir": str(tmp_path), "run_name": "p", "progress": True, "max_steps": 7}})
    train(cfg)
    lines = _bar_lines(capsys.readouterr().err)
    assert lines and "7/7" in lines[-1], lines  # shown although 7 < log_every (50)
    assert re.search(r"\d+/7 \[\d\d:\d\d<\d\d:\d\d", lines[-1]), lines[-1]  # elapsed<remaining (ETA)


def test_csv_run_ends_with_an_exact_total(tmp_path, capsys):
    path = _csv(tmp_path / "t.csv", 950)
    train(_cfg(tmp_path, {"format": "csv", "train": str(path), "eval": str(path)}))
    lines = _bar_lines(capsys.readouterr().err)
    assert lines and "10/10" in lines[-1] and "~" not in lines[-1], lines


def test_hit_rates_are_pooled_over_the_tables_that_were_asked():
    """The bar's hit rate of a tier: hits over requests of every table together; a table the
    window never asked (its rate NaN in the record) neither turns the figure into nan nor
    weighs as much as a busy one; no figure when no table asked the tier."""
    from ember.train.progress import hit_rate

    nan = float("nan")
    rec = {"loss": 0.5, "a/tier.disk.hit_rate": 0.0, "a/tier.disk.hits": 0.0, "a/tier.disk.requests": 57.0,
           "b/tier.disk.hit_rate": nan, "b/tier.disk.hits": 0.0, "b/tier.disk.requests": 0.0,
           "a/tier.host.hit_rate": 0.9, "a/tier.host.hits": 900.0, "a/tier.host.requests": 1000.0,
           "b/tier.host.hit_rate": 0.5, "b/tier.host.hits": 5.0, "b/tier.host.requests": 10.0}
    assert hit_rate(rec, "disk") == 0.0
    assert hit_rate(rec, "host") == pytest.approx(905 / 1010)
    assert hit_rate(rec, "device") is None
    assert hit_rate({"b/tier.disk.hit_rate": nan, "b/tier.disk.hits": 0.0, "b/tier.disk.requests": 0.0}, "disk") is None
    shown = Progress.__new__(Progress)
    posted: dict = {}
    shown.bar = type("Bar", (), {"set_postfix": lambda self, p: posted.update(p), "update": lambda self, n: None})()
    shown.last, shown._loader, shown.rows = 0, None, EpochRows(rows=1000)
    shown.update(10, {**rec, "samples_per_s": 100.0})
    assert posted["disk_hit"] == "0.00" and posted["host_hit"] == "0.90" and "device_hit" not in posted
