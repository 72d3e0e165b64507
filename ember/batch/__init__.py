"""Batch types: dense floats, jagged sparse IDs keyed by feature, labels."""

from ember.batch.batch import Batch
from ember.batch.sparse import JaggedFeature, SparseFeatures

__all__ = ["Batch", "JaggedFeature", "SparseFeatures"]
