"""The SQL source (``ember.source.sql``) on SQLite files: pieces of ``read_rows`` rows whatever
the driver's batches, key order and the resume query (a text key with a quote in it is bound,
not formatted), the key checks (repeated, NULL, wrong type), the config's refusals, the
progress total and ``ember profile`` on a query."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from ember.config import from_dict
from ember.errors import ConfigError, DataError
from ember.featurize.schema import Schema
from ember.pipeline.loader import make_batches
from ember.source.config import DataConfig
from ember.source.sql import SqlOptions, SqlPosition, sql_chunks, sql_columns, sql_count, sql_max_key
from ember.train.progress import epoch_rows

sqlite = pytest.importorskip("adbc_driver_sqlite.dbapi", reason="needs adbc-driver-sqlite: pip install 'ember[sql]'")


def _db(tmp_path: Path, **tables: pa.Table) -> str:
    path = str(tmp_path / "t.db")
    with sqlite.connect(path) as conn, conn.cursor() as cur:
        for name, t in tables.items():
            cur.adbc_ingest(name, t)
        conn.commit()
    return path


def _opts(uri: str, query: str = "SELECT * FROM t", key: str = "k", **kw) -> SqlOptions:
    return SqlOptions(driver="sqlite", uri=uri, query=query, key=key, **kw)


def test_rows_come_in_key_order_in_pieces_of_read_rows(tmp_path):
    """2,500 rows inserted backwards; the SQLite driver answers in its own batch sizes; ember
    yields 700-row pieces in key order, numbered by row of the result, after a key when asked."""
    n = 2500
    uri = _db(tmp_path, t=pa.table({"k": list(range(n, 0, -1)), "y": [i % 2 for i in range(n)]}))
    chunks = list(sql_chunks(_opts(uri), "train", read_rows=700))
    assert [c.batch.num_rows for c in chunks] == [700, 700, 700, 400]
    assert [c.first_row for c in chunks] == [1, 701, 1401, 2101]
    assert pa.concat_arrays([c.batch.column("k") for c in chunks]).to_pylist() == list(range(1, n + 1))
    assert chunks[0].file == "data.sql.query"
    after = list(sql_chunks(_opts(uri), "train", read_rows=700, after=2000))
    assert pa.concat_arrays([c.batch.column("k") for c in after]).to_pylist() == list(range(2001, n + 1))
    upto = list(sql_chunks(_opts(uri), "train", read_rows=700, upto=10))
    assert pa.concat_arrays([c.batch.column("k") for c in upto]).to_pylist() == list(range(1, 11))
    assert sql_count(_opts(uri), "train") == n and sql_max_key(_opts(uri)) == n


def test_a_text_key_is_bound_as_a_parameter_never_formatted(tmp_path):
    """A key value holding a quote resumes exactly after it (it would break formatted SQL)."""
    keys = ["a", "b'; DROP TABLE t; --", "c", "d"]
    uri = _db(tmp_path, t=pa.table({"k": keys[::-1], "y": [1, 0, 1, 0]}))
    got = [c.batch.column("k").to_pylist() for c in sql_chunks(_opts(uri), "train", after=keys[1])]
    assert got == [["c", "d"]]
    assert sql_count(_opts(uri), "train") == 4  # the table is still there


def test_repeated_and_null_keys_are_refused_naming_the_value(tmp_path):
    uri = _db(tmp_path, t=pa.table({"k": [1, 2, 2, 3], "y": [1, 0, 1, 0]}),
              n=pa.table({"k": pa.array([1, None, 3], pa.int64()), "y": [1, 0, 1]}))
    with pytest.raises(DataError, match=r"data.sql.key 'k': the value 2 \(row 3 of the training query"):
        list(sql_chunks(_opts(uri), "train", read_rows=2))
    with pytest.raises(DataError, match="data.sql.key 'k' is NULL in 1 row"):
        list(sql_chunks(_opts(uri, "SELECT * FROM n"), "train"))


def test_a_null_key_stops_the_epoch_it_would_be_left_out_of(tmp_path):
    """An epoch reads the keys up to the largest (``key <= :max``), which no NULL satisfies: the
    row would be dropped silently, so pinning the epoch refuses it, naming the key."""
    from ember.source.protocol import source_for

    uri = _db(tmp_path, t=pa.table({"k": pa.array([1, 2, None, 4], pa.int64()), "y": [1, 0, 1, 0], "c": list("abcd")}))
    data = DataConfig(format="sql", sql=_opts(uri).model_dump(), batch_size=2, shuffle_buffer=0)
    with pytest.raises(DataError, match="data.sql.key 'k' is NULL in 1 row"):
        source_for(data).start("train", None, True, False)
    with pytest.raises(DataError, match="data.sql.key 'k' is NULL in 1 row"):
        list(make_batches(data, Schema(labels=["y"], sparse=[{"name": "c"}])))


def test_preflight_names_the_key_and_its_type(tmp_path):
    uri = _db(tmp_path, t=pa.table({"k": [1.5, 2.5], "y": [1, 0], "key_id": [1, 2]}))
    assert sql_columns(_opts(uri, key="key_id"), "train") == (["k", "y", "key_id"], True)
    with pytest.raises(ConfigError, match="holds double values; the key must be integers or text"):
        sql_columns(_opts(uri), "train")
    with pytest.raises(ConfigError, match="data.sql.key 'keyid' is not a column .* did you mean 'key_id'"):
        sql_columns(_opts(uri, key="keyid"), "train")


@pytest.mark.parametrize("data, message", [
    ({"format": "sql"}, "data.format: sql needs data.sql"),
    ({"format": "csv", "train": "x.csv", "sql": {"driver": "sqlite", "uri": "x", "eval_query": "SELECT 1"}},
     "data.sql is set but data.format is 'csv'"),
    ({"format": "sql", "sql": {"driver": "sqlite", "uri": "x", "query": "SELECT 1"}}, "needs data.sql.key"),
    ({"format": "sql", "sql": {"driver": "sqlite", "uri": "x"}}, "give data.sql.query"),
    ({"format": "sql", "train": "a.csv", "sql": {"driver": "sqlite", "uri": "x", "eval_query": "SELECT 1"}},
     "remove data.train / data.eval"),
    ({"format": "sql", "shard": "files", "sql": {"driver": "sqlite", "uri": "x", "eval_query": "SELECT 1"}},
     "a SQL query is one stream"),
])
def test_config_refusals(data, message):
    with pytest.raises(ValueError, match=message):
        DataConfig.parse(data, where="data")


def test_online_mode_is_refused_for_sql():
    raw = {"data": {"format": "sql", "sql": {"driver": "sqlite", "uri": "x", "query": "SELECT 1", "key": "k"}},
           "schema": {"labels": ["y"], "sparse": [{"name": "c"}]}, "model": {"type": "lr"},
           "train": {"mode": "online"}}
    with pytest.raises(ConfigError, match="data.format: sql reads a query in epochs"):
        from_dict(raw)


def test_loader_positions_and_key_resume(tmp_path):
    """A FileLoader over a query notes each batch's last key (the position) and, given one,
    starts after it; the batches carry no key column nobody asked for."""
    uri = _db(tmp_path, t=pa.table({"k": [10, 20, 30, 40, 50], "y": [1, 0, 1, 0, 1], "c": list("abcde")}))
    data = DataConfig(format="sql", sql=_opts(uri).model_dump(), batch_size=2, shuffle_buffer=0)
    schema = Schema(labels=["y"], sparse=[{"name": "c"}])
    loader = make_batches(data, schema)
    batches = list(loader)
    assert [b.size for b in batches] == [2, 2, 1] and all(b.keys is None for b in batches)
    assert [loader.source_position(i) for i in (0, 1, 2, 3)] == [None, SqlPosition(20, 50), SqlPosition(40, 50),
                                                             SqlPosition(50, 50)]
    resumed = make_batches(data, schema, start_batch=1, at=SqlPosition(after=20))
    assert [b.size for b in resumed] == [2, 1] and resumed.source_position(3) == SqlPosition(50, 50)
    shuffled = make_batches(data.model_copy(update={"shuffle_buffer": 4}), schema, start_batch=1,
                            at=SqlPosition(after=20))
    with pytest.raises(ConfigError, match="written mid-epoch in key order"):
        list(shuffled)
    assert epoch_rows(data).rows == 5


def test_an_epoch_in_key_order_reads_the_rows_there_when_it_was_pinned(tmp_path):
    """Rows committed after an epoch was pinned wait, on a rank that runs the query after
    another pinned the epoch too (``Source.start``: the largest key); a resume pins anew, and
    reads them after the last key trained."""
    from ember.source.protocol import source_for

    uri = _db(tmp_path, t=pa.table({"k": [10, 20, 30, 40], "y": [1, 0, 1, 0], "c": list("abcd")}))
    data = DataConfig(format="sql", sql=_opts(uri).model_dump(), batch_size=2, shuffle_buffer=0)
    schema = Schema(labels=["y"], sparse=[{"name": "c"}])
    at = source_for(data).start("train", None, True, False)
    assert at == SqlPosition(upto=40)
    with sqlite.connect(uri) as conn, conn.cursor() as cur:
        cur.adbc_ingest("t", pa.table({"k": [50, 60], "y": [1, 1], "c": ["x", "y"]}), mode="append")
        conn.commit()
    loader = make_batches(data, schema, at=at, pinned=True)
    assert [b.size for b in loader] == [2, 2]  # 50 and 60: not this epoch's
    assert loader.source_position(1) == SqlPosition(after=20, upto=40)
    resumed = make_batches(data, schema, start_batch=1, at=loader.source_position(1))
    assert [b.size for b in resumed] == [2, 2] and resumed.source_position(3) == SqlPosition(60, 60)


def test_two_key_bounds_bind_as_numbered_placeholders(tmp_path):
    """A driver that numbers its parameters ($1, $2) gets the second bound as $2."""
    from ember.source.sql import _wrapped

    sql = _opts("x", placeholder="$1")
    *before, (text, params) = _wrapped(sql, "train", 20, 40)
    assert before == [] and text.endswith('WHERE "k" > $1 AND "k" <= $2 ORDER BY "k"') and params == (20, 40)
    pg = SqlOptions(driver="postgresql", uri="postgresql://x", query="SELECT * FROM t", key="k")
    (setting, values), (text, params) = _wrapped(pg, "train", "a", 40)
    assert values == ("a", "40") and params == () and "$1" in setting and "$2" in setting
    assert "AS text) AND" in text and "AS bigint) ORDER" in text


def test_ember_profile_reads_the_training_query(tmp_path, capsys):
    import yaml

    from ember.cli import main

    uri = _db(tmp_path, t=pa.table({"k": list(range(50)), "y": [i % 2 for i in range(50)],
                                    "c": [f"v{i % 7}" for i in range(50)]}))
    cfg = {"data": {"format": "sql", "sql": {"driver": "sqlite", "uri": uri, "query": "SELECT * FROM t", "key": "k"}},
           "schema": {"labels": ["y"], "sparse": [{"name": "c"}]}, "model": {"type": "lr"}}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["profile", "--config", str(path), "--out", str(tmp_path / "prof")]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "50" in out and "c" in out


@pytest.mark.parametrize("sizes", [[7], [3, 4], [1, 1, 1, 1, 1, 1, 1], [0, 2, 0, 5], [6, 1]])
def test_pieces_do_not_depend_on_the_drivers_batches_and_slices_are_not_copied(sizes):
    """``_rechunked`` cuts any batching of the same rows into the same 3-row pieces; a piece
    inside one driver batch shares that batch's memory (a slice), one across batches is joined."""
    from ember.source.sql import _rechunked

    whole = pa.record_batch({"k": list(range(7)), "v": [float(i) for i in range(7)]})
    batches, start = [], 0
    for n in sizes:
        batches.append(whole.slice(start, n))
        start += n
    pieces = list(_rechunked(iter(batches), 3))
    assert [p.to_pydict() for p in pieces] == [whole.slice(s, 3).to_pydict() for s in (0, 3, 6)]
    sources = {b.column("k").buffers()[1].address for b in batches if b.num_rows}  # all the same buffer here
    for p, s in zip(pieces, (0, 3, 6)):
        inside = any(b.num_rows and sum(sizes[:i]) <= s and s + min(3, 7 - s) <= sum(sizes[:i + 1])
                     for i, b in enumerate(batches))
        assert (p.column("k").buffers()[1].address in sources) == inside, (sizes, s)


