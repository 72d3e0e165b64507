"""The trainer's stages, each a function over one batch (a ``Step``) that knows nothing of its
neighbours: plan -> fetch -> [to device] -> compute (the caller's thread) -> update -> metrics.

One training step is ``compute_step`` (forward, loss, backward, dense step) then
``update_step`` (sparse step): the ``compute`` and ``update`` stages run them, and so does
``ember.train.loop.train_step``, the step in plain form.

With the data stages in front (``Loader.stages``: read -> featurize) they form the pipeline the
``Scheduler`` runs on threads (``pipeline.enabled``) or in line. The tiers are touched only by
``fetch`` and ``update``, never at once (a lock), and in the order ``FetchGate`` allows.
Distributed, the sharded lookups take their own tiers' lock around their local work only (a
fetch or update waits in all-to-alls with the other ranks, and must not hold the tiers
meanwhile: ``ember.distributed.sharded``), and the gate stops every rank's fetches at the
same batch (``FetchGate.lockstep``).
"""

from __future__ import annotations

import itertools
import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import Tensor

from ember.batch import Batch
from ember.embedding.collection import Lookup
from ember.embedding.group import GroupLookup
from ember.embedding.optimizer import SparseOptimizer
from ember.errors import Diverged
from ember.pipeline.loader import RankSlice
from ember.pipeline.scheduler import END, idle
from ember.pipeline.staleness import FetchGate, WriteLog
from ember.train.builder import Components
from ember.train.shards import FileShards
from ember.train.window import RollingWindow

__all__ = ["Step", "TrainStages", "compute_step", "update_step"]


def compute_step(parts: Components, batch: Batch, step: int, lookups: list[Lookup] | None = None,
                 task_weights: Tensor | None = None, rows: int | None = None) -> tuple[Tensor, Tensor, list[GroupLookup]]:
    """The first half of training step ``step`` (global, 0-based: lr schedules read it):
    forward (``lookups``: planned and fetched ahead, else every table group plans (dedupes),
    fetches and pools here), loss, backward, dense optimizer step. Returns the logits, the loss
    and the lookups whose rows ``update_step`` updates (one summed gradient per unique ID;
    [] when an fp16 overflow skipped the step)."""
    logits = parts.forward(batch, lookups)
    loss = parts.loss(batch, logits, task_weights, rows)
    return logits, loss, parts.backward(loss, step)


def update_step(ready: list[GroupLookup], step: int) -> None:
    """The second half of training step ``step``: each table's sparse optimizer updates the
    touched rows and writes them back to their tiers."""
    SparseOptimizer.apply(ready, step)


@dataclass
class Step:
    """One batch on its way through the pipeline; each stage fills its own fields."""

    index: int  # position in this pass (0, 1, ...): the order updates are written in
    batch: Batch  # distributed: this rank's slice of the global batch
    lookups: list[Lookup] = field(default_factory=list)  # plan: one per collection
    rows: int = 0  # rows of the global batch (the loss is this rank's share of their mean)
    fetched_after: int = 0  # fetch: how many batches' updates were written when it read its rows
    copied: Any = None  # to_device: the CUDA event the copy recorded
    ready: list[GroupLookup] = field(default_factory=list)  # compute: lookups with gradients
    loss: Tensor | None = None  # compute: the batch's mean loss (detached)
    probs: Tensor | None = None  # compute, with a rolling window: the batch's scores before its update


