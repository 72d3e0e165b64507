"""One FeatureConfig: the schema's SparseFeature extends it with the data side, and the run config
hands the embedding side the FeatureConfig view of each feature."""

from __future__ import annotations


import pytest

from ember.config import RunConfig, from_dict
from ember.embedding.config import FeatureConfig
from ember.errors import ConfigError
from ember.featurize.schema import Schema, SparseFeature


def test_sparse_feature_extends_the_one_feature_config():
    import ember.embedding
    import ember.featurize.schema

    assert issubclass(SparseFeature, FeatureConfig)
    assert ember.embedding.FeatureConfig is FeatureConfig is ember.featurize.schema.FeatureConfig
    for key in ("name", "table", "pooling", "max_length"):
        ours, theirs = SparseFeature.model_fields[key], FeatureConfig.model_fields[key]
        assert (ours.annotation, ours.default, ours.metadata, ours.description) == \
            (theirs.annotation, theirs.default, theirs.metadata, theirs.description), key
    f = SparseFeature(name="tags", separator="|", pooling="mean", max_length=3)
    assert (f.table_name, f.source_column, f.salt_value) == ("tags", "tags", "tags")
    assert SparseFeature(name="b", table="a").table_name == "a"


def test_sparse_feature_validation_messages():
    for bad, msg in [({"name": "a", "pooling": "max"}, "'sum', 'mean', 'sqrtn' or 'sequence'"),
                     ({"name": "a", "max_length": 0}, "greater than 0"),
                     ({"name": "a", "tabel": "x"}, "did you mean 'table'"),
                     ({"name": "a", "separator": ""}, "separator must not be empty")]:
        with pytest.raises(ConfigError, match=msg):
            Schema.parse({"labels": "y", "sparse": [bad]})


def test_run_config_features_are_embedding_feature_configs():
    cfg: RunConfig = from_dict({
        "data": {"preset": "synthetic"},
        "schema": {"labels": ["y"], "sparse": [{"name": "a", "pooling": "mean", "max_length": 4, "separator": "|"},
                                              {"name": "b", "table": "a"}]},
        "model": {"type": "dlrm"},
    })
    feats = cfg.features()
    assert all(type(f) is FeatureConfig for f in feats)
    assert [(f.name, f.table, f.pooling, f.max_length) for f in feats] == [("a", "a", "mean", 4), ("b", "a", "sum", None)]
    assert cfg.schema.sparse[1].embedding_feature() == feats[1]
    assert [t.name for t in cfg.table_configs()] == ["a"]
