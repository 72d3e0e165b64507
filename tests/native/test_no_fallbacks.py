"""With the native core on, the CPU training and evaluation paths take no fallback.

Every kernel of ``ember._native`` has a numpy/torch reference (``_<name>_py``) that runs when the
core is off or an input is one the kernel does not take. A path that reaches a reference while
the core is on has lost its fast path without a word (the single-hot pooling once did: a
row-strided view of the records failed the gather's contiguity check). These tests train and
evaluate the usual table set-ups with every reference wrapped, and require that none ran.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections import Counter

import numpy as np
import pytest
import torch

from ember import _native
from ember.batch import SparseFeatures
from ember.embedding import EmbeddingCollection, FeatureConfig, SparseOptimizer, TableConfig

pytestmark = pytest.mark.skipif(not _native.is_available(), reason="ember native core not available (not built, or EMBER_NATIVE=0)")

F, B, D = 4, 2048, 8  # a batch large enough that the kernels split over threads


@pytest.fixture
def fallbacks(monkeypatch) -> Counter:
    """Calls of every ``ember._native`` reference (``_*_py``) while the test runs."""
    calls: Counter = Counter()
    for info in pkgutil.iter_modules(_native.__path__):
        mod = importlib.import_module(f"ember._native.{info.name}")
        for name in dir(mod):
            ref = getattr(mod, name)
            if name.startswith("_") and name.endswith("_py") and callable(ref):
                def counted(*args, _ref=ref, _name=f"{info.name}.{name}", **kwargs):
                    calls[_name] += 1
                    return _ref(*args, **kwargs)
                monkeypatch.setattr(mod, name, counted)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(_native, "MIN_PART_ROWS", 256)
    return calls


def _tables(tmp_path, setup: str) -> list[TableConfig]:
    opt = {"type": "rowwise_adagrad", "lr": 0.05}
    extra: dict = {}
    if setup == "bf16":
        extra["dtype"] = "bf16"
    if setup == "tiers":  # a host cache in front of a disk tier (each table its own file)
        return [TableConfig(name=f"t{i}", dim=D, optimizer=opt,
                            storage={"host_rows": 512, "disk_path": str(tmp_path / f"t{i}"), "disk_rows": 4096})
                for i in range(F)]
    return [TableConfig(name=f"t{i}", dim=D, optimizer=opt, **extra,
                        **({"initializer": {"type": "uniform", "scale": 0.1 * (i + 1)}} if setup == "mixed-init" else {}))
            for i in range(F)]


def _batch(rng: np.random.Generator, hot: int) -> SparseFeatures:
    lengths = torch.from_numpy(rng.integers(1, hot + 1, F * B)) if hot > 1 else torch.ones(F * B, dtype=torch.int64)
    values = torch.from_numpy(rng.zipf(1.2, int(lengths.sum())) % 20_000)
    return SparseFeatures([f"f{i}" for i in range(F)], values, lengths)


@pytest.mark.parametrize("setup,hot,pooling", [("plain", 1, "sum"), ("bf16", 1, "sum"), ("mixed-init", 1, "sum"),
                                               ("plain", 3, "mean"), ("tiers", 1, "sum")])
def test_training_and_evaluation_take_no_fallback(setup, hot, pooling, fallbacks, tmp_path):
    ec = EmbeddingCollection(_tables(tmp_path, setup),
                             [FeatureConfig(name=f"f{i}", table=f"t{i}", pooling=pooling) for i in range(F)])
    opt = SparseOptimizer(ec)
    rng = np.random.default_rng(0)
    for _ in range(4):
        out = ec(_batch(rng, hot))
        sum((v * (i + 1)).sum() for i, v in enumerate(out.values())).backward()
        opt.step()
    with torch.no_grad():
        ec.eval()(_batch(rng, hot))
    assert not fallbacks, f"fast paths not taken with the native core on: {dict(fallbacks)}"


def test_the_wrapper_sees_a_fallback(fallbacks):
    """(The check can fail: a float64 gather is one the core does not take.)"""
    _native.take_rows(torch.randn(10, 4, dtype=torch.float64), torch.tensor([1, 2]))
    assert fallbacks == Counter({"sparse._take_rows_py": 1})
