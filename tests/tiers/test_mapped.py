"""device_view: a device tensor over pinned host rows. On a CPU device it is the host tensor; on
a GPU its gathers read, and its scatters write, the host memory in place (checked where CUDA is)."""

from __future__ import annotations

import pytest
import torch

from ember.tiers.mapped import device_view


def test_on_a_cpu_device_the_view_is_the_host_tensor() -> None:
    host = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    view = device_view(host, "cpu")
    view.index_copy_(0, torch.tensor([2]), torch.full((1, 3), -1.0))
    assert view is host and host[2].tolist() == [-1.0, -1.0, -1.0]


def test_other_devices_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'meta' is not supported"):
        device_view(torch.zeros(2), "meta")


@pytest.mark.gpu
def test_pageable_host_memory_is_refused() -> None:
    with pytest.raises(ValueError, match="pinned host memory"):
        device_view(torch.zeros(4, 2), "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_a_gpu_gathers_and_scatters_host_rows_in_place(dtype: torch.dtype) -> None:
    host = torch.arange(4000, dtype=torch.float32).reshape(1000, 4).to(dtype).pin_memory()
    view = device_view(host, "cuda")
    assert view.is_cuda and view.data_ptr() == host.data_ptr() and view.shape == host.shape
    idx = torch.tensor([999, 3, 3, 0, 512], device="cuda")
    assert torch.equal(view.index_select(0, idx).cpu(), host[idx.cpu()])
    vals = torch.full((2, 4), 7, dtype=dtype, device="cuda")
    view.index_copy_(0, torch.tensor([5, 6], device="cuda"), vals)
    torch.cuda.synchronize()
    assert (host[5:7] == 7).all() and host[4, 0] == 16 and host[7, 0] == 28
    del host  # the view keeps the host memory alive
    assert view.index_select(0, torch.tensor([5], device="cuda")).cpu().tolist() == [[7, 7, 7, 7]]
