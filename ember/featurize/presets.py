"""Ready-made schemas and data defaults: ``criteo`` (Kaggle TSV) and ``synthetic`` (built in).

Example:
    >>> s = preset_schema("criteo")
    >>> s.labels, s.dense[0].name, s.dense[0].clip, s.sparse[25].table_name
    (['label'], 'I1', (0.0, None), 'C26')
    >>> preset_data_defaults("criteo")["format"]
    'tsv'
    >>> len(preset_schema("synthetic", SyntheticOptions(num_dense=2, num_sparse=3)).sparse)
    3
"""

from __future__ import annotations

import copy
from typing import Any

from ember.errors import ConfigError
from ember.featurize.schema import DenseFeature, Schema, SparseFeature
from ember.source.config import PRESET_DATA_DEFAULTS, DataConfig, SyntheticOptions
from ember.source.synthetic import synthetic_columns

__all__ = ["PRESETS", "preset_schema", "preset_data_defaults", "criteo_schema", "synthetic_schema"]

PRESETS = ("criteo", "synthetic")


def criteo_schema() -> Schema:
    """label; I1..I13 dense (missing -> 0, clip at min 0, log1p); C1..C26 hashed, own tables; an
    empty C field is missing (no ID), as the dataset defines it ("when a value is missing, the
    field is empty"), not the category ``""``."""
    dense = [DenseFeature(name=f"I{i}", fill=0.0, clip=(0.0, None), log1p=True) for i in range(1, 14)]
    sparse = [SparseFeature(name=f"C{i}") for i in range(1, 27)]
    return Schema(labels=["label"], dense=dense, sparse=sparse, missing_values=[""])


def synthetic_schema(options: SyntheticOptions | None = None) -> Schema:
    """The generator's columns: counts I* with log1p; C* already IDs (``hash_ids: false``);
    multi-hot features joined with ``|`` when written to CSV, list columns otherwise."""
    options = options or SyntheticOptions()
    dense_names, sparse_names = synthetic_columns(options)
    dense = [DenseFeature(name=n, log1p=True) for n in dense_names]
    sparse = [
        SparseFeature(name=n, hash_ids=False, separator="|" if n in options.multi_hot else None)
        for n in sparse_names
    ]
    return Schema(labels=["label"], dense=dense, sparse=sparse)


def preset_schema(name: str, options: SyntheticOptions | DataConfig | None = None) -> Schema:
    """Schema of preset ``name``; ``options`` (or a DataConfig's ``synthetic``) shapes ``synthetic``."""
    if isinstance(options, DataConfig):
        options = options.synthetic
    if name == "criteo":
        return criteo_schema()
    if name == "synthetic":
        return synthetic_schema(options)
    raise ConfigError(f"unknown data preset '{name}'; presets are {list(PRESETS)}")


def preset_data_defaults(name: str) -> dict[str, Any]:
    """DataConfig keys preset ``name`` sets (explicit keys in the config win)."""
    if not isinstance(name, str) or name not in PRESET_DATA_DEFAULTS:
        raise ConfigError(f"data.preset: unknown data preset {name!r}; presets are {list(PRESETS)}")
    return copy.deepcopy(PRESET_DATA_DEFAULTS[name])
