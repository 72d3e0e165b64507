"""ember: train sparse recommendation models whose embedding tables outgrow device memory.

Data flow: source (files / synthetic) -> featurize (schema, hashed IDs) -> Batch ->
embedding (dedupe, KeyIndex, tiers, pooling) -> model -> loss/backward ->
sparse optimizer on touched rows -> metrics, checkpoint, export.
"""

__version__ = "0.1.0"

from ember.batch import Batch, SparseFeatures
from ember.embedding import EmbeddingCollection, EmbeddingTable, FeatureConfig, TableConfig

__all__ = ["Batch", "SparseFeatures", "EmbeddingCollection", "EmbeddingTable", "FeatureConfig", "TableConfig"]
