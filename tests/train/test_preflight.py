"""Preflight: what can be checked before the first step fails before it, naming the file; a run of
0 steps and an empty eval set are errors, never a silent exit 0 or NaN."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ember.train.preflight as preflight
from ember.config import from_dict
from ember.errors import CapacityError, ConfigError, DataError, SchemaError
from ember.train.loop import train


def _csv(path: Path, rows: int, header: str = "y,a") -> str:
    path.write_text(header + "\n" + "".join(f"{i % 2},v{i % 7}\n" for i in range(rows)))
    return str(path)


def _cfg(tmp_path: Path, train_path: str, eval_path: str | None, train_cfg: dict[str, Any] | None = None,
         **data: Any) -> Any:
    return from_dict({
        "data": {"format": "csv", "train": train_path, "eval": eval_path, "batch_size": 8, **data},
        "schema": {"labels": ["y"], "sparse": [{"name": "a"}]},
        "embedding": {"dim": 2},
        "model": {"type": "lr"},
        "train": {"out_dir": str(tmp_path / "runs"), "run_name": "r", "progress": False, "threads": 1,
                  **(train_cfg or {})},
    })


def _never_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the parts fails the test: the check must come before."""
    import ember.train.loop as loop

    monkeypatch.setattr(loop, "build_components", lambda cfg: pytest.fail("built parts before the checks"))


def test_missing_eval_path_fails_before_training(tmp_path, monkeypatch):
    _never_trains(monkeypatch)
    with pytest.raises(ConfigError, match="nope.csv"):
        train(_cfg(tmp_path, _csv(tmp_path / "t.csv", 20), str(tmp_path / "nope.csv")))
    assert not (tmp_path / "runs" / "r").exists()


def test_eval_file_without_a_schema_column_fails_before_training(tmp_path, monkeypatch):
    _never_trains(monkeypatch)
    ev = _csv(tmp_path / "e.csv", 20, header="y,b")
    with pytest.raises(SchemaError, match=r"e\.csv: column\(s\) \['a'\] not found"):
        train(_cfg(tmp_path, _csv(tmp_path / "t.csv", 20), ev))


def test_header_only_train_file_is_an_error_naming_it(tmp_path, monkeypatch):
    _never_trains(monkeypatch)
    with pytest.raises(DataError, match=r"data\.train: 1 file\(s\) \(.*t\.csv\) hold no data rows"):
        train(_cfg(tmp_path, _csv(tmp_path / "t.csv", 0), None))


def test_empty_parquet_eval_is_an_error(tmp_path, monkeypatch):
    _never_trains(monkeypatch)
    pq.write_table(pa.table({"y": pa.array([], pa.string()), "a": pa.array([], pa.string())}), tmp_path / "e.parquet")
    pq.write_table(pa.table({"y": ["1", "0"], "a": ["x", "y"]}), tmp_path / "t.parquet")
    cfg = _cfg(tmp_path, str(tmp_path / "t.parquet"), str(tmp_path / "e.parquet"), format="parquet")
    with pytest.raises(DataError, match=r"data\.eval: .*e\.parquet\) hold no data rows"):
        train(cfg)


def test_damaged_parquet_footer_fails_before_training(tmp_path, monkeypatch):
    _never_trains(monkeypatch)
    pq.write_table(pa.table({"y": ["1", "0"], "a": ["x", "y"]}), tmp_path / "t.parquet")
    (tmp_path / "e.parquet").write_bytes(b"PAR1" + b"x" * 100 + b"PAR1")
    cfg = _cfg(tmp_path, str(tmp_path / "t.parquet"), str(tmp_path / "e.parquet"), format="parquet")
    with pytest.raises(DataError, match=r"e\.parquet \(header/footer\): cannot be read"):
        train(cfg)


def test_a_run_of_zero_steps_is_an_error_and_leaves_no_run_dir(tmp_path):
    bad = tmp_path / "t.csv"
    bad.write_text("y,a\n1,x,extra\n0,y,extra\n")  # rows, but every one skipped as bad
    with pytest.raises(DataError, match=r"training ran 0 steps: data\.train \(1 file\(s\) \(.*t\.csv\)\)"):
        train(_cfg(tmp_path, str(bad), None, on_bad_rows="skip"))
    assert not (tmp_path / "runs" / "r").exists()


def test_an_empty_eval_set_is_an_error_not_nan(tmp_path):
    ev = tmp_path / "e.csv"
    ev.write_text("y,a\n1,x,extra\n")
    with pytest.raises(DataError, match="evaluation got no rows"):
        train(_cfg(tmp_path, _csv(tmp_path / "t.csv", 40), str(ev), on_bad_rows="skip"))


def test_unwritable_output_directory_fails_before_training(tmp_path, monkeypatch):
    _never_trains(monkeypatch)
    (tmp_path / "file").write_text("not a directory")
    cfg = _cfg(tmp_path, _csv(tmp_path / "t.csv", 20), None, {"out_dir": str(tmp_path / "file" / "runs")})
    with pytest.raises(ConfigError, match="cannot be written"):
        train(cfg)


def test_disk_estimate_errors_when_nothing_fits_and_warns_when_tables_may_not(tmp_path, monkeypatch, caplog):
    cfg = _cfg(tmp_path, _csv(tmp_path / "t.csv", 40), None)
    monkeypatch.setattr(preflight, "free_bytes", lambda path: 10)
    with pytest.raises(CapacityError, match="lower checkpoint.keep"):
        train(cfg)
    assert not (tmp_path / "runs" / "r").exists()  # failed before its first checkpoint: nothing left
    # room for the dense part, not for tables at their largest: a warning, and the run goes on
    monkeypatch.setattr(preflight, "free_bytes", lambda path: 1000)
    with caplog.at_level(logging.WARNING, logger="ember"):
        result = train(cfg)
    assert result.step == 5 and "checkpoints may need up to" in caplog.text


def test_reusing_a_run_name_is_refused_unless_overwrite_or_resume(tmp_path):
    csv = _csv(tmp_path / "t.csv", 40)
    cfg = _cfg(tmp_path, csv, None, {"max_steps": 3})
    first = train(cfg)
    with pytest.raises(ConfigError, match=r"already holds a run .*--overwrite"):
        train(cfg, overwrite=False)
    again = train(_cfg(tmp_path, csv, None, {"max_steps": 2}), overwrite=True)  # replaced: the old run's step-3 checkpoint is gone
    assert again.run_dir == first.run_dir
    assert sorted(p.name for p in (again.run_dir / "checkpoints").glob("step-*")) == ["step-00000002"]
    resumed = _cfg(tmp_path, csv, None, {"max_steps": 4, "resume": str(again.run_dir)})
    assert train(resumed, overwrite=False).step == 4
