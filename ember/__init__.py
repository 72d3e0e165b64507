"""ember: train sparse recommendation models whose embedding tables outgrow device memory.

Data flow: source (files / synthetic) -> featurize (schema, hashed IDs) -> Batch ->
embedding (dedupe, KeyIndex, tiers, pooling) -> model -> loss/backward ->
sparse optimizer on touched rows -> metrics, checkpoint, export.
"""

__version__ = "0.1.0"

import os as _os
import sys as _sys

# torch's OpenMP workers (GNU libgomp) busy-wait after each parallel op for GOMP_SPINCOUNT
# spins (300,000 by default: ~10-20 ms), holding the cores on which ember's native sparse
# kernels run between torch ops. A short spin gives them back (measured in bench/bench_dlrm.py).
# libgomp reads this once, when torch loads: so only when torch is not imported yet and the
# user chose no OpenMP wait policy of their own.
if "torch" not in _sys.modules and not {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"} & set(_os.environ):
    _os.environ["GOMP_SPINCOUNT"] = "10000"

from ember.batch import Batch, SparseFeatures
from ember.embedding import EmbeddingCollection, EmbeddingTable, FeatureConfig, TableConfig

__all__ = ["Batch", "SparseFeatures", "EmbeddingCollection", "EmbeddingTable", "FeatureConfig", "TableConfig"]
