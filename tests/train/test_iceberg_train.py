"""Training from an Apache Iceberg table (``data.format: iceberg``) through pyiceberg, on a local
SQL catalog (SQLite in tmp_path, the warehouse a local folder): the same weights as from the same
rows in local Parquet files, a row filter and a snapshot, resume mid-epoch on the snapshot the
epoch began with (appends since wait for the next epoch), online training over new snapshots
(each appended data file once), and the errors for a missing table, column or catalog, a row
filter that does not fit the table, and a filter or snapshot without its table."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ember.checkpoint.load import resolve_checkpoint, verify_checkpoint
from ember.cli import main
from ember.config import from_dict
from ember.featurize.schema import Schema
from ember.pipeline.loader import make_batches
from ember.source.config import DataConfig
from ember.source.protocol import source_for
from ember.testing import assert_identical, run_state
from ember.testing.clicks import SCHEMA, clicks, clicks_run
from ember.train.loop import train

pytest.importorskip("pyiceberg", reason="the Iceberg tests need pyiceberg: pip install 'ember[iceberg]'")
pytest.importorskip("sqlalchemy", reason="the Iceberg tests' SQL catalog needs sqlalchemy: pip install 'ember[iceberg]'")

rows = clicks
_raw = clicks_run


class Lake:
    """A SQL catalog on SQLite and a local warehouse, with table ``db.clicks``."""

    def __init__(self, root: Path) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        root.mkdir(parents=True, exist_ok=True)
        self.props = {"type": "sql", "uri": f"sqlite:///{root / 'catalog.db'}", "warehouse": f"file://{root / 'wh'}"}
        self.catalog = SqlCatalog("default", **{k: v for k, v in self.props.items() if k != "type"})
        self.catalog.create_namespace("db")

    def create(self, name: str, parts: list[pa.Table]) -> Any:
        t = self.catalog.create_table(name, schema=parts[0].schema)
        for p in parts:
            t.append(p)
        return t

    def append(self, name: str, part: pa.Table) -> None:
        self.catalog.load_table(name).append(part)

    def data(self, **kw: Any) -> dict:
        return {"format": "iceberg", "iceberg": {"catalog": self.props, "table": "db.clicks", **kw}}


PARTS = [rows(0, 211, 0), rows(1, 190, 1000), rows(2, 157, 2000)]


@pytest.fixture
def lake(tmp_path) -> Lake:
    lake = Lake(tmp_path / "lake")
    lake.create("db.clicks", PARTS)
    return lake


def test_units_are_the_snapshots_data_files_and_a_filter_and_snapshot_apply(lake):
    data = DataConfig(**lake.data(), batch_size=50, shuffle_buffer=0)
    src = source_for(data)
    units = src.units("train")
    assert len(units) == 3 and [u.name for u in units] == sorted(u.name for u in units)
    assert sum(u.rows for u in units) == 558 and src.count("train").rows == 558
    ids = [v for u in units for c in src.open(u, ["id", "label"]) for v in c.batch.column("id").to_pylist()]
    assert sorted(ids) == sorted(sum((p.column("id").to_pylist() for p in PARTS), []))
    filtered = DataConfig(**lake.data(row_filter="id >= 1000 AND id < 1100"), shuffle_buffer=0)
    schema = Schema(labels=["label"], sparse=[{"name": "c1"}])
    assert sum(b.size for b in make_batches(filtered, schema)) == 100
    first = lake.catalog.load_table("db.clicks").snapshots()[0].snapshot_id
    pinned = DataConfig(**lake.data(snapshot=first), shuffle_buffer=0)
    assert sum(b.size for b in make_batches(pinned, schema)) == 211


def test_training_from_iceberg_equals_training_from_the_same_parquet_files(lake, tmp_path):
    """The table's data files, read in their sorted order, are Parquet files: bitwise the same
    weights as training on copies of them in that order."""
    src = source_for(DataConfig(**lake.data()))
    local = tmp_path / "local"
    local.mkdir()
    for k, u in enumerate(src.units("train")):
        pq.write_table(pq.read_table(u.name.removeprefix("file://")), local / f"{k:02d}.parquet")
    here = train(from_dict(_raw(tmp_path, "pq", {"format": "parquet", "train": str(local), "shuffle_buffer": 150})))
    there = train(from_dict(_raw(tmp_path, "ice", {**lake.data(), "shuffle_buffer": 150})))
    assert here.step == there.step == -(-558 // 64)
    assert_identical(run_state(here), run_state(there))


def test_resume_mid_epoch_reads_the_snapshot_the_epoch_began_with(lake, tmp_path):
    """A run stopped at step 4 records its snapshot; rows appended before the resume wait for the
    next epoch, so the resumed run equals the uninterrupted one."""
    whole = train(from_dict(_raw(tmp_path, "whole", {**lake.data(), "shuffle_buffer": 150})))
    part = train(from_dict(_raw(tmp_path, "part", {**lake.data(), "shuffle_buffer": 150}, max_steps=4)))
    pos = verify_checkpoint(resolve_checkpoint(part.run_dir))["position"]
    current = lake.catalog.load_table("db.clicks").current_snapshot().snapshot_id
    assert pos["iceberg_snapshot"] == current and pos["batch"] == 4
    lake.append("db.clicks", rows(3, 99, 5000))  # after the checkpoint: not this epoch's
    resumed = train(from_dict(_raw(tmp_path, "part", {**lake.data(), "shuffle_buffer": 150}, resume=str(part.run_dir))))
    assert resumed.step == whole.step
    assert_identical(run_state(whole), run_state(resumed))


def test_online_training_takes_each_appended_data_file_once_as_snapshots_arrive(tmp_path):
    """Snapshots appended while the trainer watches the table: the weights equal an offline pass
    over the same parts in commit order, and the stream position names the data files done."""
    lake = Lake(tmp_path / "lake")
    parts = [rows(10 + k, 150 + 13 * k, 1000 * k) for k in range(4)]
    lake.create("db.clicks", parts[:1])

    def appender() -> None:
        for p in parts[1:]:
            time.sleep(0.3)
            lake.append("db.clicks", p)

    th = threading.Thread(target=appender)
    th.start()
    try:
        online = train(from_dict({**_raw(tmp_path, "live", {**lake.data(), "watch": {"poll_s": 0.1,
                                  "idle_timeout_s": 2.0}}), "train": {**_raw(tmp_path, "live", {})["train"],
                                                                       "mode": "online"}}))
    finally:
        th.join()
    local = tmp_path / "local"
    local.mkdir()
    for k, p in enumerate(parts):
        pq.write_table(p, local / f"{k:02d}.parquet")
    offline = train(from_dict(_raw(tmp_path, "off", {"format": "parquet", "train": str(local)})))
    assert online.step == offline.step == -(-sum(len(p) for p in parts) // 64)
    assert_identical(run_state(offline), run_state(online))
    pos = verify_checkpoint(resolve_checkpoint(online.run_dir))["position"]
    assert len(pos["files_done"]) == 3 and pos["file"].endswith(".parquet") and pos["file"] not in pos["files_done"]


def test_ember_train_names_a_missing_table_column_filter_and_catalog(lake, tmp_path, capsys):
    import yaml

    cases = [
        ({**lake.data(), "iceberg": {**lake.data()["iceberg"], "table": "db.clickz"}}, "no such table"),
        ({**lake.data(row_filter="id >> 3")}, "not a filter expression"),
        ({**lake.data(), "iceberg": {"catalog": {"type": "nosuch"}, "table": "db.clicks"}}, "cannot open the catalog"),
        # a filter that parses but does not fit the table: named with its columns, not pyiceberg's traceback
        ({**lake.data(row_filter="nosuch > 3")}, "data.iceberg.row_filter 'nosuch > 3' does not fit iceberg table "
                                                "db.clicks (Could not find field with name nosuch"),
        ({**lake.data(row_filter="c1 > 3")}, "(Cannot convert LongLiteral into string); its columns: id (long), "
                                            "label (long), d1 (long), c1 (string), c2 (string)"),
        ({**lake.data(eval_table="db.clicks", eval_row_filter="d1 > 'x'")},
         "data.iceberg.eval_row_filter 'd1 > 'x'' does not fit iceberg table db.clicks"),
        # an evaluation filter without the evaluation table would apply to no rows
        ({**lake.data(eval_row_filter="d1 > 3")}, "data.iceberg.eval_row_filter is set but data.iceberg.eval_table "
                                                 "is not, so it would apply to no rows"),
        # a mistyped catalog database: named, and not created
        ({**lake.data(), "iceberg": {"catalog": {**lake.props, "uri": f"sqlite:///{tmp_path / 'typo.db'}"},
                                     "table": "db.clicks"}},
         f"data.iceberg.catalog.uri 'sqlite:///{tmp_path / 'typo.db'}': the catalog database {tmp_path / 'typo.db'} "
         "does not exist"),
    ]
    for k, (data, says) in enumerate(cases):
        cfg = tmp_path / f"c{k}.yaml"
        cfg.write_text(yaml.safe_dump(_raw(tmp_path, f"e{k}", data)))
        assert main(["train", "--config", str(cfg)]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, err
    assert not (tmp_path / "typo.db").exists()
    cfg = tmp_path / "col.yaml"
    raw = _raw(tmp_path, "col", lake.data())
    raw["schema"] = {**SCHEMA, "sparse": [{"name": "c9"}]}
    cfg.write_text(yaml.safe_dump(raw))
    assert main(["train", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "c9" in err and "iceberg table db.clicks" in err and "Traceback" not in err, err


@pytest.mark.parametrize("key, table", [("row_filter", "table"), ("snapshot", "table"),
                                        ("eval_row_filter", "eval_table"), ("eval_snapshot", "eval_table")])
def test_a_filter_or_snapshot_without_its_table_is_refused(key, table):
    """A training filter or snapshot without data.iceberg.table, or an evaluation one without
    eval_table, would apply to no rows: refused, not ignored."""
    from ember.source.iceberg import IcebergOptions

    given = {"table": "db.a"} if table == "eval_table" else {"eval_table": "db.a"}
    with pytest.raises(ValueError, match=rf"data.iceberg.{key} is set but data.iceberg.{table} is not"):
        IcebergOptions(**given, **{key: "d1 > 3" if "filter" in key else 7})
    IcebergOptions(table="db.a", eval_table="db.a", **{key: "d1 > 3" if "filter" in key else 7})