def test_the_training_query_reads_only_the_columns_used_and_the_key(tmp_path):
    """Given the columns a schema uses, the query selects them and the key (as a Parquet file
    reads only its used columns); names the query lacks are left to the featurizer to name; the
    rows, their order and the resume after a key are unchanged; eval reads its query as is."""
    uri = _db(tmp_path, t=pa.table({"k": [3, 1, 2], "y": [1, 0, 1], "c": list("xyz"), "pad": ["-" * 50] * 3}))
    sql = _opts(uri, eval_query="SELECT * FROM t")
    chunks = list(sql_chunks(sql, "train", columns=["y", "c", "missing"]))
    assert chunks[0].batch.schema.names == ["k", "y", "c"]
    assert chunks[0].batch.column("k").to_pylist() == [1, 2, 3]
    assert [c.batch.to_pydict() for c in sql_chunks(sql, "train", after=1, columns=["c"])] == [{"k": [2, 3],
                                                                                               "c": ["z", "x"]}]
    assert list(sql_chunks(sql, "eval", columns=["c"]))[0].batch.schema.names == ["k", "y", "c", "pad"]
    data = DataConfig(format="sql", sql=sql.model_dump(), batch_size=2, shuffle_buffer=0)
    with pytest.raises(Exception, match="missing"):  # the featurizer names the column, as for a file
        list(make_batches(data, Schema(labels=["y"], sparse=[{"name": "missing"}])))


