"""The Python API refuses a wrong argument naming it (a TypeError / ValueError in our words),
never with an AttributeError or KeyError from deep inside, and never by reading it wrongly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ember.batch import SparseFeatures
from ember.config import from_dict
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig
from ember.errors import CapacityError, ConfigError
from ember.pipeline.loader import make_batches
from ember.tiers.storage import StorageConfig, plan_storage
from ember.train.loop import train

SMALL = {"data": {"preset": "synthetic", "synthetic": {"rows": 64, "eval_rows": 32, "num_sparse": 2, "num_dense": 1}},
         "model": {"type": "lr"}}


def test_embedding_collection_takes_config_dicts_and_names_what_else_it_was_given():
    ec = EmbeddingCollection([{"name": "t", "dim": 4}], [{"name": "u", "table": "t"}])
    sf = SparseFeatures(["u"], torch.tensor([1, 2]), torch.tensor([1, 1]))
    assert ec(sf)["u"].shape == (2, 4)
    with pytest.raises(TypeError, match=r"tables must be TableConfigs \(or dicts of their keys\), got \['str'\]"):
        EmbeddingCollection(["t"], [FeatureConfig(name="u", table="t")])
    with pytest.raises(ConfigError, match=r"'feature.pooling': Input should be"):
        EmbeddingCollection([TableConfig(name="t", dim=4)], [{"name": "u", "table": "t", "pooling": "max2"}])
    with pytest.raises(KeyError, match=r"concat: no feature 'u' in what it was given \(\[\]\)"):
        ec.concat({})
    with pytest.raises(TypeError, match=r"SparseOptimizer steps EmbeddingCollections, got \['Linear'\]"):
        SparseOptimizer(torch.nn.Linear(2, 2))


def test_train_make_batches_and_plan_storage_name_a_wrong_argument(tmp_path):
    cfg = from_dict({**SMALL, "train": {"out_dir": str(tmp_path), "progress": False}})
    with pytest.raises(TypeError, match="train takes a RunConfig, got str: ember.config.load"):
        train("run.yaml")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="batches must be ember.batch.Batch objects"):
        train(cfg, batches=[1, 2])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="takes a DataConfig and a Schema .* got DataConfig and NoneType"):
        make_batches(cfg.data, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epoch must be >= 0, got -1"):
        make_batches(cfg.data, cfg.schema, epoch=-1)
    assert plan_storage({"host_rows": 10}, 17).tiers == plan_storage(StorageConfig(host_rows=10), 17).tiers
    with pytest.raises(CapacityError, match=r"table 'C1': storage.host_bytes = 10 bytes cannot hold one row of 5 floats"):
        plan_storage(StorageConfig(host_bytes=10), 5, "C1")
    for dim in (-5, 0, 2.5):
        with pytest.raises(ValueError, match=f"record_dim must be a whole number of floats >= 1, got {dim}"):
            plan_storage(StorageConfig(host_rows=10), dim)  # type: ignore[arg-type]


def test_predictor_takes_one_path_or_paths_and_says_what_a_row_must_be(tmp_path):
    from ember.cli import main
    from ember.serving import Predictor

    export, rows = tmp_path / "export", tmp_path / "rows.parquet"
    cfg = tmp_path / "run.yaml"
    import yaml

    cfg.write_text(yaml.safe_dump({**SMALL, "embedding": {"dim": 4},
                                   "train": {"out_dir": str(tmp_path), "run_name": "r", "progress": False}}))
    assert main(["train", "--config", str(cfg), "--export", str(export)]) == 0
    assert main(["generate", "--out", str(rows), "--rows", "5", "--options", '{"num_sparse": 2, "num_dense": 1}']) == 0
    p = Predictor.load(export)
    listed = p.predict_files([str(rows)])
    assert listed.shape == (5, 1)
    assert (p.predict_files(str(rows)) == listed).all() and (p.predict_files(Path(rows)) == listed).all()
    assert (p.predict_files([Path(rows)]) == listed).all()
    with pytest.raises(ConfigError, match=r"format 'json' is not one of csv\|tsv\|parquet\|orc"):
        p.predict_files([str(rows)], format="json")
    with pytest.raises(TypeError, match=r"keep must be column names .* got 5"):
        p.predict_table([str(rows)], keep=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"takes a list of rows .* got dict; wrap one row in a list"):
        p.predict_records({"I1": 3})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"takes a list of rows .* got NoneType"):
        p.predict_records(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"rows\[1\] is a int, not a mapping"):
        p.predict_records([{"I1": 3}, 2])  # type: ignore[list-item]
