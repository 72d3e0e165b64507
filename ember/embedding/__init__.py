"""Embedding tables with dynamic vocabulary, in groups; pooling; the autograd boundary;
the sparse optimizer that trains them."""

from ember.embedding.collection import EmbeddingCollection, Lookup
from ember.embedding.config import FeatureConfig, PoolingMode, TableConfig
from ember.embedding.group import GroupLookup, TableGroup
from ember.embedding.init import InitializerConfig, init_rows, table_seed
from ember.embedding.optimizer import SparseOptimizer
from ember.embedding.pooling import SequenceEmbedding, pool_feature
from ember.embedding.table import EmbeddingTable

__all__ = [
    "EmbeddingCollection",
    "EmbeddingTable",
    "FeatureConfig",
    "GroupLookup",
    "InitializerConfig",
    "Lookup",
    "PoolingMode",
    "SequenceEmbedding",
    "SparseOptimizer",
    "TableConfig",
    "TableGroup",
    "init_rows",
    "pool_feature",
    "table_seed",
]
