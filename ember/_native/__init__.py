"""The single import site of ember's compiled core, and the one place that decides whether it runs.

Every kernel of the extension (``ember/_csrc/ember_native.c``) has exactly one public wrapper,
of the same name and semantics, with its pure numpy/torch fallback ``_<name>_py`` written right
below it: same arguments, same results (where an insert lands in a hash table may differ
between the two, never what a lookup finds; each says so). The wrappers live in one module per
kernel family (``key_index``, ``rows``, ``disk``, ``bf16``, ``dedupe``, ``arrow``, ``csv``,
``cache``, ``init``, ``sparse``) and are all imported here: callers import ``ember._native``
alone. A wrapper runs the compiled kernel when the extension imports and the fallback
otherwise, and splits a large call over threads where the kernel releases the GIL (the helpers
below). Callers (KeyIndex, the tiers, the initialisers, the sparse gradients and optimizer)
call the wrappers and keep no native/numpy branches of their own.

One switch: ``EMBER_NATIVE=0`` in the environment (read once, when this module is imported)
means the extension is never imported, for the whole process: ``is_available()`` is False,
``require()`` raises, and every wrapper runs its fallback. ``make test`` runs the embedding,
tiers, optim and checkpoint tests a second time that way. ``import ember`` never needs the
extension: without a C compiler it is simply not built (``require()`` then names the fix).

Kernels take explicit buffers: numpy arrays of the documented dtypes, C-contiguous; outputs
are written in place. ``ember/_ember_native.pyi`` types the extension's functions and
``tests/native/test_stub.py`` checks it against the C method table.

Example:
    >>> import numpy as np
    >>> uniq, inverse, counts = unique_segments(np.array([5, 3, 5, 7, 7]), np.array([0, 3, 5]))
    >>> uniq.tolist(), inverse.tolist(), counts.tolist()
    ([5, 3, 7], [0, 1, 0, 2, 2], [2, 1])
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from types import ModuleType
from typing import Callable, Sequence, TypeVar

import numpy as np
import torch

from ember import once


__all__ = [
    "CSV_CR", "CSV_HEX", "CSV_LONG_DIGITS", "CSV_NOT_ASCII", "CSV_PAREN", "CSV_QUOTE", "arrow_hash_ints", "arrow_hash_strings", "arrow_parse_ints", "csv_gather",
    "csv_bytes", "csv_hazards", "csv_ints", "csv_split", "dense_finish", "dense_floats", "dense_prepare", "featurize_ids", "hash_utf8_buffers",
    "index_add_features", "index_add_rows", "is_available", "take_rows", "place", "probe", "probe_rows", "read_rows", "record_width", "rehash",
    "bf16_pack_sr", "cms", "count_ids", "gather_rows", "gc_insert", "gc_release", "gc_requeue", "gc_reserve", "gc_scan", "gc_scores", "gc_select", "pair_find", "scatter_rows", "willneed", "willneed_cold", "disk_find", "disk_write", "require", "rowwise_adagrad_", "run_each", "tag_claim", "tag_find", "uniform01", "normal01", "fresh_uniform", "unique_segments", "victim_keys",
    "write_rows", "MIN_PART_ROWS", "SKIP_ROW", "native_parts", "part_bounds", "part_count",
]

# EMBER_NATIVE=0 when ember is imported: the extension is never imported (any other value, or
# none, imports it when it was built).
_DISABLED = os.environ.get("EMBER_NATIVE", "").strip() == "0"

_core: ModuleType | None
_import_error: ImportError | None
if _DISABLED:
    _core, _import_error = None, None
else:
    try:
        from ember import _ember_native as _core  # optional extension
    except ImportError as _e:  # built without a compiler, or not built yet
        _core, _import_error = None, _e
    else:
        _import_error = None


def is_available() -> bool:
    """True when the compiled core was built, imports, and ``EMBER_NATIVE=0`` did not turn it off."""
    return _core is not None


def require() -> ModuleType:
    """The compiled core, or an ImportError that says why it is missing and how to get it."""
    if _core is None:
        if _DISABLED:
            raise ImportError(
                "ember native core (ember._ember_native) is turned off: EMBER_NATIVE=0 was set in the "
                "environment when ember was imported (unset it to use the compiled kernels)"
            )
        raise ImportError(
            "ember native core (ember._ember_native) is not available "
            f"({_import_error}); reinstall with a C compiler present: pip install -e ."
        )
    return _core


# ---- running a kernel on several threads ---------------------------------------------------
# A kernel splits a large call itself: its wrapper passes the parts (``part_count``: a count of
# equal row ranges; ``part_bounds``: bounds over whole tables, features or segments) and the core
# runs them on OpenMP's threads, the same libgomp torch's operations use, woken in microseconds,
# as many as torch may use (torch.get_num_threads(): the user's CPU budget). Two parts of 2-106 k
# rows ran 1.4-1.65x faster than one on 2 cores, where a hand-off to a Python thread pool costs
# ~50 us and its split lost below ~41 k rows (bench/bench_kernel_parts.py). The pool below runs
# only ``run_each``'s tasks (calls of uneven cost, one per table).

MIN_PART_ROWS = 2048  # rows (or IDs) of one part: below this, another thread does not pay
_pool: tuple[int, int, ThreadPoolExecutor] | None = None  # (pid, workers, pool)
_POOL_PREFIX = "ember-kernel"  # the pool's thread names (``_on_pool``)
_forked = False  # this process was forked: its parent's OpenMP threads do not exist here
T = TypeVar("T")


def chunks(weights: Sequence[int] | np.ndarray, cuts: Sequence[bool] | None = None,
           min_rows: int | None = None) -> list[tuple[int, int]]:
    """Split items ``0..len(weights)`` into contiguous [lo, hi) ranges of about equal total weight,
    one per thread torch may use, each of at least ``min_rows`` (default ``MIN_PART_ROWS``; one
    range when the total is below that).

    ``cuts[i]`` False forbids a range boundary before item i (items that must stay together).
    """
    w = _ints(weights)
    n, total = len(w), sum(w)
    least = MIN_PART_ROWS if min_rows is None else min_rows  # (read at call time: a test may switch it)
    k = min(torch.get_num_threads(), n, max(1, total // max(least, 1)))
    if k <= 1:
        return [(0, n)]
    ends = list(itertools.accumulate(w))
    bounds = [0]
    for j in range(1, k):
        i = bisect.bisect_left(ends, total * j / k) + 1  # first item after the j-th share
        while cuts is not None and i < n and not cuts[i]:
            i += 1
        if bounds[-1] < i < n:
            bounds.append(i)
    bounds.append(n)
    return list(zip(bounds[:-1], bounds[1:]))


def _ints(weights: Sequence[int] | np.ndarray) -> list[int]:
    """``weights`` as Python ints: a call's few items (tables, features) are split in plain
    Python, ~5x faster than numpy's per-call overhead on a few dozen values."""
    return weights.tolist() if isinstance(weights, np.ndarray) else [int(x) for x in weights]


