"""Training from a SQL database (``data.format: sql``) through ADBC, against SQLite and a real
PostgreSQL server started by the tests (``ember.testing.postgres``): the same weights as from
the same rows in a local Parquet file (in key order and shuffled), resume mid-epoch by key equal
to an uninterrupted run, rows appended after a checkpoint trained once on resume, bad rows
counted as for files, eval from ``data.sql.eval_query``, and ``ember train``'s errors (exit 2,
no traceback) for a bad driver, an unreachable server, bad SQL and a missing key column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ember.checkpoint.load import resolve_checkpoint, verify_checkpoint
from ember.cli import main
from ember.config import from_dict
from ember.testing import assert_identical, run_state
from ember.testing.clicks import clicks, clicks_run
from ember.source.sql import SqlOptions, sql_chunks, sql_reader
from ember.testing.postgres import server_or_skip
from ember.train.loop import train

pytest.importorskip("adbc_driver_sqlite", reason="the SQL tests need adbc-driver-sqlite: pip install 'ember[sql]'")

ROWS = 613  # not a multiple of the batch size: the last batch is partial


def rows(seed: int, n: int, first_id: int) -> pa.Table:
    """ids with gaps (as real keys have), scrambled (the query's ORDER BY must put them right)."""
    return clicks(seed, n, first_id, id_step=3, scrambled=True)


_raw = clicks_run


class Sqlite:
    """A SQLite database file with the same helpers as ``PostgresServer``."""

    driver = "sqlite"

    def __init__(self, path: Path) -> None:
        self.uri = str(path)

    def load(self, table: str, data: pa.Table, mode: str = "create") -> None:
        import adbc_driver_sqlite.dbapi as sqlite

        with sqlite.connect(self.uri) as conn, conn.cursor() as cur:
            cur.adbc_ingest(table, data, mode=mode)
            conn.commit()


postgres = pytest.fixture(scope="module")(server_or_skip)  # a private server; skips saying why it cannot start


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path_factory) -> Any:
    """A database of each kind, holding table ``clicks`` (``ROWS`` rows) and ``held_out``."""
    if request.param == "sqlite":
        d: Any = Sqlite(tmp_path_factory.mktemp("sqlite") / "clicks.db")
    else:
        d = request.getfixturevalue("postgres")
    d.load("clicks", rows(0, ROWS, 10), mode="replace")
    d.load("held_out", rows(1, 200, 5), mode="replace")
    return d


def _sql(db: Any, query: str = "SELECT * FROM clicks", **kw: Any) -> dict:
    return {"format": "sql", "sql": {"driver": db.driver, "uri": db.uri, "query": query, "key": "id", **kw}}


def _parquet(tmp_path: Path, table: pa.Table) -> dict:
    path = tmp_path / "clicks.parquet"
    pq.write_table(table.sort_by("id"), path)  # one row group: read in read_rows pieces, as the query is
    return {"format": "parquet", "train": str(path)}


