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

# Everything else loads on first use (``ember.Batch``, ``from ember import TableConfig``): a bare
# ``import ember`` stays cheap and does not load torch, and the block above still runs first.
_EXPORTS = {
    "Batch": "ember.batch",
    "SparseFeatures": "ember.batch",
    "EmbeddingCollection": "ember.embedding",
    "EmbeddingTable": "ember.embedding",
    "FeatureConfig": "ember.embedding",
    "TableConfig": "ember.embedding",
    "SparseOptimizer": "ember.embedding",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> object:
    """Import a public name (or a subpackage such as ``ember.featurize``) on first access."""
    import importlib
    import importlib.util

    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # the import binds it in globals()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
