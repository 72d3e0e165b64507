"""Shared fixtures and resource markers (gpu / data skip themselves when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """../shared/data beside the checkout, or $EMBER_DATA_DIR."""
    env = os.environ.get("EMBER_DATA_DIR")
    return Path(env) if env else REPO.parent / "shared" / "data"


@pytest.hookimpl(tryfirst=True)  # before -m selects on the markers added here
def pytest_collection_modifyitems(config, items):  # noqa: D103
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    skip_dist = pytest.mark.skip(reason="needs torch.distributed with gloo")
    has_gloo = torch.distributed.is_available() and torch.distributed.is_gloo_available()
    distributed = REPO / "tests" / "distributed"
    for item in items:
        if "dist" in item.keywords or distributed in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.serial)  # `make test` runs these alone, after the others
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "dist" in item.keywords and not has_gloo:
            item.add_marker(skip_dist)


@pytest.fixture(autouse=True)
def _seeded_random_streams():
    """Every test starts from the same random state, whatever ran before it in its process: a
    statistical check that passes once passes on every run and under any split of the suite."""
    import random

    import numpy as np

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(params=["unpadded", "padded"])
def padding(request, monkeypatch):
    """A storage.index: device test twice: its fetch as a CPU runs it, and padded to a bucket with
    the padding masked, the function a GPU captures as a CUDA graph (small buckets: the size moves
    between buckets as batches do). Returns which."""
    if request.param == "padded":
        from ember.embedding import mapped_fetch

        monkeypatch.setattr(mapped_fetch, "PAD_ON_CPU", True)
        monkeypatch.setattr(mapped_fetch, "MIN_BUCKET", 32)
    return request.param
