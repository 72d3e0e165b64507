"""A training step of a ``storage.index: device`` table group as fixed sequences of device
operations, replayed on a GPU from CUDA graphs.

On a GPU that layout's step is bound by launches, not by the device: its fetch is ~130 small
operations (the index's look-up and inserts, the gather, TTL, the fresh rows, the store) and a
16-bit write-back ~60 more, each a kernel the host issues (GPU session 6, an H200: 1.1 ms of
device work behind 4.6 ms of host time). ``MappedFetch`` makes each one function of fixed-size
tensors: the batch's unique pairs padded to a bucket (a power of two, at least ``MIN_BUCKET``),
the padding masked, so it inserts nothing, counts nothing and writes only the rows' scratch
row. Each function's inputs go up in one pinned buffer, the count of real pairs in it. On CUDA
the function is captured once per bucket as a CUDA graph and then replayed: a steady step
launches 12-25 operations instead of 140-260 (``tests/embedding/test_mapped_fetch.py`` counts
them on a CPU).

What the host decides stays on the host, before the device work: room for the rows and the
index (``MappedRows.prepare``: a growth, rarely). A growth replaces tensors a graph was
captured on (``generation``), so the graphs are dropped and captured again on next use. A
bucket's first call runs the function eagerly (it is the step: capture itself runs nothing),
then captures it for the calls after.

Elsewhere (a CPU device, or graphs off) the same functions run eagerly, unpadded;
``PAD_ON_CPU`` pads them on a CPU, so the tests hold the padded functions, the ones a GPU
captures, to the unpadded path bit for bit. A graph that cannot be captured is said once in
the log, with the reason, and that group's calls run eagerly from then on (unpadded, the same
results). ``EMBER_CUDA_GRAPHS=0`` in the environment turns the graphs off.
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch
from torch import Tensor

from ember.tiers.device_budget import count_launch, mark_device, one_launch, start_download, upload, upload_parts

if TYPE_CHECKING:
    from ember.embedding.group import TableGroup

__all__ = ["COUNT_AS_GRAPHS", "MappedFetch", "MIN_BUCKET", "PAD_ON_CPU", "bucket"]

log = logging.getLogger("ember.embedding")

MIN_BUCKET = 1024  # pairs: smaller fetches share this bucket's graph
PAD_ON_CPU = False  # (tests: run the padded function, the one a GPU captures, on a CPU device)
# (tests, benches: under a DeviceBudget, count that function's eager run as the one launch a GPU's replay is)
COUNT_AS_GRAPHS = False


def bucket(n: int) -> int:
    """The padded size of a fetch of ``n`` pairs: the next power of two, at least ``MIN_BUCKET``
    (so a run's few batch sizes take a few graphs, and a graph's padding is under half)."""
    b = MIN_BUCKET
    while b < n:
        b *= 2
    return b


class _Graph:
    """One bucket's fixed tensors (``inputs``: the call's arguments, padded, each loaded by one
    copy; the count of real pairs rides in one of them) and, once captured, the CUDA graph of a
    function of them and its outputs."""

    def __init__(self, size: int, device: torch.device, **shapes: tuple[tuple[int, ...], torch.dtype]) -> None:
        self.size = size
        self.inputs = {k: torch.zeros(shape, dtype=dtype, device=device) for k, (shape, dtype) in shapes.items()}
        self.iota = torch.arange(size, device=device)  # (a constant: the padding is where iota >= the count)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: tuple[Tensor, ...] = ()
        mark_device(*self.tensors())

    def tensors(self) -> list[Tensor]:
        return [*self.inputs.values(), self.iota]

    def load(self, **values: Tensor | None) -> None:
        """The call's tensors into the fixed ones, each whole and of its shape (made so on the
        host: a pinned host tensor on a GPU is one upload, no wait), or its first rows (a device
        tensor with fewer rows: per pair, the rest being padding)."""
        mark_device(*self.tensors())  # (nothing unless a DeviceBudget is active)
        for k, v in values.items():
            if v is not None:
                dst = self.inputs[k]
                (dst if v.shape == dst.shape else dst[: v.shape[0]]).copy_(v, non_blocking=True)

    def valid(self, count: Tensor) -> Tensor:
        """bool [size]: the real pairs (``count``: int64 [1] on the device)."""
        return self.iota < count


def _host(n: int, device: torch.device) -> Tensor:
    """An int64 [n] host tensor to fill and copy to ``device`` (pinned on a GPU)."""
    return torch.empty(n, dtype=torch.int64, pin_memory=device.type == "cuda")


class MappedFetch:
    """The device half of a training step of a group's ``MappedRows``: the fetch (``__call__``:
    ``(pairs, records)`` of unique (ID, table) pairs, new pairs inserted, their fresh rows made
    and stored) and the write-back (``write``).

    Args:
        group: the table group (``storage.index: device``).
    """

    def __init__(self, group: "TableGroup") -> None:
        assert group.mapped is not None
        self.group = group
        self.device = group.mapped.device
        self.graphs_on = self.device.type == "cuda" and os.environ.get("EMBER_CUDA_GRAPHS", "1") != "0"
        self._graphs: dict[tuple[str, int], _Graph] = {}  # (call, bucket) -> its graph
        self._generation: tuple[int, int] | None = None

    @property
    def padded(self) -> bool:
        """Whether calls run padded to their bucket: for CUDA graphs (while they are on), or a
        CPU check of them (``PAD_ON_CPU``). Else as they come (no padding to compute)."""
        return self.graphs_on or PAD_ON_CPU

    def _graph(self, call: str, size: int, **shapes: tuple[tuple[int, ...], torch.dtype]) -> tuple[_Graph, bool]:
        """``call``'s graph for a bucket of ``size`` (made if new: True), after dropping every
        graph if the rows or the index were replaced since they were captured."""
        m = self.group.mapped
        assert m is not None
        c = self.group.pending
        generation = (m.generation, m.index.generation, *((c.generation, c.index.generation) if c is not None else ()))
        if generation != self._generation:  # the tensors the graphs were captured on are gone
            self._graphs.clear()
            self._generation = generation
        gr = self._graphs.get((call, size))
        if gr is not None:
            return gr, False
        gr = self._graphs[(call, size)] = _Graph(size, self.device, **shapes)
        return gr, True

    def _run(self, gr: _Graph, made: bool, fn: Callable[..., tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
        """``fn`` of ``gr``'s inputs: the graph replayed when captured (its outputs: ``gr.out``),
        else run (its outputs), then captured if ``gr`` is new."""
        if gr.graph is not None:
            gr.graph.replay()
            count_launch("cuda graph")
            return gr.out
        with one_launch("cuda graph") if COUNT_AS_GRAPHS else contextlib.nullcontext():
            out = fn(*gr.inputs.values())
        if made and self.graphs_on:
            self._capture(gr, fn)
        return out

    def __call__(self, ids: Tensor, owner: np.ndarray) -> tuple[Tensor, Tensor]:
        """A training fetch of the unique pairs (``ids`` int64 [N] on the host, ``owner``: each
        one's table): (pairs int64 [3, N] on the device: record numbers, IDs, tables; records
        float32 [N, width]). New pairs are inserted, their fresh rows made and stored (and a
        TTL's last-seen step). ``pairs`` is what ``write`` takes."""
        g, m = self.group, self.group.mapped
        assert m is not None
        n = ids.numel()
        ttl = g.ttl_dev is not None
        if not self.padded:
            self._prepare(n)
            keys, tags = upload_parts([ids, torch.from_numpy(owner)], self.device)
            steps = g.steps_on(self.device, torch.float32) if ttl else None
            pairs, _, rec = self.body(keys, tags.to(torch.int32), steps, None)
            self._inserted(n)
            return pairs, rec
        size = bucket(n)
        self._prepare(size)  # (room for every pair of the bucket: the padding inserts none)
        gr, made = self._graph("fetch", size, pairs=((2 * size + 1,), torch.int64), steps=((len(g.tables),), torch.float32))
        host = _host(2 * size + 1, self.device)  # IDs, tables (each padded to the bucket), the count: one upload
        host[:n], host[size : size + n], host[2 * size] = ids, torch.from_numpy(owner), n
        gr.load(pairs=host, steps=g.steps_host(self.device, torch.float32) if ttl else None)

        def fetch(packed: Tensor, steps: Tensor) -> tuple[Tensor, ...]:
            valid = gr.valid(packed[2 * size :])
            tags = torch.where(valid, packed[size : 2 * size], 0).to(torch.int32)  # (the padding's: anything, uploaded unset)
            return self.body(packed[:size], tags, steps if ttl else None, valid)

        out = self._run(gr, made, fetch)
        pairs, rec = out[0][:, :n].clone(), out[2][:n].clone()  # (a graph's outputs: the next replay overwrites them)
        self._inserted(n)
        return pairs, rec

    def _prepare(self, n: int) -> None:
        """The host's part of a fetch of up to ``n`` pairs: room in the rows, the index and the
        ``min_count`` counts (a growth, rarely)."""
        self.group.mapped.prepare(n, training=True)  # type: ignore[union-attr]
        if self.group.pending is not None:
            self.group.pending.prepare(n)

    def _inserted(self, n: int) -> None:
        """After a fetch's device work: the counts its inserts changed start home (one download
        for the rows' index and the ``min_count`` counts' index: ``DeviceIndex.share_counts``)."""
        g = self.group
        assert g.mapped is not None
        if g.pending is None:
            g.mapped.inserted(n)
            return
        assert g.shared_counts is not None
        host, event = start_download(g.shared_counts)
        g.mapped.inserted(n, (host[:4], event))
        g.pending.inserted(n, (host[4:], event))

    def write(self, pairs: Tensor, records: Tensor) -> None:
        """Store a training step's updated ``records`` [N, width] in their record numbers
        (``pairs``, as the fetch gave them); a 16-bit group's weights are rounded stochastically
        (``RowCodec.encode``: the noise of table seed, table step, ID and column), as one graph
        on a GPU."""
        g, m = self.group, self.group.mapped
        assert m is not None
        if g.codec.identity and m.hot is None:  # (one scatter: nothing to gather into a graph)
            m.store(pairs[0], records)
            return
        n, t = records.shape[0], len(g.tables)
        if not self.padded:
            self.encode_store(pairs, records, upload(g.sr_keys_host(self.device), self.device), None)
            return
        size = bucket(n)
        gr, made = self._graph("write", size, pairs=((3, size), torch.int64), records=((size, g.width), torch.float32),
                               table_keys=((t + 1,), torch.int64))
        keys = _host(t + 1, self.device)  # each table's noise key, then the count: one upload
        keys[:t], keys[t] = g.sr_keys_host(self.device), n
        gr.load(records=records, table_keys=keys)
        gr.inputs["pairs"][:, :n].copy_(pairs, non_blocking=True)

        def write(pairs_: Tensor, records_: Tensor, keys_: Tensor) -> tuple[Tensor, ...]:
            return self.encode_store(pairs_, records_, keys_[:t], gr.valid(keys_[t:]))

        self._run(gr, made, write)

    def encode_store(self, pairs: Tensor, records: Tensor, table_keys: Tensor, valid: Tensor | None) -> tuple[Tensor, ...]:
        """``write``'s device work: encode (16-bit: stochastic rounding), one scatter (the
        padding's rows go to the scratch row)."""
        m = self.group.mapped
        assert m is not None
        rows, keys, tags = pairs[0], pairs[1], pairs[2]
        if valid is not None:
            rows = torch.where(valid, rows, m.scratch)
        m.scatter(rows, self.group.codec.encode(records, keys, 0, 0, table_key=table_keys[tags]))
        return ()

    def body(self, keys: Tensor, tags: Tensor, steps: Tensor | None, valid: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """The fetch as device operations alone (``valid``: the real pairs, None: all): look-up
        and inserts, one gather, TTL expiry, fresh rows for new pairs, one store. The padding's
        rows are the scratch row (read, written, never numbered). Returns (pairs [3, N]: record
        numbers, IDs, tables; new [N]; records [N, width])."""
        g, m = self.group, self.group.mapped
        assert m is not None
        if g.pending is not None:
            return self._body_counted(keys, tags, steps, valid)
        rows, new = m.index.insert(keys, tags, valid)
        if valid is not None:
            rows = torch.where(valid, rows, m.scratch)
        m.read_by_training(rows)
        rec, new = self.complete(g.codec.decode(m.gather(rows)), new, keys, tags, steps, valid, True)
        m.scatter(rows, g.codec.encode_nearest(rec))  # (16-bit weights: exact, they are 16-bit values)
        return torch.stack((rows, keys, tags.to(torch.int64))), new, rec

    def _body_counted(self, keys: Tensor, tags: Tensor, steps: Tensor | None,
                      valid: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """``body`` for a group with ``min_count`` tables: a pair without a live row (absent, or
        expired under a TTL) of such a table is counted first (``DeviceCounts``); at its
        threshold it is admitted (inserted, a fresh row; it leaves the counts), below it is held
        back: it reads the all-zero row, is not inserted and writes only the scratch row (no
        row, no update), as the host's ``EmbeddingTable.complete`` does."""
        g, m, c = self.group, self.group.mapped, self.group.pending
        assert m is not None and c is not None and g.min_counts is not None and g.filtered_dev is not None
        hit = m.index.find(keys, tags)
        found = hit >= 0 if valid is None else (hit >= 0) & valid
        rec = g.codec.decode(m.gather(torch.where(found, hit, m.scratch)))
        expired = self._expired(rec, found, tags, steps, valid)
        live = found if expired is None else found & ~expired
        need = g.min_counts[tags]
        want = ~live & (need > 1) if valid is None else valid & ~live & (need > 1)
        slot, n, entry = c.count(keys, tags, want)
        held = want & (n < need)
        c.admit(slot, entry, want & ~held)  # (admitted: it leaves the counts; counted from zero if it ever loses its row)
        g.filtered_dev += self._per_table(held, tags)
        keep = ~held if valid is None else valid & ~held
        rows, new = m.index.insert(keys, tags, keep)
        rows = torch.where(keep, rows, m.scratch)
        if expired is not None:
            new = new | expired
        rec = torch.where(new.unsqueeze(1), g.fresh_rows(keys, tags), rec)
        rec = torch.where(held.unsqueeze(1), 0.0, rec)
        self._seen(rec, tags, steps)
        m.read_by_training(rows)
        m.scatter(rows, g.codec.encode_nearest(rec))
        return torch.stack((rows, keys, tags.to(torch.int64))), new, rec

    def read(self, keys: Tensor, tags: Tensor) -> Tensor:
        """An evaluation's records [N, width] of ``keys`` / ``tags``: stored rows, fresh rows for
        the others (as a training fetch would make them); inserts and stores nothing."""
        g, m = self.group, self.group.mapped
        assert m is not None
        found, packed = m.find(keys, tags)
        steps = g.steps_on(self.device, torch.float32) if g.ttl_dev is not None else None
        return self.complete(g.codec.decode(packed), ~found, keys, tags, steps, None, False)[0]

    def complete(self, rec: Tensor, new: Tensor, keys: Tensor, tags: Tensor, steps: Tensor | None,
                 valid: Tensor | None, seen: bool) -> tuple[Tensor, Tensor]:
        """Records read (``rec`` [N, width], ``new`` [N]) finished: a TTL table's rows not looked up
        for more than its ``ttl_steps`` read as new (counted per table), new pairs get fresh rows,
        and (``seen``: training) a TTL table's rows note the step as their last look-up; in an
        evaluation a ``min_count`` table's new pairs read the zero row (held back: counted per
        table, never counted toward admission)."""
        g = self.group
        expired = self._expired(rec, ~new, tags, steps, valid)
        if expired is not None:
            new = new | expired
        rec = torch.where(new.unsqueeze(1), g.fresh_rows(keys, tags), rec)
        if not seen and g.min_counts is not None and g.filtered_dev is not None:  # (an evaluation: held back, never counted)
            held = new & (g.min_counts[tags] > 1)
            g.filtered_dev += self._per_table(held, tags)
            rec = torch.where(held.unsqueeze(1), 0.0, rec)
        if seen:
            self._seen(rec, tags, steps)
        return rec, new

    def _expired(self, rec: Tensor, found: Tensor, tags: Tensor, steps: Tensor | None,
                 valid: Tensor | None) -> Tensor | None:
        """Pairs ``found`` whose TTL table's row was not looked up for more than its ``ttl_steps``
        (counted per table), None without a TTL."""
        g = self.group
        if steps is None or g.ttl_dev is None:
            return None
        expired = found & (steps[tags] - rec[:, -1] > g.ttl_dev[tags])
        if valid is not None:
            expired = expired & valid
        g.expired_dev += self._per_table(expired, tags)
        return expired

    def _per_table(self, mask: Tensor, tags: Tensor) -> Tensor:
        """int64 [T]: the pairs of ``mask`` per table."""
        return (mask.unsqueeze(1) & (tags.unsqueeze(1) == self.group.table_numbers)).sum(0)

    def _seen(self, rec: Tensor, tags: Tensor, steps: Tensor | None) -> None:
        """A training look-up notes the step as a TTL table's rows' last look-up (in place)."""
        g = self.group
        if steps is not None and g.ttl_dev is not None:
            rec[:, -1] = torch.where(g.ttl_dev[tags] < float("inf"), steps[tags], rec[:, -1])

    def _capture(self, gr: _Graph, fn: Callable[..., tuple[Tensor, ...]]) -> None:
        """Capture ``fn`` of ``gr``'s inputs as a CUDA graph (nothing runs: the call that
        captures has run ``fn`` itself). On failure, said once; operation by operation from then on."""
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = fn(*gr.inputs.values())
        except Exception as e:  # (a CUDA build or driver that cannot capture these operations)
            self.graphs_on = False
            self._graphs.clear()
            log.warning("storage.index: device: table group of '%s': its step could not be captured as a CUDA graph "
                        "(%s: %s); it runs operation by operation (the same results, more host time per step)",
                        self.group.tables[0].name, type(e).__name__, e)
            return
        gr.graph, gr.out = graph, out
        if len(self._graphs) == 1:
            log.info("storage.index: device: table group of '%s': its step's device work captured as CUDA graphs "
                     "(padded to %d pairs; more sizes as batches need them)", self.group.tables[0].name, gr.size)
