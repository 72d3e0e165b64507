"""Counting what a step costs the device: operations launched on device data, and syncs.

A GPU embedding cache should launch a small, fixed number of operations per table group and
step, and never wait for the device (a device->host synchronisation stalls the CPU until every
queued kernel has run). ``DeviceBudget`` is the instrument that checks it, in tests and benches::

    with DeviceBudget("cpu") as budget:
        budget.mark(arena)               # on a CPU "device": declare which memory is the device's
        step()
    assert budget.syncs == 0, budget.report()

What counts as device data:

- ``DeviceBudget("cuda")``: every CUDA tensor.
- ``DeviceBudget("cpu")`` (the arena in host memory, as on every CPU machine): only tensors
  marked with ``mark`` / ``mark_device``, and transitively every output of a counted operation
  with a marked input (views share their storage, so are marked too). Writing into a marked
  tensor (``dst.copy_(host)``, ``index_copy_``) is a device operation: that is an upload.

``ops`` counts every dispatched operation that reads or writes device data, except views,
metadata-only operations and allocations (``empty*``: allocating launches nothing); copies,
downloads and syncs are operations too. ``syncs`` counts device->host synchronisations
(``.item()``, ``bool(t)``, ``nonzero``, ``unique``, boolean-mask indexing, a blocking copy to
the host, a blocking copy from the host (PyTorch waits for the stream after it: write uploads
as ``to_device`` or ``dst.copy_(pinned, non_blocking=True)``), and on a CPU arena ``.numpy()`` /
``.tolist()`` of a marked tensor). ``downloads``
counts explicit non-blocking copies to a host tensor (``host.copy_(dev, non_blocking=True)``):
allowed, and not syncs. On a CPU arena ``Tensor.to(...)`` of device data stays on the device
(its output is marked): write a download as ``host.copy_(dev, non_blocking=True)``.

Ops the autograd engine runs for ``backward()`` are counted too (the dispatch mode is thread
state that the engine carries to the threads it runs on). Native code that reads a tensor's
memory without the dispatcher (``_native`` kernels on ``.numpy()`` views) is invisible, except
for the ``.numpy()`` call itself. Only for tests and benchmarks: every op pays a Python call.
"""

from __future__ import annotations

import collections
import contextlib
import weakref
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["to_device", "pinned", "upload", "upload_parts", "DeviceBudget", "count_launch", "mark_device", "one_launch",
           "active"]

# views and metadata-only ops (no kernel; views share the input's storage, so stay marked)
_METADATA = frozenset({
    "view", "slice", "split", "split_with_sizes", "unbind", "t", "detach", "alias", "_reshape_alias", "as_strided",
    "expand", "unsqueeze", "squeeze", "select", "permute", "transpose", "narrow", "_unsafe_view", "lift_fresh",
    "view_as_real", "view_as_complex", "diagonal", "unfold", "chunk", "tensor_split", "movedim", "_conj", "_neg_view",
    "set_", "record_stream", "is_pinned", "is_same_size", "is_coalesced", "_nnz", "sparse_dim", "dense_dim", "size",
    "stride", "numel", "dim", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_contiguous",
    "_has_compatible_shallow_copy_type", "_values", "_indices", "values", "indices", "crow_indices", "col_indices",
})
# allocations: nothing launched, but the memory is the device's (an ``empty_like`` of device data)
_ALLOC_PREFIXES = ("empty", "new_empty", "resize_", "_resize_output_")
# data-dependent output shape or a scalar read back: the host waits for the device
_SYNC = frozenset({
    "_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero", "masked_select", "argwhere", "bincount",
    "unique_consecutive", "unique_dim", "unique_dim_consecutive", "_unique", "_unique2", "coalesce", "_coalesce",
    "allclose", "histc",
})

_OTHER, _META, _ALLOC, _SYNCOP, _COPY, _TO_COPY, _INDEX, _REPEAT = range(8)


