"""Growable arrays: a memory tier's arena and metadata grow in place once large (no copy of the
rows held), small ones as ordinary arrays, and where the address range cannot be reserved they
grow by copying, said once."""

from __future__ import annotations

import logging
import mmap

import numpy as np
import pytest
import torch

from ember import once
from ember.tiers import growable
from ember.tiers.growable import Growable
from ember.tiers.host import HostTier

pytestmark = pytest.mark.skipif(not growable._MAP_NORESERVE, reason="address-range reservations are Linux-only here")


@pytest.fixture
def reserve_all(monkeypatch):
    monkeypatch.setattr(growable, "SMALL_BYTES", 0)  # every array reserved from its first row


def test_growth_within_the_reservation_keeps_the_address_and_the_rows(reserve_all):
    g = Growable(8, 5, np.float32, max_rows=4096)
    assert g.reserved and not g.array.any()
    g.array[:] = np.arange(40, dtype=np.float32).reshape(8, 5)
    at = g.array.ctypes.data
    for rows in (9, 100, 4096):
        a = g.grow(rows)
        assert a.shape == (rows, 5) and a.ctypes.data == at  # widened in place: nothing copied
        np.testing.assert_array_equal(a[:8], np.arange(40, dtype=np.float32).reshape(8, 5))
        assert not a[8:].any()  # new rows are zero
    beyond = g.grow(5000)  # past the reservation: a copy, the rows kept
    assert beyond.shape == (5000, 5) and not g.reserved
    np.testing.assert_array_equal(beyond[:8], np.arange(40, dtype=np.float32).reshape(8, 5))
    assert not beyond[8:].any()


def test_a_small_array_grows_on_the_heap_until_it_is_large(monkeypatch):
    monkeypatch.setattr(growable, "SMALL_BYTES", 4096)
    g = Growable(16, 4, np.float32, max_rows=100_000)
    g.array[:] = 3.0
    assert not g.reserved and g.grow(200).shape == (200, 4) and not g.reserved  # 3,200 bytes: a copy
    big = g.grow(300)  # 4,800 bytes: reserved, the rows moved there once
    assert g.reserved and (big[:16] == 3.0).all() and not big[16:].any()
    assert g.grow(90_000).ctypes.data == big.ctypes.data
    first = Growable(1000, 4, np.float32, max_rows=100_000)  # large from the start: reserved at once, all zero
    assert first.reserved and first.array.shape == (1000, 4) and not first.array.any()
    at = first.array.ctypes.data
    assert first.grow(50_000).ctypes.data == at


def test_a_host_tier_grows_without_moving_its_rows(reserve_all):
    """From 1,024 slots to 200,000: the arena and every metadata array keep their address (the
    rows are never copied, so no moment needs 3x their memory), and every row reads back."""
    t = HostTier(record_dim=3)
    first = {k: v.array.ctypes.data for k, v in t._grown.items()}
    ids = torch.arange(200_000, dtype=torch.int64) * 7 - 3
    rows = torch.arange(600_000, dtype=torch.float32).view(200_000, 3)
    for a in range(0, 200_000, 20_000):
        t.put(ids[a : a + 20_000], rows[a : a + 20_000])
    assert t._arena.shape[0] >= 200_000
    assert {k: v.array.ctypes.data for k, v in t._grown.items()} == first
    assert t._arena.data_ptr() == first["arena"]
    out = torch.zeros(200_000, 3)
    assert bool(t.get_into(ids, out).all()) and torch.equal(out, rows)


def test_a_refused_reservation_grows_by_copying_and_says_so_once(monkeypatch, caplog, reserve_all):
    def refuse(*a, **k):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refuse)
    once.forget("growable.reserve")
    with caplog.at_level(logging.INFO, logger="ember.tiers"):
        t = HostTier(record_dim=2)
        u = HostTier(record_dim=2)
    lines = [r.getMessage() for r in caplog.records if "grow by copying" in r.getMessage()]
    assert len(lines) == 1 and "could not be reserved" in lines[0]
    assert not any(g.reserved for g in t._grown.values() if g is not None)
    ids = torch.arange(5000, dtype=torch.int64)
    t.put(ids, torch.ones(5000, 2))
    u.put(ids[:3], torch.zeros(3, 2))
    out = torch.zeros(5000, 2)
    assert bool(t.get_into(ids, out).all()) and bool((out == 1).all()) and t._arena.shape[0] >= 5000
