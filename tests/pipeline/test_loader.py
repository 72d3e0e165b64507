import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ember.errors import DataError
from ember.featurize.presets import preset_schema
from ember.featurize.schema import Schema
from ember.pipeline.loader import make_batches, write_synthetic
from ember.source.config import SHUFFLE_BUFFER_ROWS, DataConfig, SyntheticOptions

SMALL = {"rows": 1000, "eval_rows": 300, "num_dense": 3, "num_sparse": 4, "multi_hot": {"C2": 3}}


def _flat(batches):
    return [(b.labels.clone(), b.dense.clone(), b.sparse.values.clone(), b.sparse.lengths.clone()) for b in batches]


def _same(a, b):
    return len(a) == len(b) and all(all(torch.equal(x, y) for x, y in zip(p, q)) for p, q in zip(a, b))


def _parquet_dir(tmp_path, n_files=3, rows=400):
    schema = Schema.parse({"labels": ["y"], "dense": [{"name": "d"}], "sparse": [{"name": "c"}]})
    for f in range(n_files):
        i = np.arange(f * rows, (f + 1) * rows)
        pq.write_table(pa.table({"y": (i % 3 == 0).astype(np.int8), "d": i.astype(float),
                                 "c": [f"v{k % 50}" for k in i]}), tmp_path / f"part-{f}.parquet")
    return schema


def test_synthetic_resume_equals_uninterrupted():
    data = DataConfig(batch_size=128, synthetic=SMALL)
    schema = preset_schema("synthetic", data)
    full = _flat(make_batches(data, schema, "train"))
    assert len(full) == 8
    assert _same(_flat(make_batches(data, schema, "train", start_batch=5)), full[5:])
    loader = make_batches(data, schema, "eval")
    assert [b.size for b in loader] == [128, 128, 44] and loader.num_batches == 3


def test_files_shuffle_is_deterministic_and_resumable(tmp_path):
    schema = _parquet_dir(tmp_path)
    data = DataConfig(format="parquet", train=str(tmp_path), batch_size=100, shuffle_buffer=150, read_rows=64, seed=7)
    a = _flat(make_batches(data, schema, "train", epoch=0))
    assert _same(a, _flat(make_batches(data, schema, "train", epoch=0)))
    assert _same(_flat(make_batches(data, schema, "train", epoch=0, start_batch=7)), a[7:])
    b = _flat(make_batches(data, schema, "train", epoch=1))
    assert not _same(a, b)  # a new epoch reshuffles
    dense = torch.cat([x[1] for x in a])[:, 0]
    assert sorted(dense.tolist()) == list(map(float, range(1200)))  # every row exactly once
    assert not torch.equal(dense, torch.sort(dense).values)
    unshuffled = _flat(make_batches(data.model_copy(update={"shuffle_buffer": 0}), schema, "train"))
    assert torch.cat([x[1] for x in unshuffled])[:, 0].tolist() == list(map(float, range(1200)))


def test_training_rows_are_shuffled_by_default_and_eval_keeps_file_order(tmp_path):
    schema = _parquet_dir(tmp_path, n_files=2, rows=300)
    data = DataConfig(format="parquet", train=str(tmp_path), eval=str(tmp_path), batch_size=128)
    assert data.shuffle_buffer == SHUFFLE_BUFFER_ROWS == 1_000_000
    in_order = _flat(make_batches(data.model_copy(update={"shuffle_buffer": 0}), schema, "train"))
    shuffled = _flat(make_batches(data, schema, "train"))
    again = _flat(make_batches(data, schema, "train"))
    other_seed = _flat(make_batches(data.model_copy(update={"seed": 1}), schema, "train"))
    assert _same(shuffled, again) and not _same(shuffled, in_order) and not _same(shuffled, other_seed)
    row_ids = torch.cat([x[1] for x in shuffled])[:, 0]  # column d numbers the rows of the files
    assert sorted(row_ids.tolist()) == list(map(float, range(600)))  # every row once, in another order
    assert _same(_flat(make_batches(data, schema, "eval")), in_order)


def test_drop_last_and_eval_batch_size(tmp_path):
    schema = _parquet_dir(tmp_path, n_files=1, rows=250)
    data = DataConfig(format="parquet", train=str(tmp_path), eval=str(tmp_path), batch_size=100,
                      eval_batch_size=200, drop_last=True)
    assert [b.size for b in make_batches(data, schema, "train")] == [100, 100]
    assert [b.size for b in make_batches(data, schema, "eval")] == [200, 50]