def _kind(func: Any) -> int:
    name = func.overloadpacket.__name__
    if name in _METADATA:
        return _META
    if name.startswith(_ALLOC_PREFIXES):
        return _ALLOC
    if name in _SYNC or name.startswith("unique"):
        return _SYNCOP
    if name == "copy_":
        return _COPY
    if name == "_to_copy":
        return _TO_COPY
    if name in ("index", "index_put_", "index_put", "_index_put_impl_"):
        return _INDEX  # a sync when an index is a boolean mask (nonzero inside)
    if name == "repeat_interleave":
        return _REPEAT  # a sync when the output size is not given
    returns = func._schema.returns
    if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
        return _META  # any other view (an output aliasing an input, unwritten)
    return _OTHER


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors among ``args`` and ``kwargs`` values, one level of list/tuple deep (aten's
    ``Tensor[]`` and ``Tensor?[]`` arguments)."""
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


_stack: list["DeviceBudget"] = []  # active budgets, innermost last
_innermost: "DeviceBudget | None" = None  # _stack[-1]: one global read for mark_device
_saved: dict[str, Callable] = {}  # the original Tensor.numpy / Tensor.tolist while patched


def active() -> "DeviceBudget | None":
    """The innermost active ``DeviceBudget``, or None."""
    return _innermost


def mark_device(*tensors: torch.Tensor) -> None:
    """Declare ``tensors`` device memory on the active ``DeviceBudget`` (e.g. a cache's arena on a
    CPU machine); nothing without one (one global read: cheap enough to leave in library code)."""
    if _innermost is not None:
        for b in _stack:  # outer budgets see the same device memory
            b.mark(*tensors)


def count_launch(name: str) -> None:
    """Count one device operation the dispatcher does not see (a CUDA graph's replay: one launch
    of everything it captured) on every active ``DeviceBudget``; nothing without one."""
    if _innermost is not None:
        for b in _stack:
            b._op(name)


@contextlib.contextmanager
def one_launch(name: str) -> Iterator[None]:
    """Count what runs inside as one device operation on every active budget (what a CUDA
    graph's replay of it is: a CPU check of a step a GPU replays). Syncs inside still count
    (a graph cannot hold one)."""
    if _innermost is None:
        yield
        return
    saved = [(b, b.ops, b.op_names.copy()) for b in _stack]
    try:
        yield
    finally:
        for b, ops, names in saved:
            b.ops, b.op_names = ops, names
            b._op(name)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t.to(device, non_blocking=True)``, the one way library code copies host data to the
    device a step computes on. With a CPU device under an active ``DeviceBudget`` the copy is
    made (and marked) rather than skipped, so the check on a CPU machine sees every upload a
    GPU would run; otherwise it is ``Tensor.to``."""
    if _innermost is not None and device.type == "cpu" and t.device.type == "cpu":
        out = torch.empty_like(t)
        mark_device(out)
        return out.copy_(t, non_blocking=True)
    return t.to(device, non_blocking=True)


def pinned(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host tensor ``t`` in pinned memory when ``device`` is a GPU (what a copy there takes without
    a wait; from pageable memory a copy stages through the driver), else itself."""
    return t.pin_memory() if device.type == "cuda" else t


def upload(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device`` without a wait: ``to_device`` through pinned memory."""
    return to_device(pinned(t, device), device)


def upload_parts(parts: "list[torch.Tensor]", device: torch.device) -> list[torch.Tensor]:
    """int64 host tensors on ``device`` in one upload (one buffer, pinned on a GPU), split back."""
    if not parts:
        return []
    buf = torch.empty(sum(p.numel() for p in parts), dtype=torch.int64, pin_memory=device.type == "cuda")
    torch.cat(parts, out=buf)
    return list(to_device(buf, device).split([p.numel() for p in parts]))


def start_download(t: torch.Tensor) -> "tuple[torch.Tensor, torch.cuda.Event | None]":
    """A device tensor's copy to host memory, started now without a wait: the host tensor (pinned
    on a GPU) and, on a GPU, the event that says it arrived (None elsewhere: it has)."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda")
    host.copy_(t, non_blocking=True)
    if t.device.type != "cuda":
        return host, None
    event = torch.cuda.Event()
    event.record()
    return host, event


def download(t: torch.Tensor) -> Callable[[], torch.Tensor]:
    """``start_download``, and a function that waits for it (long done when it is called a step
    later) and gives the host tensor."""
    host, event = start_download(t)

    def done() -> torch.Tensor:
        if event is not None:
            event.synchronize()
        return host

    return done


def _patched(name: str) -> Callable:
    original = _saved[name]

    def method(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        for b in _stack:
            b._host_read(self, name)
        return original(self, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = original.__doc__
    return method


class DeviceBudget(TorchDispatchMode):
    """Counts, while active, the operations launched on device data and the device->host
    synchronisations (see the module docstring for what counts).

    Args:
        device: the device whose data is counted: ``cuda`` (every CUDA tensor) or ``cpu`` (the
            tensors marked with ``mark``/``mark_device`` and what is computed from them).

    Example:
        >>> arena = torch.zeros(8, 4)
        >>> with DeviceBudget("cpu") as b:
        ...     b.mark(arena)
        ...     rows = arena.index_select(0, torch.tensor([1, 2]))  # one op, its output marked
        ...     total = rows.sum().item()  # one op, and a sync
        >>> b.ops, b.syncs
        (3, 1)
    """

    def __init__(self, device: str | torch.device) -> None:
        super().__init__()
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"DeviceBudget: device must be 'cpu' or 'cuda', got {str(self.device)!r}")
        self._cuda = self.device.type == "cuda"
        self._marked: dict[int, weakref.ref] = {}  # storage data_ptr -> the storage (dead: dropped)
        self._empty: dict[int, weakref.ref] = {}  # id(storage) -> storage, for storages of 0 bytes (data_ptr 0)
        self._kinds: dict[Any, int] = {}  # op overload -> its kind (_kind), classified once
        self.reset()

    def reset(self) -> None:
        """Zero the counters (marks are kept)."""
        self.ops = 0
        self.syncs = 0
        self.downloads = 0
        self.op_names: collections.Counter[str] = collections.Counter()
        self.sync_names: collections.Counter[str] = collections.Counter()

    # ---- what is device data ----------------------------------------------------------------
    def mark(self, *tensors: torch.Tensor) -> None:
        """Declare ``tensors`` (their whole storages, so every view of them) device memory. On a
        CUDA budget, CUDA tensors are device data already: nothing to do."""
        if self._cuda:
            return
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"DeviceBudget.mark takes tensors, got {type(t).__name__}")
            s = t.untyped_storage()
            ptr = s.data_ptr()
            if ptr:
                self._marked[ptr] = weakref.ref(s)
            else:
                self._empty[id(s)] = weakref.ref(s)

    def is_device(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is device data for this budget."""
        if self._cuda:
            return t.device.type == "cuda"
        if t.device.type != "cpu":
            return False
        s = t.untyped_storage()
        ptr = s.data_ptr()
        table, key = (self._marked, ptr) if ptr else (self._empty, id(s))
        ref = table.get(key)
        if ref is None:
            return False
        alive = ref()
        if alive is None:  # that storage was freed; the address (or id) now belongs to another
            del table[key]
            return False
        return ptr != 0 or alive is s

    def _mark_outputs(self, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            self.mark(out)
        elif isinstance(out, (list, tuple)):
            self.mark(*(o for o in out if isinstance(o, torch.Tensor)))

    # ---- counting ---------------------------------------------------------------------------
    def _op(self, name: str) -> None:
        self.ops += 1
        self.op_names[name] += 1

    def _sync(self, name: str) -> None:
        self.syncs += 1
        self.sync_names[name] += 1

    def _host_read(self, t: torch.Tensor, name: str) -> None:
        """``t.numpy()`` / ``t.tolist()`` (patched while a budget is active): a sync on device data
        of a CPU arena (on CUDA they dispatch a copy, counted there)."""
        if not self._cuda and isinstance(t, torch.Tensor) and self.is_device(t):
            self._sync(name)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        kind = self._kinds.get(func)
        if kind is None:
            kind = self._kinds[func] = _kind(func)
        ins = _tensors(args, kwargs)
        on_device = any(self.is_device(t) for t in ins)
        out = func(*args, **kwargs)
        if not self._cuda and not on_device:
            return out  # a host op
        if self._cuda and not on_device:
            outs = out if isinstance(out, (list, tuple)) else (out,)
            if not any(isinstance(o, torch.Tensor) and o.device.type == "cuda" for o in outs):
                return out
            on_device = True  # a factory on the device (torch.zeros(..., device="cuda")), or an upload
        name = str(func.overloadpacket.__name__)
        if kind == _META:
            return out
        if kind == _ALLOC:
            if not self._cuda:
                self._mark_outputs(out)
            return out
        if kind == _COPY:
            dst, src = args[0], args[1]
            self._op(name)
            non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            if self.is_device(dst) and isinstance(src, torch.Tensor) and not self.is_device(src) and not non_blocking:
                self._sync(name)  # a blocking upload: the host waits for every operation queued before it
            elif not self.is_device(dst) and isinstance(src, torch.Tensor) and self.is_device(src):
                # device -> host: a download when non-blocking into memory the copy can target
                # asynchronously (on CUDA: pinned; a non-blocking copy into pageable memory blocks)
                if non_blocking and (not self._cuda or dst.is_pinned()):
                    self.downloads += 1
                else:
                    self._sync(name)
            return out
        self._op(name)
        if kind == _TO_COPY and self._cuda and isinstance(out, torch.Tensor) and out.device.type != "cuda":
            if kwargs.get("non_blocking", False):  # into pinned memory (to_copy pins a non-blocking d2h)
                self.downloads += 1
            else:
                self._sync(name)
            return out
        if (kind == _TO_COPY and self._cuda and isinstance(out, torch.Tensor) and out.device.type == "cuda"
                and not kwargs.get("non_blocking", False) and any(t.device.type == "cpu" for t in ins)):
            self._sync(name)  # a blocking upload (``host.to("cuda")``): waits for the queue, as a download does
            return out
        if kind == _SYNCOP:
            self._sync(name)
        elif kind == _INDEX:
            idx = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in idx or ()):
                self._sync(name)  # a boolean mask: nonzero inside
        elif kind == _REPEAT and func._overloadname in ("Tensor", "self_Tensor") and kwargs.get("output_size") is None:
            self._sync(name)  # repeats given as a tensor, no output_size: the host reads sum(repeats)
        if not self._cuda:
            self._mark_outputs(out)
        return out

    # ---- scope ------------------------------------------------------------------------------
    def __enter__(self) -> "DeviceBudget":
        global _innermost
        if not _stack:  # .numpy() / .tolist() bypass the dispatcher on a CPU tensor
            for name in ("numpy", "tolist"):
                _saved[name] = getattr(torch.Tensor, name)
                setattr(torch.Tensor, name, _patched(name))
        _stack.append(self)
        _innermost = self
        try:
            super().__enter__()
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._leave()

    def _leave(self) -> None:
        global _innermost
        if self in _stack:
            _stack.remove(self)
        _innermost = _stack[-1] if _stack else None
        if not _stack:
            for name, original in _saved.items():
                setattr(torch.Tensor, name, original)
            _saved.clear()

    # ---- output -----------------------------------------------------------------------------
    def report(self, top: int = 8) -> str:
        """One line: ops, syncs, downloads, the most frequent op names and the sync op names."""
        ops = ", ".join(f"{n} x{c}" for n, c in self.op_names.most_common(top))
        more = len(self.op_names) - top
        syncs = ", ".join(f"{n} x{c}" for n, c in self.sync_names.most_common())
        return (f"{self.ops} device ops, {self.syncs} syncs, {self.downloads} downloads; "
                f"ops: {ops or '-'}{f' (+{more} more kinds)' if more > 0 else ''}; syncs: {syncs or '-'}")
