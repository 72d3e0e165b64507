"""DeviceBudget counts device ops and device->host syncs: on CPU by provenance from marked tensors
(the arena in host memory), on CUDA by device; .numpy()/.tolist() patched only while active."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from ember.tiers import device_budget
from ember.tiers.device_budget import DeviceBudget, active, mark_device, to_device

IDX = torch.tensor([0, 2, 3])


def _arena() -> torch.Tensor:
    return torch.arange(40, dtype=torch.float32).reshape(10, 4)


def test_index_select_counts_one_op_and_marks_its_output() -> None:
    a = _arena()
    with DeviceBudget("cpu") as b:
        b.mark(a)
        rows = a.index_select(0, IDX)
        assert b.ops == 1, b.report()
        assert b.is_device(rows)
        assert not b.is_device(IDX)
    assert b.op_names == {"index_select": 1}
    assert b.syncs == 0 and b.downloads == 0


def test_chain_of_three_ops_counts_three() -> None:
    a = _arena()
    with DeviceBudget("cpu") as b:
        b.mark(a)
        x = a.index_select(0, IDX)
        y = x * 2
        z = y.sum(1)
    assert b.ops == 3, b.report()
    assert b.is_device(z)
    assert b.syncs == 0


def test_views_are_not_counted() -> None:
    a = _arena()
    with DeviceBudget("cpu") as b:
        b.mark(a)
        v = a[2:5, :2].t().unsqueeze(0).squeeze(0).expand(2, -1, -1)
        a.reshape(-1, 2).view(-1)
        a.split(3)
        a.unbind(0)
        a.detach().select(0, 1).permute(0)
        a.transpose(0, 1)
        torch.empty_like(a)
        a.new_empty(3)
    assert b.ops == 0, b.report()
    assert b.is_device(v)
    with DeviceBudget("cpu") as b2:
        b2.mark(a)
        a.t().reshape(-1)  # not a view: a copy
    assert b2.op_names == {"clone": 1}, b2.report()
    v.sum()  # marks outlive the mode, counting does not
    assert b.ops == 0


def test_empty_like_of_device_data_is_device_memory() -> None:
    a = _arena()
    with DeviceBudget("cpu") as b:
        b.mark(a)
        e = torch.empty_like(a)
        assert b.ops == 0
        e.fill_(1.0)
    assert b.ops == 1, b.report()


def test_upload_into_marked_destination_counts_one_op() -> None:
    dst = torch.zeros(10, 4)
    host = torch.ones(10, 4)
    with DeviceBudget("cpu") as b:
        mark_device(dst)
        dst.copy_(host, non_blocking=True)
        dst.index_copy_(0, IDX, host[:3])
    assert b.ops == 2, b.report()
    assert b.syncs == 0 and b.downloads == 0
    assert b.op_names == {"copy_": 1, "index_copy_": 1}


def test_a_blocking_upload_is_a_sync() -> None:
    """PyTorch waits for the stream after a copy from the host that is not non-blocking: the
    host stalls until every queued operation has run, as for a download."""
    dst = torch.zeros(10, 4)
    with DeviceBudget("cpu") as b:
        mark_device(dst)
        dst.copy_(torch.ones(10, 4))
        up = to_device(torch.ones(3), torch.device("cpu"))  # (the library's way: non-blocking)
    assert (b.ops, b.syncs) == (2, 1), b.report()
    assert b.sync_names == {"copy_": 1} and b.is_device(up)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_blocking_upload_to_cuda_is_a_sync() -> None:
    host = torch.ones(1000)
    with DeviceBudget("cuda") as b:
        host.to("cuda")  # (pageable, blocking: PyTorch synchronises the stream after it)
    with DeviceBudget("cuda") as nb:
        host.pin_memory().to("cuda", non_blocking=True)
    assert b.syncs == 1 and nb.syncs == 0, (b.report(), nb.report())


@pytest.mark.parametrize("read", [
    lambda t: t[1].item(),
    lambda t: bool(t[1]),
    lambda t: int(t[1]),
    lambda t: float(t[1]),
    lambda t: t.tolist(),
    lambda t: t.numpy(),
    lambda t: np.asarray(t),
    lambda t: torch.nonzero(t),
    lambda t: torch.unique(t),
    lambda t: t[t > 2],  # boolean mask: nonzero inside (also counts the comparison op)
    lambda t: torch.masked_select(t, t > 2),
    lambda t: torch.equal(t, t),
    lambda t: torch.empty(4).copy_(t),  # a blocking copy to the host
    lambda t: torch.repeat_interleave(t.long()),  # output size is sum(repeats)
], ids=["item", "bool", "int", "float", "tolist", "numpy", "asarray", "nonzero", "unique", "mask", "masked_select",
        "equal", "blocking_copy", "repeat_interleave"])
def test_each_host_read_of_device_data_is_one_sync(read) -> None:
    t = torch.tensor([1.0, 0.0, 3.0, 4.0])
    with DeviceBudget("cpu") as b:
        b.mark(t)
        read(t)
    assert b.syncs == 1, b.report()
    assert b.downloads == 0


def test_host_reads_of_host_data_are_not_syncs() -> None:
    t = torch.tensor([1.0, 0.0, 3.0, 4.0])
    with DeviceBudget("cpu") as b:
        t[1].item(), t.tolist(), t.numpy(), torch.nonzero(t), torch.unique(t), t * 2, t.index_select(0, IDX)
        torch.empty(4).copy_(t)
    assert (b.ops, b.syncs, b.downloads) == (0, 0, 0), b.report()


def test_nonblocking_copy_to_host_is_a_download_not_a_sync() -> None:
    t = torch.tensor([1.0, 0.0, 3.0, 4.0])
    host = torch.empty(4)
    with DeviceBudget("cpu") as b:
        b.mark(t)
        host.copy_(t, non_blocking=True)
        assert not b.is_device(host)  # a download's output is host memory
        host.numpy()
        repeat = torch.repeat_interleave(torch.arange(4), t.long(), output_size=8)  # output size given: no sync
    assert b.downloads == 1
    assert b.syncs == 0, b.report()
    assert b.is_device(repeat)


def test_backward_ops_are_counted() -> None:
    leaf = _arena().requires_grad_()
    with DeviceBudget("cpu") as b:
        b.mark(leaf)
        rows = leaf.index_select(0, IDX)
        forward = b.ops
        cot = torch.ones(3, 4)
        b.mark(cot)
        torch.autograd.backward([rows], [cot])
    assert forward == 1
    backward = b.ops - forward
    assert backward >= 2, b.report()  # index_select's backward: zeros + index_add
    assert b.op_names["index_add"] == 1, b.report()
    assert b.syncs == 0
    assert b.is_device(leaf.grad)
    assert torch.equal(leaf.grad[IDX], torch.ones(3, 4))


def test_backward_from_a_device_loss() -> None:
    leaf = _arena().requires_grad_()
    with DeviceBudget("cpu") as b:
        b.mark(leaf)
        loss = leaf.index_select(0, IDX).sum()
        before = b.ops
        loss.backward()  # the seed gradient is a ones_like of the (device) loss
    assert b.ops - before >= 3, b.report()
    assert b.syncs == 0


def test_patched_methods_are_restored() -> None:
    numpy, tolist = torch.Tensor.numpy, torch.Tensor.tolist
    with DeviceBudget("cpu"):
        assert torch.Tensor.numpy is not numpy
        with DeviceBudget("cpu"):  # nested: restored only when the outer one ends
            pass
        assert torch.Tensor.numpy is not numpy and active() is not None
    assert torch.Tensor.numpy is numpy and torch.Tensor.tolist is tolist
    with pytest.raises(ZeroDivisionError):
        with DeviceBudget("cpu"):
            1 / 0
    assert torch.Tensor.numpy is numpy and torch.Tensor.tolist is tolist
    assert active() is None and device_budget._stack == []


def test_nested_budgets_both_count() -> None:
    a = _arena()
    with DeviceBudget("cpu") as outer:
        with DeviceBudget("cpu") as inner:
            assert active() is inner
            mark_device(a)
            a.index_select(0, IDX).tolist()
        assert active() is outer
    assert (inner.ops, inner.syncs) == (1, 1), inner.report()
    assert (outer.ops, outer.syncs) == (1, 1), outer.report()


def test_mark_device_without_a_budget_is_a_noop() -> None:
    a = _arena()
    assert active() is None
    mark_device(a)
    with DeviceBudget("cpu") as b:
        a.index_select(0, IDX)
    assert b.ops == 0 and not b.is_device(a)


def test_a_freed_storage_is_forgotten() -> None:
    """A storage freed and its address reused by a new one: the new one is not device data."""
    b = DeviceBudget("cpu")
    a, c = torch.zeros(1000), torch.zeros(1000)
    b.mark(a)
    ptr_a, ptr_c = a.untyped_storage().data_ptr(), c.untyped_storage().data_ptr()
    b._marked[ptr_c] = b._marked.pop(ptr_a)  # as if c had been allocated where a was
    assert b.is_device(c)  # (a still alive: the entry is live)
    del a
    gc.collect()
    assert not b.is_device(c)
    assert ptr_c not in b._marked  # the dead entry is dropped


def test_empty_tensors_are_marked_by_identity() -> None:
    a, other = torch.zeros(0, 4), torch.zeros(0, 4)
    with DeviceBudget("cpu") as b:
        b.mark(a)
        a.sum(0)
        other.sum(0)
    assert b.ops == 1, b.report()


def test_report_names_ops_and_syncs() -> None:
    a = _arena()
    with DeviceBudget("cpu") as b:
        b.mark(a)
        a.index_select(0, IDX).sum().item()
    line = b.report()
    assert "3 device ops, 1 syncs" in line and "index_select x1" in line and "_local_scalar_dense x1" in line
    assert "\n" not in line


def test_bad_device_says_what_to_pass() -> None:
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        DeviceBudget("meta")


@pytest.mark.gpu
def test_cuda_budget() -> None:
    dev = torch.device("cuda")
    a = torch.randn(100, 8, device=dev)
    idx = torch.tensor([1, 5, 7], device=dev)
    host = torch.empty(3, 8).pin_memory()
    with DeviceBudget(dev) as b:
        rows = a.index_select(0, idx)  # 1 op
        rows.view(-1)  # a view: nothing
        up = torch.ones(3, 8).to(dev, non_blocking=True)  # an upload: 1 op
        rows.add_(up)  # 1 op
        host.copy_(rows, non_blocking=True)  # a download into pinned memory: 1 op, no sync
        (torch.ones(3) * 2).sum()  # host ops: nothing
    assert b.ops == 4, b.report()
    assert (b.syncs, b.downloads) == (0, 1), b.report()
    with DeviceBudget(dev) as b:
        rows.sum().item()  # a sync
        rows.cpu()  # a blocking copy: a sync
        rows.tolist()  # a sync
        torch.nonzero(rows)  # a sync
    assert b.syncs == 4, b.report()
    leaf = a.clone().requires_grad_()
    with DeviceBudget(dev) as b:
        leaf.index_select(0, idx).sum().backward()  # backward runs on the engine's device thread
    assert b.op_names["index_add"] == 1, b.report()
    assert b.syncs == 0, b.report()


def test_a_launch_the_dispatcher_does_not_see_is_counted_once_per_budget() -> None:
    """A CUDA graph's replay is one launch of everything it captured: ``count_launch`` counts it
    on every active budget (outer ones too), and is nothing without one."""
    device_budget.count_launch("cuda graph")  # (no budget: nothing)
    with DeviceBudget("cpu") as outer:
        with DeviceBudget("cpu") as inner:
            device_budget.count_launch("cuda graph")
    assert (outer.ops, inner.ops) == (1, 1) and inner.op_names == {"cuda graph": 1}