def test_statement_options_reach_the_driver_and_a_refused_one_is_named(tmp_path):
    """``data.sql.statement_kwargs`` are set on every query's statement (SQLite's batch_rows
    changes the driver's batches); an option the driver does not take stops the read naming
    it; database options, which SQLite's package does not take, name ``data.sql.db_kwargs``."""
    from ember.source.sql import sql_reader

    uri = _db(tmp_path, t=pa.table({"k": list(range(100)), "y": [0] * 100}))
    with sql_reader(_opts(uri, statement_kwargs={"adbc.sqlite.query.batch_rows": "10"}), "train") as reader:
        assert [b.num_rows for b in reader] == [10] * 10
    bad = _opts(uri, statement_kwargs={"adbc.sqlite.no_such_option": "1"})
    for read in (lambda: list(sql_chunks(bad, "train")), lambda: sql_count(bad, "train"),
                 lambda: sql_columns(bad, "train")):
        with pytest.raises(ConfigError, match=r"statement_kwargs: the sqlite driver refuses adbc.sqlite.no_such_option"):
            read()
    with pytest.raises(ConfigError, match="data.sql.db_kwargs: the sqlite driver's package .* takes no database options"):
        sql_count(_opts(uri, db_kwargs={"adbc.sqlite.no_such_option": "1"}), "train")