class TrainStages:
    """The stage functions of one training pass over ``parts``.

    ``gate`` orders fetches against written updates (``pipeline.embedding_staleness``); ``log``
    lets an update re-read rows written after its fetch. Loss and samples accumulate until
    ``take_metrics``; with a ``window`` (``eval.window_rows``), each batch's scores and labels
    enter it (progressive validation: scored by the forward before its own update).
    ``shards`` (``data.shard: files``, distributed): each batch is this rank's own, trained
    whole, and the step's global rows come from the ranks' agreement (``ember.train.shards``).
    """

    def __init__(self, parts: Components, gate: FetchGate, log: WriteLog, task_weights: Tensor | None = None,
                 first_step: int = 0, window: RollingWindow | None = None, shards: FileShards | None = None) -> None:
        self.parts, self.gate, self.log, self.task_weights = parts, gate, log, task_weights
        self.shards = shards
        self.window = window
        self.first_step = first_step  # global steps before this pass: lr schedules read first_step + index
        self.device = parts.device
        self._count = itertools.count()
        # fetch and update never touch the tiers at once; distributed, the sharded lookups lock
        # their tiers themselves, never across a collective
        self._tiers: threading.Lock | None = threading.Lock() if parts.dist is None else None
        if parts.dist is not None:
            gate.lockstep = True
        self._metrics = threading.Lock()
        self._loss_sum, self._seen = 0.0, 0
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.ahead = log.ahead  # batches a device cache's host half is prepared ahead of the fetch (0 distributed)

    @property
    def copies(self) -> bool:
        """Whether a ``to_device`` stage belongs in the pipeline (a CUDA model)."""
        return self._stream is not None

    @contextmanager
    def _holding_tiers(self) -> Iterator[None]:
        """The tiers to this stage alone; the wait for them is not the stage's work."""
        if self._tiers is None:
            yield
            return
        with idle():
            self._tiers.acquire()
        try:
            yield
        finally:
            self._tiers.release()

    def plan(self, batch: Batch | RankSlice) -> Step:
        """Dedupe the batch's IDs per table (no tier is touched); distributed: this rank's slice
        (a ``RankSlice``: the loader made it alone)."""
        if isinstance(batch, RankSlice):
            local, rows = batch.batch, batch.rows
        else:
            local, rows = batch if self.shards is not None else self.parts.local_batch(batch), batch.size
        return Step(next(self._count), local, self.parts.plan(local, train=True), rows)

    def fetch(self, step: Step) -> Step:
        """Read the batch's rows from the tiers, once the gate allows (else end the stream).

        A device cache's host half (``Lookup.prepare``: probe, admissions, victims, the misses
        staged) runs one batch earlier than the gate allows the fetch, while the batch before
        still computes; once that batch's rows are written, the ones it stored outside the arena
        are read again into the staged plan (``WriteLog.reread``) and the device half loads it:
        the rows are those a fetch after the write reads, bit for bit."""
        ahead = self.ahead if self.ahead and any(lk.preparable for lk in step.lookups) else 0
        if ahead:
            with idle():
                if not self.gate.enter(step.index, ahead):
                    return END
            with self._holding_tiers():
                prepared_after = self.gate.written
                for lk in step.lookups:
                    lk.prepare()
        with idle():
            if not self.gate.enter(step.index):
                if ahead:
                    with self._holding_tiers():
                        for lk in step.lookups:
                            lk.discard()
                return END
        with self._holding_tiers():
            step.fetched_after = self.gate.written
            if ahead:
                self.log.reread(prepared_after, step.fetched_after, [g for lk in step.lookups for g in lk.groups])
            for lk in step.lookups:
                lk.fetch()
        self.gate.fetched(step.index)
        return step

    def to_device(self, step: Step) -> Step:
        """CUDA: copy the dense part, labels and rows to the device on the pipeline's own
        stream from pinned memory; the compute stage waits for the copy's event."""
        assert self._stream is not None
        b = step.batch
        with torch.cuda.stream(self._stream):
            step.batch = b.pin_memory().to(self.device, non_blocking=True)
            for lk in step.lookups:
                lk.to_device(self.device)
            event = torch.cuda.Event()
            event.record(self._stream)
        step.copied = event
        return step

    def compute(self, step: Step) -> None:
        """Forward, loss, backward and the dense optimizer step; the embedding gradients wait
        in ``step.ready`` for the update stage."""
        batch = step.batch
        if step.copied is not None:
            torch.cuda.current_stream().wait_event(step.copied)
            for t in (batch.dense, batch.labels):
                t.record_stream(torch.cuda.current_stream())
        elif self.device.type != "cpu":
            batch = Batch(batch.dense.to(self.device), batch.sparse, batch.labels.to(self.device),
                          None if batch.teacher is None else batch.teacher.to(self.device))
        p = self.parts
        if self.shards is not None:  # agreed by now: two steps ahead
            step.rows = self.shards.global_rows(step.index)
        logits, loss, step.ready = compute_step(p, batch, self.first_step + step.index, step.lookups, self.task_weights,
                                                step.rows)
        step.loss = loss.detach()
        if self.window is not None:
            step.probs = torch.sigmoid(logits.detach().float())
        step.lookups = []
        self.gate.computed(step.index)

    def update(self, step: Step) -> Step:
        """Refresh rows written since the fetch (staleness > 0), run each table's sparse
        optimizer, write the rows back; then the gate lets later fetches through."""
        with self._holding_tiers():
            self.log.refresh(step.index, step.fetched_after, step.ready)
            update_step(step.ready, self.first_step + step.index)
            self.log.record(step.index, step.ready)
        self.gate.wrote(step.index)
        step.ready = []
        return step

    def metrics(self, step: Step) -> Step:
        """Accumulate the loss, and the scores into the window (on a GPU this waits for the
        step: off the caller's thread)."""
        assert step.loss is not None
        n = step.batch.size
        value = float(step.loss) * step.rows  # the sum of this batch's (slice's) row losses
        if not math.isfinite(value):  # (before the drain that precedes any checkpoint: none holds these weights)
            raise Diverged(f"training diverged at step {self.first_step + step.index + 1}: the batch's loss is "
                           f"{float(step.loss)}. The weights or gradients are no longer finite; no checkpoint was "
                           "written after it. Lower the learning rates (train.dense_optimizer.lr, embedding.optimizer), "
                           "check the dense columns for huge values (schema.dense: log1p, clip), then train again or "
                           "resume from the last checkpoint (train.resume)")
        if self.window is not None and step.probs is not None:
            self.window.add(step.probs.cpu().numpy(), step.batch.labels.float().cpu().numpy(),
                            self.first_step + step.index, step.batch.keys)
            step.probs = None
        with self._metrics:
            self._loss_sum += value
            self._seen += n
        return step

    def take_metrics(self) -> tuple[float, int]:
        """(sum of loss x rows, rows) since the last call, over every rank."""
        with self._metrics:
            out = (self._loss_sum, self._seen)
            self._loss_sum, self._seen = 0.0, 0
        if self.parts.dist is not None:
            total, seen = self.parts.sum_over_ranks([out[0], float(out[1])])
            out = (total, int(seen))
        return out