@pytest.mark.parametrize("fmt", ["csv", "tsv", "parquet", "orc"])
def test_write_synthetic_reads_back_identically(tmp_path, fmt):
    opts = SyntheticOptions(**SMALL)
    path = str(tmp_path / f"s.{fmt}")
    assert write_synthetic(path, fmt, 500, opts, chunk_rows=128) == [path]
    data = DataConfig(format=fmt, train=path, batch_size=200, synthetic=opts, shuffle_buffer=0)  # file order
    mem = DataConfig(batch_size=200, synthetic={**SMALL, "rows": 500})
    schema = preset_schema("synthetic", opts)
    assert _same(_flat(make_batches(data, schema, "train")), _flat(make_batches(mem, schema, "train")))


def test_bad_rows_error_and_skip_through_loader(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("y,d,c\n1,1,a\n0,zz,b\n1,2,c,d\n1,3\n,4,e\n1,5,f\n")
    schema = Schema.parse({"labels": ["y"], "dense": [{"name": "d"}], "sparse": [{"name": "c"}]})
    data = DataConfig(format="csv", train=str(p), batch_size=10)
    with pytest.raises(DataError) as e:
        list(make_batches(data, schema, "train"))
    assert f"{p} row 3, column 'd'" in str(e.value) and "'zz'" in str(e.value)
    loader = make_batches(data.model_copy(update={"on_bad_rows": "skip"}), schema, "train")
    (batch,) = list(loader)
    assert batch.dense[:, 0].tolist() == [1.0, 5.0]
    assert loader.bad_rows.counts == {"<row>: wrong number of fields": 2, "d: not a number": 1,
                                      "y: label is missing": 1}


def test_thread_errors_reach_the_consumer(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("y,c\n" + "1,a\n" * 10 + "7,a\n")
    schema = Schema.parse({"labels": ["y"], "sparse": [{"name": "c"}]})
    data = DataConfig(format="csv", train=str(p), batch_size=2)
    with pytest.raises(DataError, match=r"row 12, column 'y': label is not in \[0, 1\]"):
        list(make_batches(data, schema, "train", threaded=True))


def test_early_exit_stops_cleanly():
    data = DataConfig(batch_size=10, synthetic=SMALL)
    loader = make_batches(data, preset_schema("synthetic", data), "train", threaded=True)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert loader.position == (0, 3)


def _data_dir() -> Path:
    env = os.environ.get("EMBER_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


@pytest.mark.data
def test_real_criteo_with_preset():
    path = _data_dir() / "criteo" / "train.tsv"
    if not path.exists():
        pytest.skip(f"{path} not found (set EMBER_DATA_DIR)")
    data = DataConfig.parse({"preset": "criteo", "train": str(path), "batch_size": 2048})
    loader = make_batches(data, preset_schema("criteo"), "train")
    batches = list(loader)
    labels = torch.cat([b.labels for b in batches])
    assert labels.shape == (7200, 1) and abs(float(labels.mean()) - 0.215) < 0.002
    assert loader.bad_rows.total == 0
    b = batches[0]
    b.sparse.validate()
    assert b.dense.shape == (2048, 13) and float(b.dense.min()) >= 0  # log1p of counts clipped at 0
    assert b.sparse.keys == tuple(f"C{i}" for i in range(1, 27))
    # C1 is never missing; C22 is missing in most rows (empty bag), per the data's README: the
    # preset lists "" in missing_values; without, the empty field is a category (one ID per row)
    lengths = b.sparse.lengths.view(26, -1)
    assert bool((lengths[0] == 1).all()) and float((lengths[21] == 0).float().mean()) > 0.6
    schema = preset_schema("criteo").model_copy(update={"missing_values": []})
    lengths = next(iter(make_batches(data, schema, "train"))).sparse.lengths.view(26, -1)
    assert bool((lengths == 1).all())


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_list_columns_with_weights_through_loader(tmp_path, fmt):
    import pyarrow.orc as orc

    t = pa.table({
        "y": pa.array([1, 0, 1], pa.int8()),
        "tags": pa.array([["a", "b", "c"], [], ["b"]], pa.list_(pa.string())),
        "w": pa.array([[0.5, 2.0, 3.0], [], [4.0]], pa.list_(pa.float64())),
    })
    path = str(tmp_path / f"t.{fmt}")
    pq.write_table(t, path) if fmt == "parquet" else orc.write_table(t, path)
    schema = Schema.parse({"labels": ["y"], "sparse": [{"name": "tags", "weight_column": "w", "max_length": 2}]})
    (b,) = list(make_batches(DataConfig(format=fmt, train=path, batch_size=8, shuffle_buffer=0), schema, "train"))
    assert b.sparse.lengths.tolist() == [2, 0, 1]
    assert b.sparse.weights.tolist() == [0.5, 2.0, 4.0]
    assert b.sparse.values[0] != b.sparse.values[1] and b.sparse.values[1] == b.sparse.values[2]


def test_rank_slice_generates_and_featurizes_only_the_ranks_slice():
    """Synthetic data under data.shard: rows: rank r's loader makes exactly slice r of every
    global batch (DistributedRun.local_rows), a partial last batch leaving rank 0 no row."""
    from types import SimpleNamespace

    from ember.distributed.process_group import DistributedRun
    from ember.pipeline.loader import RankSlice

    data = DataConfig(batch_size=15, synthetic={**SMALL, "rows": 47, "multi_hot": {"C2": 3}})
    schema = preset_schema("synthetic", data.synthetic)
    full = list(make_batches(data, schema, "train", start_batch=1))
    for r in range(3):
        mine = list(make_batches(data, schema, "train", start_batch=1, rank_slice=(r, 3)))
        assert all(isinstance(m, RankSlice) for m in mine)
        assert [m.rows for m in mine] == [b.size for b in full] == [15, 15, 2]
        for m, b in zip(mine, full):
            want = b.slice_rows(*DistributedRun.local_rows(SimpleNamespace(data_slice=(r, 3)), b.size))
            assert _same(_flat([m.batch]), _flat([want]))
    assert [m.batch.size for m in make_batches(data, schema, "train", rank_slice=(0, 3))] == [5, 5, 5, 0]


def _typed_ids(tmp_path, first, second):
    """Two Parquet files of the same rows, their ID column stored as ``first`` / ``second``."""
    i = np.arange(60)
    ids = {"int": pa.array(i % 7), "string": pa.array([str(k) for k in i % 7])}
    for name, t in (("a", first), ("b", second)):
        pq.write_table(pa.table({"y": (i % 2).astype(np.int8), "c": ids[t]}), tmp_path / f"{name}.parquet")
    return [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]


@pytest.mark.parametrize("first,second", [("int", "string"), ("string", "int")])
def test_ids_stored_as_another_type_hash_as_in_the_first_training_file(tmp_path, caplog, first, second):
    # serving brings 4 and "4" to the training type; train and eval bring every file to the first's
    from ember import once

    once.forget("featurizer.id_type")
    schema = Schema.parse({"labels": ["y"], "sparse": [{"name": "c"}]})
    files = _typed_ids(tmp_path, first, second)
    data = DataConfig(format="parquet", train=files[0], eval=files, batch_size=60)
    with caplog.at_level("WARNING", logger="ember"):
        a, b = list(make_batches(data, schema, "eval"))
    assert torch.equal(a.sparse.values, b.sparse.values)
    (said,) = [r.getMessage() for r in caplog.records if "ID column 'c'" in r.getMessage()]
    assert f"is {second} in some files but {first} in the first training file" in said and files[0] in said
    # the train split too, and what the first file holds keeps its own hashing
    mixed = list(make_batches(DataConfig(format="parquet", train=files[::-1], batch_size=60), schema))
    alone = list(make_batches(DataConfig(format="parquet", train=files[1], batch_size=60), schema))
    ids = sorted(v for b in mixed for v in b.sparse.values.tolist())  # (rows shuffled across the files)
    assert ids == sorted(alone[0].sparse.values.tolist() * 2)


def test_an_id_of_no_integer_in_a_text_file_is_a_bad_row_when_the_first_file_has_integers(tmp_path):
    schema = Schema.parse({"labels": ["y"], "sparse": [{"name": "c"}]})
    files = _typed_ids(tmp_path, "int", "string")
    pq.write_table(pa.table({"y": pa.array([0, 1], pa.int8()), "c": ["3", "x9"]}), tmp_path / "b.parquet")
    data = DataConfig(format="parquet", train=files[0], eval=files[1], batch_size=60)
    with pytest.raises(DataError, match=r"b.parquet row 2, column 'c': ID cannot be read as int, .* first training file, got 'x9'"):
        list(make_batches(data, schema, "eval"))
    loader = make_batches(data.model_copy(update={"on_bad_rows": "skip"}), schema, "eval")
    (b,) = list(loader)
    assert b.labels.shape[0] == 1 and loader.bad_rows.total == 1
