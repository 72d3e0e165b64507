"""Columns -> model inputs: schema, stable hashing of categorical values, dense transforms,
presets (criteo, synthetic) and the featurizer that turns record batches into rows."""

from ember.featurize.featurizer import Featurizer
from ember.featurize.hashing import hash_array, hash_ints, hash_strings
from ember.featurize.presets import preset_data_defaults, preset_schema
from ember.featurize.rows import Rows
from ember.featurize.schema import DenseFeature, Schema, SparseFeature

__all__ = [
    "Featurizer",
    "Rows",
    "Schema",
    "DenseFeature",
    "SparseFeature",
    "hash_array",
    "hash_ints",
    "hash_strings",
    "preset_schema",
    "preset_data_defaults",
]