def _after_fork() -> None:
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_after_fork)


def native_parts() -> bool:
    """Whether the core runs a call's parts on several threads: built with OpenMP, and not in a
    forked child (GNU libgomp would wait there forever on its parent's threads)."""
    return _core is not None and bool(getattr(_core, "OPENMP", 0)) and not _forked


def _one_part(n: int) -> bool:
    """A call of ``n`` rows runs as one part: too small for two parts, on a pool thread or a task
    of ``run_each`` (their threads are busy already), or the core cannot run parts (said once)."""
    if _core is None or n < 2 * MIN_PART_ROWS or torch.get_num_threads() <= 1 or _on_pool():
        return True  # (no core: the numpy fallbacks run, each said once by ``_fallback_once``)
    if not native_parts():
        if once.first("native.parts"):
            why = ("this process was forked from one that had started them" if _forked
                   else "the native core was built without OpenMP (pip install -e . with a compiler that has it)")
            logging.getLogger("ember").warning("ember's kernels run on one thread: %s", why)
        return True
    return False


def part_count(n: int) -> int:
    """Parts a kernel splits ``n`` rows into: one per thread torch may use, each at least
    ``MIN_PART_ROWS``; one when ``_one_part``."""
    return 1 if _one_part(n) else max(1, min(torch.get_num_threads(), n // MIN_PART_ROWS))


def part_bounds(weights: Sequence[int] | np.ndarray, cuts: Sequence[bool] | None = None) -> np.ndarray | None:
    """``chunks`` of ``weights`` (rows per item: tables, features, segments) as a kernel's parts
    argument, int64 [k+1] item bounds; None (one part) when ``_one_part``."""
    w = _ints(weights)
    if _one_part(sum(w)):
        return None
    parts = chunks(w, cuts, MIN_PART_ROWS)
    return None if len(parts) == 1 else np.array([lo for lo, _ in parts] + [parts[-1][1]], dtype=np.int64)


def _kernel_pool() -> ThreadPoolExecutor:
    """The pool of ``torch.get_num_threads() - 1`` threads ``run_each``'s tasks run on (one per
    process: a forked child makes its own)."""
    global _pool
    workers = max(1, torch.get_num_threads() - 1)
    if _pool is None or _pool[0] != os.getpid() or _pool[1] != workers:
        _pool = (os.getpid(), workers, ThreadPoolExecutor(max_workers=workers, thread_name_prefix=_POOL_PREFIX))
    return _pool[2]


_task = threading.local()  # .on: this thread runs a task of run_each


def _on_pool() -> bool:
    """Whether work started here runs in line: on one of the pool's threads, or inside a task of
    ``run_each`` (its tasks already keep the threads busy: a kernel's parts there would
    oversubscribe the cores, and a nested ``run_each`` would wait on the pool it runs on)."""
    return getattr(_task, "on", False) or threading.current_thread().name.startswith(_POOL_PREFIX)


def run_each(tasks: Sequence[Callable[[], T]]) -> list[T]:
    """``[task() for task in tasks]`` (results in order), the tasks taken one at a time by this
    thread and up to ``torch.get_num_threads() - 1`` pool threads, for independent calls of
    uneven cost (a group's tables, some behind a disk tier). Every task has run or been dropped
    when it returns; the first error raises. In line on one thread, and on a pool thread."""
    n = len(tasks)
    if n <= 1 or torch.get_num_threads() <= 1 or _on_pool():
        return [task() for task in tasks]
    out: list = [None] * n
    taken = itertools.count()  # next(): atomic under the GIL
    # CUDA's current stream is per thread: the pool's threads issue on this thread's (tasks that
    # touch a GPU, e.g. a table's device cache, stay ordered as the caller's work is)
    stream = torch.cuda.current_stream() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    errors: list[BaseException] = []
    stop: list[bool] = []  # set: no thread takes another task

    def take() -> None:
        while not stop:
            i = next(taken)
            if i >= n:
                return
            try:
                out[i] = tasks[i]()
            except BaseException as e:
                errors.append(e)
                stop.append(True)
                raise

    def drain(here: bool = True) -> None:
        _task.on = True
        try:
            if stream is not None and not here:
                with torch.cuda.device(stream.device), torch.cuda.stream(stream):
                    take()
            else:
                take()
        finally:
            _task.on = False

    pool = _kernel_pool()
    futures = [pool.submit(drain, False) for _ in range(min(n, torch.get_num_threads()) - 1)]
    try:
        drain()
    except BaseException:  # this thread's task failed, or an interrupt: the pool's threads stop too
        stop.append(True)
        raise
    finally:  # drains still queued behind other work are cancelled (nothing is left for them);
        wait([f for f in futures if not f.cancel()])  # no task runs on after this returns or raises
    if errors:
        raise errors[0]
    return out


def _fallback_once(name: str) -> None:
    """Log once per kernel that its numpy fallback runs (the core is off or not built)."""
    if once.first("native.fallback", name):
        why = "EMBER_NATIVE=0" if _DISABLED else f"the native core is not available: {_import_error}"
        logging.getLogger("ember").info("ember._native.%s runs its numpy fallback (%s)", name, why)


# ---- the kernel families, one module each --------------------------------------------------
# Imported after the core and the thread helpers above, which they use (``_native._core`` and the
# thresholds are read at call time, so a test may switch them).
from ember._native.key_index import (  # noqa: E402
    _count_ids_py, _place_py, _probe_py, _probe_rows_py, _rehash_py, count_ids, place, probe, probe_rows, rehash,
)
from ember._native.bf16 import (  # noqa: E402
    _bf16_pack_sr_py, _bf16_round_py, _bf16_widen_py, bf16_pack_sr,
)
from ember._native.disk import (  # noqa: E402
    _disk_find_py, _disk_write_py, _gather_rows_py, _scatter_rows_py, _tag_claim_py, _tag_find_py,
    _willneed_cold_py, _willneed_py, disk_find, disk_write, gather_rows, scatter_rows, tag_claim,
    tag_find, willneed, willneed_cold,
)
from ember._native.rows import (  # noqa: E402
    SKIP_ROW, _read_rows_py, _write_rows_py, read_rows, record_width, write_rows,
)
from ember._native.dedupe import (  # noqa: E402
    _unique_segments_py, unique_segments,
)
from ember._native.arrow import (  # noqa: E402
    _arrow_hash_ints_py, _arrow_hash_strings_py, _arrow_parse_ints_py, _dense_floats_py,
    _featurize_ids_py, arrow_hash_ints, arrow_hash_strings, arrow_parse_ints, dense_floats,
    featurize_ids, hash_utf8_buffers,
)
from ember._native.dense import (  # noqa: E402
    _dense_finish_py, _dense_prepare_py, dense_finish, dense_prepare,
)
from ember._native.csv import (  # noqa: E402
    CSV_CR, CSV_HEX, CSV_LONG_DIGITS, CSV_NOT_ASCII, CSV_PAREN, CSV_QUOTE, _csv_bytes_py, _csv_gather_py,
    _csv_hazards_py, _csv_ints_py, _csv_split_py, csv_bytes, csv_gather, csv_hazards, csv_ints, csv_split,
)
from ember._native.cache import (  # noqa: E402
    _cms_py, _gc_insert_py, _gc_release_py, _gc_requeue_py, _gc_reserve_py, _gc_scan_py,
    _gc_scores_py, _gc_select_py, _pair_find_py, cms, gc_insert, gc_release, gc_requeue,
    gc_reserve, gc_scan, gc_scores, gc_select, pair_find, victim_keys,
)
from ember._native.init import (  # noqa: E402
    _fresh_uniform_py, _normal01_py, _uniform01_py, fresh_uniform, normal01, uniform01,
)
from ember._native.sparse import (  # noqa: E402
    _index_add_features_py, _index_add_rows_py, _rowwise_adagrad_py, _take_rows_py, index_add_features,
    index_add_rows, rowwise_adagrad_, take_rows,
)
