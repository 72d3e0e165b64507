"""Host memory the GPU reads and writes in place: a device view of pinned host rows.

With unified virtual addressing (every 64-bit CUDA platform), page-locked host memory is mapped
into the device's address space: a kernel can gather from it and scatter into it over PCIe, with
no host thread copying rows. ``device_view`` wraps such memory as a CUDA tensor (through the CUDA
array interface), so ordinary tensor operations (``index_select``, ``index_copy_``) on the view
read and write the host rows, ordered on the CUDA stream like any other kernel. Together with a
device-resident index (``ember.tiers.device_index``) a step can fetch rows held in host memory
without the host touching an ID.

On a CPU device the view is the host tensor itself, so the same code runs (and is tested) there.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["device_view"]

# the CUDA array interface has no bf16: a bf16 tensor is viewed through the int16 of its bits
_TYPESTR = {torch.float32: "<f4", torch.int64: "<i8", torch.int32: "<i4", torch.int16: "<i2", torch.uint8: "|u1"}


class _Interface:
    """The CUDA array interface of a pinned host tensor (it keeps the tensor alive: the view holds it)."""

    def __init__(self, host: Tensor) -> None:
        self.host = host
        self.__cuda_array_interface__ = {
            "shape": tuple(host.shape), "strides": tuple(s * host.element_size() for s in host.stride()),
            "typestr": _TYPESTR[host.dtype], "data": (host.data_ptr(), False), "version": 3, "stream": None,
        }


def device_view(host: Tensor, device: str | torch.device) -> Tensor:
    """A tensor on ``device`` over the memory of ``host`` (no copy): on a GPU, ``host`` must be
    pinned (``pin_memory=True``); on a CPU device, ``host`` itself. Writes through the view land
    in ``host`` once the device has run them (synchronise, or wait for an event, before the host
    reads them)."""
    device = torch.device(device)
    if device.type == "cpu":
        return host
    if device.type != "cuda":
        raise ValueError(f"device_view: a view for {device.type!r} is not supported (cpu or cuda)")
    if host.device.type != "cpu" or not host.is_pinned():
        raise ValueError("device_view: the host tensor must be in pinned host memory (torch.empty(..., pin_memory=True)), "
                         f"got {'a pageable' if host.device.type == 'cpu' else host.device.type} tensor")
    if host.dtype == torch.bfloat16:
        return device_view(host.view(torch.int16), device).view(torch.bfloat16)
    if host.dtype not in _TYPESTR:
        raise ValueError(f"device_view: dtype {host.dtype} is not supported ({', '.join(map(str, _TYPESTR))}, bfloat16)")
    with torch.cuda.device(device):
        return torch.as_tensor(_Interface(host), device=device)

