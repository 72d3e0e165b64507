"""HostTier.get_into (one native pass straight into a caller's buffer) equals get + copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ember import _native
from ember.tiers import HostTier


@pytest.mark.parametrize("native", [True, False])
def test_get_into_equals_get(native):
    if native and not _native.is_available():
        pytest.skip("native core not built")
    g = torch.Generator().manual_seed(0)
    a, b = HostTier(5, capacity=500, policy="lfu"), HostTier(5, capacity=500, policy="lfu")
    if not native:
        b._index._core = None  # the numpy path of the same tier
    ids = torch.randint(-(2**40), 2**40, (400,), generator=g).unique()
    rec = torch.randn(ids.numel(), 5, generator=g)
    for t in (a, b):
        t.put(ids, rec)
    query = torch.cat([ids[::3], torch.tensor([7, 8, 9])])  # some absent
    rows, found = a.get(query)
    out = torch.full((query.numel(), 5), -1.0)
    found2 = b.get_into(query, out)
    assert torch.equal(found, found2)
    assert torch.equal(out[found2], rows[found]) and bool((out[~found2] == -1).all())  # absent rows untouched
    assert np.array_equal(a._count, b._count) and np.array_equal(a._last, b._last)  # same policy state
    assert a.stats() == b.stats()
    # the slots it found serve the put that follows (no second probe needed, same result)
    b.put(query[found2], out[found2] * 2)
    again, _ = b.get(query[found2])
    assert torch.equal(again, rows[found] * 2)
