"""Embedding tables with dynamic vocabulary, pooling, and the autograd boundary."""

from ember.embedding.collection import EmbeddingCollection, SequenceEmbedding, TableLookup
from ember.embedding.config import FeatureConfig, PoolingMode, TableConfig
from ember.embedding.init import InitializerConfig, init_rows
from ember.embedding.table import EmbeddingTable

__all__ = [
    "EmbeddingCollection",
    "EmbeddingTable",
    "FeatureConfig",
    "InitializerConfig",
    "PoolingMode",
    "SequenceEmbedding",
    "TableConfig",
    "TableLookup",
    "init_rows",
]
