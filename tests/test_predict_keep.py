"""``ember predict --keep id,...`` and ``Predictor.predict_files(out=..., keep=...)``: the input's
key columns, as read, beside the ``p_<task>`` columns, row for row, in the format the output's
extension names; a column the input lacks is an error naming it with a did-you-mean."""

from __future__ import annotations

import csv
import gzip

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ember.cli import main
from ember.errors import ConfigError
from ember.outputs import output_kind
from ember.serving import Predictor


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """An export trained on CSV rows that carry an ``id`` (and a ``country``) that are no
    feature, and input files of such rows: CSV (ids with a comma and a quote) and Parquet."""
    tmp = tmp_path_factory.mktemp("keep")
    rng = np.random.default_rng(0)
    n = 200
    ids = [f"r{i}" for i in range(n)]
    ids[3], ids[5] = 'with,comma', 'say "hi"'
    country = rng.choice(["US", "DE", ""], n)
    lines = [f"{int(rng.random() < 0.4)},{rng.normal():.3f},c{i % 9},{country[i]}" for i in range(n)]
    with open(tmp / "rows.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["y", "x", "c", "country", "id"])
        for line, i in zip(lines, ids):
            w.writerow([*line.split(","), i])
    pq.write_table(pa.table({"x": rng.normal(size=50), "c": [f"c{i % 9}" for i in range(50)],
                             "user": pa.array([i if i % 7 else None for i in range(50)], pa.int64())}),
                   tmp / "rows.parquet")
    cfg = tmp / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"format": "csv", "train": str(tmp / "rows.csv"), "batch_size": 64},
        "schema": {"labels": ["y"], "dense": [{"name": "x"}], "sparse": [{"name": "c"}]},
        "embedding": {"dim": 2}, "model": {"type": "lr"},
        "train": {"out_dir": str(tmp), "run_name": "r", "progress": False, "threads": 1},
    }))
    assert main(["train", "--config", str(cfg), "--export", str(tmp / "export")]) == 0
    return tmp, ids, country


def test_cli_keeps_the_columns_beside_the_probabilities_in_each_format(setup, tmp_path, capsys):
    tmp, ids, country = setup
    export, rows = str(tmp / "export"), str(tmp / "rows.csv")
    probs = Predictor.load(export).predict_files([rows])[:, 0]
    for name in ["p.csv", "p.tsv", "p.csv.gz", "p.parquet"]:
        out = tmp_path / name
        assert main(["predict", "--export", export, "--input", rows, "--keep", "id, country", "--output", str(out)]) == 0
        if name.endswith(".parquet"):
            table = pq.read_table(out)
        else:
            opener = gzip.open if name.endswith(".gz") else open
            with opener(out, "rt", newline="") as f:
                got = list(csv.reader(f, delimiter="\t" if name.endswith(".tsv") else ","))
            table = pa.table({k: [r[j] for r in got[1:]] for j, k in enumerate(got[0])})
        assert table.column_names == ["id", "country", "p_y"], name
        assert table["id"].to_pylist() == ids, name  # as read: a comma, a quote and all
        assert table["country"].to_pylist() == list(country), name  # an empty field stays empty
        np.testing.assert_allclose(np.asarray(table["p_y"].to_pylist(), float), probs, atol=1e-6)
        assert output_kind(out) == "predictions", name  # so --overwrite may replace it, and only it
        assert main(["predict", "--export", export, "--input", rows, "--keep", "id", "--output", str(out),
                     "--overwrite"]) == 0
    capsys.readouterr()
    assert main(["predict", "--export", export, "--input", rows, "--keep", "id"]) == 0
    printed = list(csv.reader(capsys.readouterr().out.splitlines()))
    assert printed[0] == ["id", "p_y"] and [r[0] for r in printed[1:]] == ids
    # without --keep the output is as before: the probabilities alone
    assert main(["predict", "--export", export, "--input", rows]) == 0
    plain = capsys.readouterr().out.splitlines()
    assert plain[0] == "p_y" and plain[1:] == [f"{p:.6f}" for p in probs]


def test_a_keep_column_the_input_lacks_is_an_error_with_a_did_you_mean(setup, tmp_path, capsys):
    tmp, _, _ = setup
    out = tmp_path / "p.csv"
    assert main(["predict", "--export", str(tmp / "export"), "--input", str(tmp / "rows.csv"), "--keep", "ID,cuntry",
                 "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--keep names column(s) ['ID', 'cuntry']" in err
    assert "did you mean 'id' for 'ID'" in err and "did you mean 'country' for 'cuntry'" in err
    assert not out.exists()
    assert main(["predict", "--export", str(tmp / "export"), "--input", str(tmp / "rows.csv"), "--keep", ","]) == 2
    assert "--keep takes input column names" in capsys.readouterr().err


def test_python_predict_files_writes_out_with_keep_and_predict_table_keeps_values(setup, tmp_path):
    tmp, _, _ = setup
    p = Predictor.load(tmp / "export")
    inp = str(tmp / "rows.parquet")
    out = tmp_path / "scores.parquet"
    probs = p.predict_files([inp], keep=["user", "c"], out=out)
    table = pq.read_table(out)
    assert table.column_names == ["user", "c", "p_y"] and table.num_rows == len(probs) == 50
    assert table["user"].to_pylist() == [i if i % 7 else None for i in range(50)]  # integers, nulls kept
    np.testing.assert_allclose(table["p_y"].to_numpy(), probs[:, 0])
    assert p.predict_table([inp], ["user"]).equals(table.select(["user", "p_y"]))
    assert p.predict_table([inp], "user, c").equals(table)  # one string of names, as --keep takes them
    p.predict_files([inp], out=out)  # an earlier predictions file is replaced
    assert pq.read_table(out).column_names == ["p_y"]
    with pytest.raises(ConfigError, match="give out="):
        p.predict_files([inp], keep=["user"])
    with pytest.raises(ConfigError, match=r"--keep names column\(s\) \['usr'\].*did you mean 'user'"):
        p.predict_files([inp], keep=["usr"], out=tmp_path / "x.csv")
    mine = tmp_path / "mine.csv"
    mine.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="ember did not write"):
        p.predict_files([inp], out=mine)
    assert mine.read_text() == "a,b\n1,2\n"


def test_a_users_table_ending_in_p_columns_of_non_probabilities_is_not_predictions(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("id,p_x\na,3.5\n")
    assert output_kind(f) is None
    f.write_text("id,p_x\na,0.5,extra\n")
    assert output_kind(f) is None
    f.write_text('id,p_x\n"a,b",0.5\n')
    assert output_kind(f) == "predictions"