def test_driver_path_loads_that_library_and_a_bad_one_is_named(tmp_path):
    """``data.sql.driver_path``: the rows come through the driver library given (here the
    SQLite package's own file, loaded by the driver manager) exactly as through the package;
    a missing file and a file that is no ADBC driver each stop the read naming it, never a
    quiet fall back to the package's build."""
    import adbc_driver_sqlite

    uri = _db(tmp_path, t=pa.table({"k": list(range(50, 0, -1)), "y": [i % 2 for i in range(50)]}))
    library = adbc_driver_sqlite._driver_path()
    via_package = [c.batch for c in sql_chunks(_opts(uri), "train", read_rows=16, after=3)]
    via_path = [c.batch for c in sql_chunks(_opts(uri, driver_path=library), "train", read_rows=16, after=3)]
    assert [b.num_rows for b in via_path] == [16, 16, 15]
    assert all(a.equals(b) for a, b in zip(via_package, via_path)) and len(via_package) == len(via_path)
    assert sql_count(_opts(uri, driver_path=library), "train") == 50
    with pytest.raises(ConfigError, match=r"data.sql.driver_path: no such file '.*nothere.so'"):
        sql_count(_opts(uri, driver_path=str(tmp_path / "nothere.so")), "train")
    junk = tmp_path / "libjunk.so"
    junk.write_text("not a library")
    with pytest.raises(ConfigError, match=r"data.sql.driver_path: '.*libjunk.so' does not load as an ADBC driver"):
        list(sql_chunks(_opts(uri, driver_path=str(junk)), "train"))
    with pytest.raises(ConfigError, match="no such SQLite file"):  # still checked before the driver would create it
        sql_count(_opts(str(tmp_path / "none.db"), driver_path=library), "train")
    not_db = tmp_path / "rows.csv"
    not_db.write_text("k,y\n1,0\n")  # (the driver said "file is not a database" as the query's fault: "fix the SQL")
    with pytest.raises(ConfigError, match=r"the file is not a SQLite database \(no 'SQLite format 3' header\)"):
        sql_count(_opts(str(not_db)), "train")
