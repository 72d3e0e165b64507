"""uniform01_tensor: the counter-based initialiser as tensor operations, bit for bit the native kernel's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import _native
from ember._native.init import _uniform01_py
from ember.embedding.init import init_keys, uniform01_tensor


def _cases(n: int = 500):
    rng = np.random.default_rng(0)
    ids = rng.integers(-(2**63), 2**63 - 1, size=n, dtype=np.int64, endpoint=True)
    ids[:4] = [0, -1, 2**63 - 1, -(2**63)]
    s = rng.uniform(0.01, 1.0, size=n)
    per_row = ((2 * s).astype(np.float32), (-s).astype(np.float32))
    for dim in (1, 16, 33):
        for keys in (init_keys(7), init_keys(rng.integers(0, 1 << 62, size=n))):
            for mul, add in ((1.0, 0.0), (0.25, -0.125), per_row):
                yield ids, keys, dim, mul, add


def _tensor(ids, keys, dim, mul, add, device: str) -> np.ndarray:
    t = lambda x: torch.from_numpy(x).to(device) if isinstance(x, np.ndarray) else x  # noqa: E731
    return uniform01_tensor(t(ids), t(keys.view(np.int64)), dim, t(mul), t(add)).cpu().numpy()


@pytest.mark.parametrize("native", [True, False])
def test_the_same_bits_as_the_native_kernel_and_its_numpy_reference(native: bool) -> None:
    for ids, keys, dim, mul, add in _cases():
        ref = np.empty((ids.size, dim), np.float32)
        (_native.uniform01 if native else _uniform01_py)(ids, keys, dim, ref, mul, add)
        assert np.array_equal(_tensor(ids, keys, dim, mul, add, "cpu").view(np.uint32), ref.view(np.uint32))


@pytest.mark.gpu
def test_the_same_bits_on_a_gpu() -> None:
    for ids, keys, dim, mul, add in _cases():
        ref = np.empty((ids.size, dim), np.float32)
        _uniform01_py(ids, keys, dim, ref, mul, add)
        assert np.array_equal(_tensor(ids, keys, dim, mul, add, "cuda").view(np.uint32), ref.view(np.uint32))