@pytest.mark.parametrize("shuffle", [0, 150], ids=["key_order", "shuffled"])
def test_training_from_sql_equals_training_from_the_same_rows_in_parquet(db, tmp_path, shuffle):
    """The query's rows in key order are the Parquet file's rows in file order: bitwise the same
    weights, in key order and through the shuffle buffer (same seed, same draws)."""
    here = train(from_dict(_raw(tmp_path, "pq", {**_parquet(tmp_path, rows(0, ROWS, 10)), "shuffle_buffer": shuffle})))
    there = train(from_dict(_raw(tmp_path, "sql", {**_sql(db), "shuffle_buffer": shuffle})))
    assert here.step == there.step == -(-ROWS // 64)
    assert_identical(run_state(here), run_state(there))


@pytest.mark.parametrize("shuffle, workers", [(0, 0), (150, 0), pytest.param(0, 1, marks=pytest.mark.slow)],
                         ids=["key_order", "shuffled", "worker"])
def test_resume_mid_epoch_equals_an_uninterrupted_run(request, tmp_path, shuffle, workers):
    """Two epochs; a run stopped at step 4 resumes (by key in key order, by replay when
    shuffled) to the uninterrupted run's weights. With a worker process (pipeline.data_workers:
    1: positions noted in the trainer's process) on SQLite only: the worker's start-up is the
    test's cost, and the database plays no part in it."""
    dbs = ["sqlite"] if workers else ["sqlite", "postgresql"]
    for kind in dbs:
        _resume_equals_whole(request.getfixturevalue("postgres") if kind == "postgresql" else
                             _sqlite_db(tmp_path / kind), tmp_path / kind, shuffle, workers)


def _sqlite_db(folder: Path) -> Sqlite:
    folder.mkdir(parents=True, exist_ok=True)
    d = Sqlite(folder / "clicks.db")
    d.load("clicks", rows(0, ROWS, 10), mode="replace")
    return d


def _resume_equals_whole(db: Any, tmp_path: Path, shuffle: int, workers: int) -> None:
    db.load("clicks", rows(0, ROWS, 10), mode="replace")
    data = {**_sql(db), "shuffle_buffer": shuffle}
    pipe = {"pipeline": {"data_workers": workers}} if workers else {}
    whole = train(from_dict({**_raw(tmp_path, "whole", data, epochs=2), **pipe}))
    part = train(from_dict({**_raw(tmp_path, "part", data, epochs=2, max_steps=4), **pipe}))
    pos = verify_checkpoint(resolve_checkpoint(part.run_dir))["position"]
    key_order = sorted(rows(0, ROWS, 10).column("id").to_pylist())
    if shuffle:
        assert pos["sql_key"] is None and pos["sql_key_max"] == key_order[-1]
    else:
        assert pos["sql_key"] == key_order[4 * 64 - 1] and pos["sql_key_max"] == key_order[-1]  # the 256th row's key; the largest
    resumed = train(from_dict({**_raw(tmp_path, "part", data, epochs=2, resume=str(part.run_dir)), **pipe}))
    assert resumed.step == whole.step
    assert_identical(run_state(whole), run_state(resumed))


def test_rows_appended_after_the_checkpoint_are_trained_on_resume_once(db, tmp_path):
    """Stopped at step 4 (256 rows trained); 150 rows with higher keys arrive; the resumed run
    trains the rest and them, each once: the weights of one run over all rows in key order."""
    more = rows(7, 150, 10 + 3 * ROWS)
    part = train(from_dict(_raw(tmp_path, "part", _sql(db), max_steps=4)))
    db.load("clicks", more, mode="append")
    resumed = train(from_dict(_raw(tmp_path, "part", _sql(db), resume=str(part.run_dir))))
    everything = pa.concat_tables([rows(0, ROWS, 10), more])
    whole = train(from_dict(_raw(tmp_path, "pq", _parquet(tmp_path, everything))))
    assert resumed.step == whole.step == -(-(ROWS + 150) // 64)
    assert_identical(run_state(whole), run_state(resumed))


def test_shuffled_epoch_is_the_rows_there_when_it_began(db, tmp_path):
    """Shuffled, an epoch reads the keys up to the largest when it began: rows appended after a
    mid-epoch checkpoint wait for the next epoch, so the resumed epoch equals the uninterrupted
    one over the original rows (none twice, none lost to a reshuffle)."""
    data = {**_sql(db), "shuffle_buffer": 150}
    whole = train(from_dict(_raw(tmp_path, "whole", data)))
    part = train(from_dict(_raw(tmp_path, "part", data, max_steps=4)))
    db.load("clicks", rows(7, 150, 10 + 3 * ROWS), mode="append")
    resumed = train(from_dict(_raw(tmp_path, "part", data, resume=str(part.run_dir))))
    assert resumed.step == whole.step == -(-ROWS // 64)
    assert_identical(run_state(whole), run_state(resumed))


def test_the_resume_query_streams(db):
    """After a key, the rows still come as the driver streams them, several batches, never the
    whole result in one (PostgreSQL's driver streams only statements without parameters: the
    key is bound in a statement of its own)."""
    n = 200_000  # ~22 MB: more than one of PostgreSQL's 16 MB batches, many of SQLite's 1,024 rows
    db.load("wide", pa.table({"id": np.arange(n, dtype=np.int64), "pad": pa.array(["x" * 100] * n)}), mode="replace")
    sql = SqlOptions(driver=db.driver, uri=db.uri, query="SELECT * FROM wide", key="id")
    for after in (None, 10):
        with sql_reader(sql, "train", after=after) as reader:
            sizes = [b.num_rows for b in reader]
        assert len(sizes) > 1 and sum(sizes) == n - (0 if after is None else 11), (after, sizes[:3])


def test_a_text_key_with_a_quote_resumes_after_it(db):
    """A text key is bound, never formatted: a value holding a quote resumes exactly after it."""
    keys = ["a", "b'; DROP TABLE texts; --", "c", "d"]
    db.load("texts", pa.table({"k": keys[::-1], "y": [1, 0, 1, 0]}), mode="replace")
    sql = SqlOptions(driver=db.driver, uri=db.uri, query="SELECT * FROM texts", key="k")
    assert [c.batch.column("k").to_pylist() for c in sql_chunks(sql, "train", after=keys[1])] == [["c", "d"]]
    assert [c.batch.column("k").to_pylist() for c in sql_chunks(sql, "train", upto="b")] == [["a"]]


def test_eval_query_and_bad_rows_count_as_for_files(db, tmp_path):
    """Rows whose label is no number are skipped and counted under on_bad_rows: skip; the eval
    query's metrics equal those of the same rows in a file."""
    bad = rows(3, 40, 11).set_column(1, "label", pa.array(["x"] * 40))
    good = rows(0, ROWS, 10)
    table = pa.concat_tables([good.cast(bad.schema), bad])
    db.load("mixed", table, mode="replace")
    data = {**_sql(db, "SELECT * FROM mixed", eval_query="SELECT * FROM held_out"), "on_bad_rows": "skip"}
    there = train(from_dict(_raw(tmp_path, "sql", data)))
    path = tmp_path / "mixed.parquet"
    pq.write_table(table.sort_by("id"), path)
    pq.write_table(rows(1, 200, 5), tmp_path / "held_out.parquet")
    files = {"format": "parquet", "train": str(path), "eval": str(tmp_path / "held_out.parquet"), "on_bad_rows": "skip"}
    here = train(from_dict(_raw(tmp_path, "pq", files)))
    assert there.bad_rows == here.bad_rows and sum(there.bad_rows.values()) == 40
    assert there.metrics == here.metrics and there.metrics["rows"] == 200
    assert_identical(run_state(here), run_state(there))


def _cli(tmp_path: Path, data: dict, capsys) -> tuple[int, str]:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_raw(tmp_path, "cli", data)))
    code = main(["train", "--config", str(path)])
    return code, capsys.readouterr().err


def test_ember_train_names_each_sql_error_and_exits_2(db, tmp_path, capsys):
    """Bad SQL, a missing key column, a missing feature column: each its own message, exit 2."""
    cases = {
        "SELECT * FROM no_such_table": ("data.sql.query: the", "refused the query", "no_such_table"),
        "SELECT label, d1, c1, c2 FROM clicks": ("data.sql.key 'id' is not a column",),
        "SELECT id, label, d1, c1 FROM clicks": ("data.sql.query: column(s) ['c2'] not found",),
        "SELECT * FROM clicks WHERE id < 0": ("data.sql.query returns no rows",),
    }
    for query, expected in cases.items():
        code, err = _cli(tmp_path, _sql(db, query), capsys)
        assert code == 2, err
        # (the driver build's log line comes first in the process's first PostgreSQL run)
        assert "Traceback" not in err and ("\n" + err).count("\nember train: error:") == 1, err
        for text in expected:
            assert text in err, err


def test_a_repeated_key_stops_training_with_its_value(db, tmp_path, capsys):
    """A key column that is not unique would lose rows on resume: named, with the value."""
    dup = rows(0, 100, 10)
    db.load("dups", pa.concat_tables([dup, dup.slice(0, 1)]), mode="replace")
    code, err = _cli(tmp_path, _sql(db, "SELECT * FROM dups"), capsys)
    assert code == 2 and "data.sql.key 'id'" in err and "repeats" in err and "Traceback" not in err, err


def test_bad_driver_and_unreachable_servers_are_named(tmp_path, capsys, postgres):
    """A driver that does not exist, a PostgreSQL server that is not there, a SQLite file that
    is not there: each its own message, exit 2 (the password never shown)."""
    gone = postgres.uri.replace(f"port={postgres.port}", "port=1").replace("postgres@", "postgres:s3cret@")
    cases = [
        ({"driver": "nosuchdb", "uri": "x"}, ["data.sql.driver 'nosuchdb': no such ADBC driver"]),
        ({"driver": "postgresql", "uri": gone}, ["cannot connect", "server is running", "postgres:***@"]),
        ({"driver": "sqlite", "uri": str(tmp_path / "none.db")}, ["no such SQLite file"]),
    ]
    for sql, expected in cases:
        data = {"format": "sql", "sql": {"query": "SELECT * FROM clicks", "key": "id", **sql}}
        code, err = _cli(tmp_path, data, capsys)
        assert code == 2 and "Traceback" not in err and "s3cret" not in err, err
        for text in expected:
            assert text in err, err


def test_a_run_counts_the_query_rows_once(db, tmp_path, monkeypatch):
    """Preflight's checkpoint-size estimate counts the training rows once per run, not once per
    embedding table (each count is a query, and a connection, of its own)."""
    import ember.source.sql as sql_module

    calls: list[str] = []
    count = sql_module.sql_count
    monkeypatch.setattr(sql_module, "sql_count", lambda sql, split: calls.append(split) or count(sql, split))
    train(from_dict(_raw(tmp_path, "once", _sql(db))))
    assert calls == ["train"]


def test_postgresql_takes_statement_options_and_names_a_refused_database_option(postgres):
    """``adbc.postgresql.batch_size_hint_bytes`` (a statement option) reaches the driver: ~1 MiB
    batches instead of one 16 MiB batch; given as a database option, the driver refuses it and
    the message names ``data.sql.db_kwargs``, not the server."""
    from ember.errors import ConfigError

    n = 50_000  # ~5 MB as PostgreSQL's driver holds it
    postgres.load("hint", pa.table({"id": np.arange(n, dtype=np.int64), "pad": pa.array(["x" * 80] * n)}),
                  mode="replace")
    base = {"driver": "postgresql", "uri": postgres.uri, "query": "SELECT * FROM hint", "key": "id"}
    hint = {"adbc.postgresql.batch_size_hint_bytes": str(1 << 20)}
    with sql_reader(SqlOptions(**base), "train", after=10) as reader:
        default = [b.num_rows for b in reader]
    with sql_reader(SqlOptions(**base, statement_kwargs=hint), "train", after=10) as reader:
        small = [b.num_rows for b in reader]
    assert len(default) == 1 and len(small) > 3 and sum(small) == n - 11
    with pytest.raises(ConfigError, match="data.sql.db_kwargs: the postgresql driver refuses a database option"):
        list(sql_chunks(SqlOptions(**base, db_kwargs=hint), "train"))


def test_postgresql_through_driver_path_trains_and_resumes_as_through_the_package(postgres, tmp_path, caplog):
    """``data.sql.driver_path`` (here the package's own library, loaded by the driver manager):
    still PostgreSQL's way of binding the resume key (``set_config``: the result streams), the
    same weights as through the package; the package's build is named once per process, so a
    run knows which build decodes its rows (its decode is most of the source's CPU)."""
    import logging

    import adbc_driver_postgresql

    from ember import once

    postgres.load("clicks", rows(0, ROWS, 10), mode="replace")
    library = adbc_driver_postgresql._driver_path()
    sql = SqlOptions(driver="postgresql", uri=postgres.uri, query="SELECT * FROM clicks", key="id",
                     driver_path=library)
    keys = pa.concat_arrays([c.batch.column("id") for c in sql_chunks(sql, "train", read_rows=100, after=13)])
    assert keys.to_pylist() == sorted(rows(0, ROWS, 10).column("id").to_pylist())[2:]  # ids 10, 13, 16, ...: after 13
    caplog.set_level(logging.INFO, logger="ember")
    once.forget("sql.driver_build")
    with caplog.at_level(logging.INFO, logger="ember"):
        package = train(from_dict(_raw(tmp_path, "package", _sql(postgres))))
        built = train(from_dict(_raw(tmp_path, "path", _sql(postgres, driver_path=library))))
    said = [r.getMessage() for r in caplog.records if "data.sql.driver_path" in r.getMessage()]
    assert len(said) == 1 and "adbc_driver_postgresql 1." in said[0], said
    assert_identical(run_state(package), run_state(built))
