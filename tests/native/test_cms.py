"""The count-min sketch kernel (_native.cms) equals its numpy fallback, saturation included."""

from __future__ import annotations

import numpy as np
import pytest

from ember import _native
from ember.tiers.policy import _SEEDS, CountMinSketch

pytestmark = pytest.mark.skipif(not _native.is_available(), reason="the native core is not built (or EMBER_NATIVE=0)")


@pytest.mark.parametrize("depth", [1, 4])
def test_native_sketch_equals_the_numpy_one(depth):
    rng = np.random.default_rng(0)
    native = np.zeros((depth, 256), dtype=np.uint16)
    ref = native.copy()
    for step in range(20):
        ids = rng.integers(-(2**62), 2**62, 300) if step % 2 else rng.integers(0, 50, 300)  # repeats and cell clashes
        counts = rng.integers(0, 9000 if step > 15 else 5, 300)  # the last steps reach the 65,535 ceiling
        a, b = np.empty(300, np.int64), np.empty(300, np.int64)
        _native.cms(native, ids, counts, _SEEDS[:depth], a)
        _native._cms_py(ref, ids, counts, _SEEDS[:depth], b)
        assert np.array_equal(native, ref) and np.array_equal(a, b), step
    assert native.max() == 65535  # saturated, not wrapped
    e1, e2 = np.empty(40, np.int64), np.empty(40, np.int64)
    probe = rng.integers(0, 100, 40)
    _native.cms(native, probe, None, _SEEDS[:depth], e1)
    _native._cms_py(ref, probe, None, _SEEDS[:depth], e2)
    assert np.array_equal(e1, e2)


def test_sketch_never_undercounts():
    s = CountMinSketch(width=64)
    ids = np.repeat(np.arange(200), 3)
    s.add(ids)
    assert (s.estimate(np.arange(200)) >= 3).all()
