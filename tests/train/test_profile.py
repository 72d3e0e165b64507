"""``ember profile``: its numbers against exact counts computed with numpy on the same rows, its
distinct-count estimate within its stated error, bad rows per reason, the JSON it writes, the
output rule, and the real Criteo sample (skipped when absent)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import yaml

from ember.cli import main
from ember.config import from_dict, load
from ember.train.profile import FORMAT, QUANTILES, VERSION, profile_data, read_profile, write_profile
from ember.train.sketches import BottomK, DistinctCounter, HeavyHitters
from tests.conftest import REPO, shared_data_dir

N = 3000


def _data(tmp_path: Path, seed: int = 0) -> tuple[Path, dict[str, np.ndarray]]:
    """A CSV of N rows: label, a dense column with blanks, a single-hot and a multi-hot
    column; rows 7, 100 and 2500 are bad (label 'x', label 2, dense 'abc')."""
    rng = np.random.default_rng(seed)
    label = (rng.random(N) < 0.3).astype(int).astype(str).astype(object)
    price = np.round(rng.lognormal(2, 1, N), 3).astype(str).astype(object)
    price[rng.random(N) < 0.1] = ""
    user = np.array([f"u{v}" for v in rng.zipf(1.5, N) % 700], dtype=object)
    user[rng.random(N) < 0.05] = ""
    tags = np.array(["|".join(f"t{t}" for t in rng.integers(0, 50, rng.integers(0, 5))) for _ in range(N)], dtype=object)
    label[7], label[100], price[2500] = "x", "2", "abc"
    path = tmp_path / "train.csv"
    pacsv.write_csv(pa.table({"label": label.astype(str), "price": price.astype(str), "user": user.astype(str),
                              "tags": tags.astype(str)}), path)
    return path, {"label": label, "price": price, "user": user, "tags": tags}


def _config(tmp_path: Path, train: Path, **extra) -> dict:
    return {
        "data": {"format": "csv", "train": str(train), "batch_size": 100, "on_bad_rows": "skip", "shuffle_buffer": 0},
        "schema": {"labels": ["label"], "dense": [{"name": "price", "log1p": True}],
                   "sparse": [{"name": "user", "missing_values": [""]}, {"name": "tags", "separator": "|"}]},
        "embedding": {"dim": 4},
        "model": {"type": "lr"},
        "train": {"out_dir": str(tmp_path / "runs"), "run_name": "p", "progress": False, "threads": 1},
        **extra,
    }


def test_profile_counts_equal_numpy_on_the_same_rows(tmp_path):
    path, cols = _data(tmp_path)
    p = profile_data(from_dict(_config(tmp_path, path)))
    good = np.ones(N, bool)
    good[[7, 100, 2500]] = False
    assert p["data"]["rows_read"] == N and p["data"]["rows"] == N - 3 and p["data"]["complete"]
    assert p["bad_rows"] == {"total": 3, "by_reason": {"label: label is not a number": 1,
                                                        "label: label is not in [0, 1]": 1, "price: not a number": 1},
                             "training_stops": False, "first_file": str(path)}
    labels = cols["label"][good].astype(float)
    assert p["labels"]["label"]["rate"] == pytest.approx(labels.mean(), abs=1e-12)
    assert p["labels"]["label"]["positives"] == labels.sum()

    user = cols["user"][good]
    present = user[user != ""]
    s = p["sparse"]["user"]
    assert s["distinct"] == {"value": len(set(present)), "exact": True, "stderr": 0.0, "relative_error_95": 0.0,
                             "method": "exact"}
    assert s["missing_rows"] == int((user == "").sum()) and s["missing_rate"] == pytest.approx((user == "").mean())
    assert not s["multi_hot"] and s["values_per_row"]["max"] == 1
    top = Counter(present).most_common(5)
    assert [(t["value"], t["count"]) for t in s["top"][:5]] == top  # exact counts while the counter is exact
    assert all(t["count_error"] == 0 for t in s["top"])

    tags = [[t for t in row.split("|") if t] for row in cols["tags"][good]]
    lengths = np.array([len(r) for r in tags])
    m = p["sparse"]["tags"]
    assert m["multi_hot"] and m["values"] == lengths.sum()
    assert m["values_per_row"]["mean"] == pytest.approx(lengths.mean())
    assert m["values_per_row"]["max"] == lengths.max() and m["values_per_row"]["p50"] == int(np.median(lengths))
    assert m["missing_rate"] == pytest.approx((lengths == 0).mean())
    assert m["distinct"]["value"] == len({t for r in tags for t in r})

    price = cols["price"][good]
    x = np.array([float(v) for v in price if v != ""])
    d = p["dense"]["price"]
    assert d["missing"] == int((price == "").sum()) and d["present"] == x.size
    assert (d["min"], d["max"]) == (x.min(), x.max()) and d["mean"] == pytest.approx(x.mean(), rel=1e-12)
    assert d["quantiles_exact"]
    for q in QUANTILES:  # raw values, before the config's log1p
        assert d["quantiles"][str(q)] == pytest.approx(np.quantile(x, q), rel=1e-12)


def test_rows_limit_reads_the_first_rows_and_says_so(tmp_path):
    path, cols = _data(tmp_path)
    p = profile_data(from_dict(_config(tmp_path, path)), rows=50)
    assert p["data"]["rows_read"] == 50 and not p["data"]["complete"]
    assert p["bad_rows"]["total"] == 1  # row 7 only
    first = cols["label"][:50]
    assert p["labels"]["label"]["rate"] == pytest.approx(np.mean([float(v) for v in first if v != "x"]))


def test_error_policy_counts_bad_rows_and_says_training_would_stop(tmp_path):
    path, _ = _data(tmp_path)
    cfg = _config(tmp_path, path)
    cfg["data"]["on_bad_rows"] = "error"
    p = profile_data(from_dict(cfg))
    assert p["bad_rows"]["total"] == 3 and p["bad_rows"]["training_stops"]


def test_distinct_estimate_is_within_its_stated_error_on_a_large_column(tmp_path):
    """300 k distinct IDs (each 1-3 times) through a counter holding 4,096: the estimate is within
    3 standard errors, and the stated error is the binomial one (about 1/sqrt(held))."""
    rng = np.random.default_rng(1)
    ids = rng.integers(-(2**62), 2**62, 300_000)
    stream = np.concatenate([ids, ids[: 100_000], ids[:20_000]])
    rng.shuffle(stream)
    c = DistinctCounter(bound=4096)
    for block in np.array_split(stream, 50):
        c.add(block)
    assert not c.exact and c.ids.size <= 4096
    assert abs(c.distinct() - 300_000) <= 3 * c.stderr()
    assert c.stderr() / c.distinct() == pytest.approx(1 / math.sqrt(c.ids.size), rel=0.05)
    assert abs(c.distinct(min_count=2) - 100_000) <= 3 * c.stderr(2)
    assert abs(c.distinct(min_count=3) - 20_000) <= 3 * c.stderr(3)


def test_profile_of_a_large_cardinality_column_states_its_estimate(tmp_path):
    n = 60_000
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"label": np.zeros(n, np.int64), "item": np.arange(n) * 7 + 3}), path)
    cfg = from_dict({"data": {"format": "parquet", "train": str(path), "batch_size": 100},
                     "schema": {"labels": ["label"], "sparse": [{"name": "item"}]}, "model": {"type": "lr"}})
    s = profile_data(cfg, exact_bound=2048)["sparse"]["item"]["distinct"]
    assert not s["exact"] and "1 in" in s["method"]
    assert abs(s["value"] - n) <= 3 * s["stderr"]
    assert abs(s["value"] - n) / n <= s["relative_error_95"] * 1.6  # within ~3 sigma of the stated 95 % error


def test_sketches_merge_and_heavy_hitters_bound():
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, 50_000, 40_000), rng.integers(25_000, 90_000, 40_000)
    ca, cb, both = DistinctCounter(1024), DistinctCounter(1024), DistinctCounter(1024)
    ca.add(a), cb.add(b), both.add(np.concatenate([a, b]))
    ca.merge(cb)
    assert ca.level == both.level and np.array_equal(ca.ids, both.ids) and np.array_equal(ca.counts, both.counts)
    z = rng.zipf(1.3, 100_000)
    h = HeavyHitters(capacity=32)
    for block in np.array_split(z, 20):
        h.add(block)
    truth = Counter(z.tolist())
    for i, n in h.top(5):
        assert truth[i] - h.error <= n <= truth[i]
    assert [i for i, _ in h.top(3)] == [i for i, _ in truth.most_common(3)]
    assert h.error <= z.size / 33
    s = BottomK(k=500, seed=0)
    s.add(rng.random(20_000))
    assert not s.exact and abs(s.quantiles([0.5])[0] - 0.5) < 0.08


def test_shared_table_counts_the_union_of_its_features(tmp_path):
    n = 2000
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 900, n), rng.integers(500, 1500, n)
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"label": np.ones(n, np.int64), "a": a, "b": b}), path)
    cfg = from_dict({"data": {"format": "parquet", "train": str(path), "batch_size": 100},
                     "schema": {"labels": ["label"], "sparse": [{"name": "a", "table": "ids", "hash_ids": False},
                                                                {"name": "b", "table": "ids", "hash_ids": False}]},
                     "model": {"type": "lr"}})
    p = profile_data(cfg)
    assert p["sparse"]["a"]["distinct"]["value"] == len(set(a)) and p["sparse"]["b"]["distinct"]["value"] == len(set(b))
    assert p["tables"]["ids"]["distinct"]["value"] == len(set(a) | set(b))
    assert p["sparse"]["a"]["top"][0]["value"] == str(Counter(a.tolist()).most_common(1)[0][0])


def test_written_profile_is_strict_json_of_the_documented_shape(tmp_path):
    path, _ = _data(tmp_path)
    p = profile_data(from_dict(_config(tmp_path, path)), config_path="x.yaml")
    files = write_profile(p, tmp_path / "out")
    assert [f.name for f in files] == ["profile.json", "profile.txt", "profile.png"]
    raw = json.loads(files[0].read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert raw["format"] == FORMAT and raw["version"] == VERSION and raw["config"] == "x.yaml"
    assert set(raw) == {"format", "version", "config", "data", "bad_rows", "labels", "sparse", "dense", "tables"}
    assert set(raw["sparse"]["user"]) == {"table", "column", "multi_hot", "values", "missing_rows", "missing_rate",
                                          "values_per_row", "distinct", "top"}
    assert set(raw["dense"]["price"]) == {"column", "present", "missing", "missing_rate", "min", "max", "mean",
                                          "quantiles", "quantiles_exact"}
    assert set(raw["tables"]["user"]) == {"features", "distinct", "sample_rate", "frequencies", "frequency_cap"}
    assert files[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and files[2].stat().st_size > 10_000
    assert "label label: rate" in files[1].read_text()
    assert read_profile(tmp_path / "out") == raw


def _cli_config(tmp_path: Path) -> Path:
    path, _ = _data(tmp_path)
    cfg = tmp_path / "p.yaml"
    cfg.write_text(yaml.safe_dump(_config(tmp_path, path)))
    return cfg


def test_cli_writes_replaces_only_its_own_profile_and_refuses_other_paths(tmp_path, capsys):
    cfg = _cli_config(tmp_path)
    out = tmp_path / "prof"
    assert main(["profile", "--config", str(cfg), "--out", str(out), "--rows", "500"]) == 0
    printed = capsys.readouterr().out
    assert "sparse feature" in printed and f"wrote {out / 'profile.json'}" in printed
    assert json.loads((out / "profile.json").read_text())["data"]["rows_read"] == 500
    assert main(["profile", "--config", str(cfg), "--out", str(out)]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    (out / "mine.txt").write_text("kept")
    assert main(["profile", "--config", str(cfg), "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / "profile.json").read_text())["data"]["rows_read"] == N
    assert (out / "mine.txt").read_text() == "kept"  # nothing else in the directory is touched
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    assert main(["profile", "--config", str(cfg), "--out", str(other), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "ember profile: error: --out" in err and "did not write" in err and "Traceback" not in err
    assert sorted(p.name for p in other.iterdir()) == ["todo.txt"]
    run = tmp_path / "runs" / "old"
    (run / "checkpoints").mkdir(parents=True)
    assert main(["profile", "--config", str(cfg), "--out", str(run), "--overwrite"]) == 2
    assert "holds a training run" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["--rows", "0"], "--rows must be >= 1, got 0"),
    (["--top", "0"], "--top must be >= 1, got 0"),
    (["data.train=nowhere/*.csv"], "matches no csv file"),
])
def test_cli_mistakes_are_one_error_line(tmp_path, capsys, argv, says):
    cfg = _cli_config(tmp_path)
    assert main(["profile", "--config", str(cfg), "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("ember profile: error: ")
    assert says in err


def test_real_criteo_sample_profile(tmp_path):
    data = shared_data_dir() / "criteo" / "train.tsv"
    if not data.exists():
        pytest.skip(f"the Criteo sample is not at {data} (set EMBER_DATA_DIR)")
    cfg = load(REPO / "configs" / "criteo.yaml", [f"data.train={data}"])
    p = profile_data(cfg)
    names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
    t = pacsv.read_csv(data, read_options=pacsv.ReadOptions(column_names=names),
                       parse_options=pacsv.ParseOptions(delimiter="\t"),
                       convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names}))
    assert p["data"]["rows"] == t.num_rows == 7200 and p["bad_rows"]["total"] == 0
    assert p["labels"]["label"]["positives"] == 1549  # the data README's clicks
    for c in ("C3", "C19", "C22"):
        col = np.array(t[c].to_pylist(), dtype=object)
        present = [v for v in col if v not in (None, "")]
        assert p["sparse"][c]["distinct"]["value"] == len(set(present)), c
        assert p["sparse"][c]["missing_rows"] == len(col) - len(present), c
        assert [(t["value"], t["count"]) for t in p["sparse"][c]["top"][:3]] == Counter(present).most_common(3), c
    i5 = np.array([float(v) for v in t["I5"].to_pylist() if v not in (None, "")])
    assert p["dense"]["I5"]["max"] == i5.max() and p["dense"]["I5"]["mean"] == pytest.approx(i5.mean())


def test_a_watched_directory_is_profiled_as_it_is_now(tmp_path):
    (tmp_path / "incoming").mkdir()
    _data(tmp_path / "incoming")  # the directory an online run watches
    raw = _config(tmp_path, tmp_path / "incoming")
    raw["data"]["watch"] = {}
    raw["train"]["mode"] = "online"
    p = profile_data(from_dict(raw))
    assert p["data"]["rows_read"] == N and p["bad_rows"]["total"] == 3


def test_ids_stored_as_another_type_in_a_later_file_are_profiled_as_training_hashes_them(tmp_path):
    # training brings a text "4" to the first file's integer 4 (one ID): so does the profile
    i = np.arange(40)
    pq.write_table(pa.table({"label": i % 2, "user": pa.array(i % 7, pa.int64())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"label": i % 2, "user": pa.array([str(v) for v in 5 + i % 4])}), tmp_path / "b.parquet")
    cfg = _config(tmp_path, tmp_path / "a.parquet", schema={"labels": ["label"], "sparse": [{"name": "user"}]})
    cfg["data"].update(format="parquet", train=[str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")])
    s = profile_data(from_dict(cfg))["sparse"]["user"]
    assert s["distinct"]["value"] == 9 and s["values"] == 80
    counts = Counter((i % 7).tolist()) + Counter((5 + i % 4).tolist())  # 7 and 8 first seen as text
    assert {int(t["value"]): t["count"] for t in s["top"]} == {k: v for k, v in counts.most_common(len(s["top"]))}
