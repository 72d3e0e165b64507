"""Batch: every field survives the row-wise maps (slice_rows, to, pin_memory)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ember.batch import Batch
from ember.batch.sparse import SparseFeatures


def _full_batch(b: int = 4) -> Batch:
    """A batch with every field set (each field a distinct, row-numbered value)."""
    sparse = SparseFeatures(["a"], torch.arange(b, dtype=torch.int64), torch.ones(b, dtype=torch.int64))
    values = {"dense": torch.arange(b * 2, dtype=torch.float32).view(b, 2), "sparse": sparse,
              "labels": torch.arange(b, dtype=torch.float32).view(b, 1) % 2,
              "teacher": torch.arange(b, dtype=torch.float32).view(b, 1) / b,
              "keys": {"user": np.arange(b) * 10}}
    missing = {f.name for f in dataclasses.fields(Batch)} - set(values)
    assert not missing, f"the test's batch does not set Batch fields {missing}: add them here"
    return Batch(**values)


def test_slice_rows_keeps_every_field():
    batch = _full_batch()
    part = batch.slice_rows(1, 3)
    for f in dataclasses.fields(Batch):
        whole, got = getattr(batch, f.name), getattr(part, f.name)
        assert got is not None, f"Batch.slice_rows dropped '{f.name}'"
        if isinstance(whole, SparseFeatures):
            assert got.values.tolist() == [1, 2] and got.lengths.tolist() == [1, 1]
        elif f.name == "keys":  # host arrays of raw columns, sliced alike
            assert got["user"].tolist() == [10, 20]
        else:
            torch.testing.assert_close(got, whole[1:3])
    assert part.size == 2


def test_to_keeps_every_field_and_none_stays_none():
    batch = _full_batch()
    moved = batch.to("cpu")
    assert all(getattr(moved, f.name) is not None for f in dataclasses.fields(Batch))
    bare = dataclasses.replace(batch, teacher=None)
    assert bare.slice_rows(0, 2).teacher is None and bare.to("cpu").teacher is None


def test_a_field_without_a_row_map_is_refused():
    odd = dataclasses.replace(_full_batch(), teacher="not a tensor")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Batch.teacher"):
        odd.slice_rows(0, 1)


@pytest.mark.gpu
def test_pin_memory_leaves_a_batch_already_on_the_gpu_as_it_is():
    # train(cfg, batches=...) with batches already moved to the GPU: the device stage pins first
    batch = _full_batch().to("cuda")
    pinned = batch.pin_memory()
    assert pinned.dense.data_ptr() == batch.dense.data_ptr()
    assert pinned.sparse.values.data_ptr() == batch.sparse.values.data_ptr()
    host = _full_batch().pin_memory()
    assert host.dense.is_pinned() and host.sparse.values.is_pinned()
