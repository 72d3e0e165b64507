"""The training loop, read top to bottom. ``train_step`` is one step in plain form (forward,
loss, backward, dense step, sparse step). ``train`` runs the same step (``ember.train.stages``)
as a pipeline: read -> featurize -> plan -> fetch -> [to device] -> compute -> update ->
metrics, on threads or in line; after each step the ranks agree on a stop
(``ember.train.agreement``), and on a quiet engine the loop logs (``ember.train.reporter``),
evaluates (``ember.train.evaluator``), checkpoints (``ember.train.checkpointer``) and exports.
Where the run stands is a ``RunState`` (``ember.train.run_state``); each pass's data comes
from ``open_train_loader`` (``ember.train.train_data``) whatever its source or shard mode.
SIGINT / SIGTERM finish the batches already fetched, checkpoint, and raise ``RunInterrupted``.
``train.mode: online`` makes one pass over a stream of files instead of epochs.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from ember import once
from ember.allocator import advise
from ember.batch import Batch
from ember.checkpoint.delta import run_exporter
from ember.checkpoint.load import resolve_checkpoint
from ember.config import RunConfig, to_yaml
from ember.distributed.process_group import DistributedRun
from ember.errors import RunInterrupted, WriteError
from ember.fileio import write_bytes_atomic
from ember.outputs import mark
from ember.pipeline.config import QueueDepths, engine_on_threads
from ember.pipeline.scheduler import Scheduler, Stage
from ember.pipeline.staleness import FetchGate, WriteLog
from ember.train import clock
from ember.train.agreement import SignalsHeld, StopAgreement, StopSignals
from ember.train.builder import Components, build_components
from ember.train.checkpointer import Checkpointer, restore
from ember.train.distributed import lead_prepares_run, start_run
from ember.train.early_stop import EarlyStopping
from ember.train.evaluator import Evaluator
from ember.train.history import History
from ember.train.metrics import json_safe
from ember.source.protocol import one_source_per_config
from ember.train.preflight import check_disk, check_run, holds_run, no_steps_error, resumes_in
from ember.train.shards import ahead_of
from ember.train.progress import EpochRows, Progress
from ember.train.reporter import Reporter, expire_tables
from ember.train.run_state import RunState
from ember.train.stages import TrainStages, compute_step, update_step
from ember.train.train_data import TrainLoader, check_train_data, open_train_loader, shards_files, start_data

log = logging.getLogger("ember.train")

__all__ = ["train", "train_step", "RunResult", "prepare_run", "run_directory"]


@dataclass
class RunResult:
    run_dir: Path
    step: int
    metrics: dict[str, float]
    history: list[dict[str, Any]] = field(default_factory=list)
    parts: Components | None = None
    bad_rows: dict[str, int] = field(default_factory=dict)


def train_step(parts: Components, batch: Batch, task_weights: torch.Tensor | None = None) -> torch.Tensor:
    """One step in plain form, the one the trainer's stages run (``ember.train.stages``):
    forward, loss, backward and dense step (``compute_step``: every table group plans (dedupes),
    fetches and pools the batch's rows here), then the sparse step (``update_step``: the
    touched rows updated and written back). Returns the (detached) loss."""
    opt = parts.sparse_optimizer
    _, loss, ready = compute_step(parts, batch, opt.steps, task_weights=task_weights)
    update_step(ready, opt.steps)
    opt.steps += 1  # lr schedules read the count of steps taken
    return loss.detach()


def run_directory(cfg: RunConfig) -> Path:
    """``train.out_dir / train.run_name`` (a timestamped name when unset)."""
    return Path(cfg.train.out_dir) / (cfg.train.run_name or time.strftime("run-%Y%m%d-%H%M%S"))


def prepare_run(cfg: RunConfig, run_dir: Path | None = None, dist: DistributedRun | None = None) -> tuple[Components, Path]:
    """Seed, threads, determinism, run directory with the resolved config (rank 0 writes it),
    built parts (``dist``: this rank's, of a distributed run)."""
    t = cfg.train
    if t.threads is not None:
        torch.set_num_threads(t.threads)
    if t.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    run_dir = run_dir or run_directory(cfg)
    if dist is None or dist.lead:
        run_dir.mkdir(parents=True, exist_ok=True)
        mark(run_dir, "run")  # what --overwrite may replace (ember.outputs)
        write_bytes_atomic(run_dir / "config.yaml", to_yaml(cfg).encode(), WriteError)
    return build_components(cfg, dist), run_dir


def train(cfg: RunConfig, overwrite: bool = True, batches: Sequence[Batch] | None = None) -> RunResult:
    """Train (or resume, or finetune) as the config says; returns the final eval metrics.

    ``batches``: train on these batches, already featurized and in memory (from ``make_batches``
    or your own code; every epoch replays them in order), instead of reading ``data.train``;
    evaluation still reads ``data.eval``.

    Data, schema and output directory are checked before anything is built (``preflight``). A
    run directory that holds an earlier run is replaced (its checkpoints removed first) only
    when ``overwrite`` (else ConfigError) or continued with ``train.resume``. A run that fails
    before its first checkpoint removes the run directory it created, so nothing blocks a retry.
    Launched by torchrun on several processes, it trains distributed (``ember.distributed``):
    rank 0 alone checks, creates and writes the run directory; a rank that dies, hangs or fails
    makes the others raise ``RankLost`` naming it (``ember.distributed.watchdog``).
    """
    if not isinstance(cfg, RunConfig):
        raise TypeError(f"train takes a RunConfig, got {type(cfg).__name__}: ember.config.load(path) reads one from a "
                        "YAML file, ember.config.from_dict(d) from a dict")
    if batches is not None and not all(isinstance(b, Batch) for b in batches):
        raise TypeError("train: batches must be ember.batch.Batch objects (make_batches gives them)")
    with one_source_per_config():  # (the run's checks, row count, epochs and evals list the files once)
        return _run(cfg, overwrite, batches)


def _run(cfg: RunConfig, overwrite: bool, batches: Sequence[Batch] | None) -> RunResult:
    """``train``'s work, its arguments checked."""
    dist = start_run(cfg)  # None in one process: nothing is initialised
    run_dir = run_directory(cfg)
    try:
        run_dir, fresh = lead_prepares_run(run_dir, dist, lambda d: _clear_run(cfg, d, overwrite, batches))
        try:
            return _train(cfg, run_dir, dist, batches)
        except BaseException:
            if fresh and not (run_dir / "checkpoints").exists():
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
    except BaseException as e:
        if dist is None:
            raise
        with SignalsHeld() as held:  # torchrun's SIGTERM after a sibling died must not cut the explanation short
            error = dist.failure(e)  # another rank stopped: RankLost naming it
            dist.close()
            dist = None
            if not isinstance(e, (KeyboardInterrupt, RunInterrupted)):
                held.keep()  # nor, arriving while the process exits, turn its exit code (1: RankLost) into -15
        if error is e:
            raise
        if (run_dir / "checkpoints").exists():
            error.add_note(f"(the last complete checkpoint stays; resume with train.resume={run_dir})")
        raise error from None
    finally:
        if dist is not None:
            dist.close()


def _clear_run(cfg: RunConfig, run_dir: Path, overwrite: bool, batches: Sequence[Batch] | None) -> bool:
    """Check the run directory, remove an earlier run it holds; whether the run starts fresh."""
    check_run(cfg, run_dir, overwrite, ("train", "eval") if batches is None else ("eval",))
    if holds_run(run_dir) and not resumes_in(cfg, run_dir):  # (checked: an earlier run --overwrite replaces)
        shutil.rmtree(run_dir)
    return not run_dir.exists()


def _train(cfg: RunConfig, run_dir: Path, dist: DistributedRun | None = None,
           batches: Sequence[Batch] | None = None) -> RunResult:
    t, pipe, k = cfg.train, cfg.pipeline, cfg.pipeline.embedding_staleness
    check_train_data(cfg, dist, batches)
    r, state = _open_run(cfg, run_dir, dist, batches)  # parts (fresh, resumed or init_from) and collaborators
    parts, checkpointer, reporter, evaluator = r.parts, r.checkpointer, r.reporter, r.evaluator
    task_w = torch.tensor(t.task_weights, device=parts.device) if t.task_weights else None
    done = t.max_steps is not None and state.step >= t.max_steps  # e.g. resumed at the end already
    first_step, finished_already, resumed_at = state.step, done, (state.epoch, state.batch)
    first_epoch = state.epoch  # the run's first pass over the data (bad rows are counted in it)
    engine_threads, why = engine_on_threads(pipe, parts.device.type == "cuda", k, dist is not None)
    if parts.lead and pipe.enabled:
        log.info(why)
    bad_rows: dict[str, int] = {}

    with StopSignals() as signals:
        while state.epoch < t.epochs and not done:
            data = open_train_loader(cfg, state, dist, batches, stop=lambda: signals.signum is not None)
            checkpointer.follow(data)  # its data positions go into the checkpoints
            reporter.start_pass(data.loader)
            base = state.step
            gate = FetchGate(k, lambda b: r.cadence.barrier_after(base + b + 1), None if t.max_steps is None else t.max_steps - base)
            writes = WriteLog(k, ahead=_prepared_ahead(parts) if engine_threads else 0)
            stages = TrainStages(parts, gate, writes, task_w, first_step=base, window=reporter.window, shards=data.shards)
            agreement = StopAgreement(signals, parts.dist, checkpointer, gate, data.ahead, (r.exporter, reporter.windows),
                                      ahead_of(k))
            run = Scheduler(*_pipeline(data, stages, pipe.depth, not engine_threads), threaded=pipe.enabled,
                            stop_timeout_s=pipe.stop_timeout_s)
            try:
                for item in run:  # a batch planned and fetched ahead (threaded: while the last one computed)
                    if item.index == 0 and not agreement.first():
                        break  # file shards: no rank has a row (e.g. header-only files): no step
                    with run.timing("compute"):
                        stages.compute(item)  # forward, loss, backward, dense step on this thread
                    run.hand_back(item)  # the sparse update and the metrics run behind
                    state.step, state.batch = state.step + 1, state.batch + 1
                    reporter.progress.advance(state.step)
                    agreement.after(item.index, state.step)  # a signal stops every rank after the same step
                    if r.cadence.quiet_after(state.step):
                        run.drain()  # the engine is quiet: every fetched batch trained, every update written
                        if _quiet(r, state, stages, run):
                            done = True  # early stopping, before gate.release(): nothing is fetched past it
                            break
                        gate.release()
                    if t.max_steps is not None and state.step >= t.max_steps:
                        done = True
                        break
                run.drain()
            finally:
                data.close()
                gate.stop()
                run.close()
            if state.epoch == first_epoch:  # a bad row counts once: every later epoch re-reads the same rows
                bad_rows = _merge(bad_rows, data.bad_rows)
            stopping = agreement.after_pass()
            if stopping is not None:
                reporter.progress.close()
                raise RunInterrupted(stopping, str(checkpointer.save(state)))
            if t.mode == "online":
                done = True  # one pass: the stream ended (idle timeout, or the files listed at start)
            if not done:
                state.next_epoch()
                if not cfg.eval.every:
                    reporter.note(evaluator.evaluate(state.step, state))
                    done = state.epoch < t.epochs and evaluator.stops(state.step)  # the next epoch would start at its batch 0
    reporter.progress.close()
    if state.step == first_step and not finished_already and not (t.mode == "online" and t.resume):
        raise no_steps_error(cfg.data, resumed_at if t.resume else None)  # e.g. header-only files (a resumed online run
        # may find no new rows: it ends as it was)
    return _finish(r, state, first_step, bad_rows, shards_files(cfg, dist))


@dataclass
class _Run:
    """A run's parts and the collaborators of its loop (built by ``_open_run``)."""

    cfg: RunConfig
    run_dir: Path
    parts: Components
    history: History
    checkpointer: Checkpointer
    evaluator: Evaluator
    reporter: Reporter
    exporter: Any  # ember.checkpoint.delta's exporter (export.every_steps / every_s)
    cadence: "_Cadence"


def _open_run(cfg: RunConfig, run_dir: Path, dist: DistributedRun | None,
              batches: Sequence[Batch] | None) -> tuple[_Run, RunState]:
    """Build the parts (seeded; restored from ``train.resume`` / ``init_from``), the run's
    history, checkpointer, evaluator, reporter and exporter; and the state the run starts at."""
    t = cfg.train
    advise(cfg.data.batch_size)
    parts, run_dir = prepare_run(cfg, run_dir, dist)
    if parts.lead:
        check_disk(cfg, parts, run_dir)
    history = History(run_dir, resume=t.resume is not None, tensorboard=t.tensorboard, write=parts.lead)
    early = EarlyStopping.from_run(cfg)  # None unless train.early_stopping
    checkpointer = Checkpointer(cfg, parts, run_dir, early)
    evaluator = Evaluator(cfg, parts, history, checkpointer, early)
    state = _start(cfg, parts, dist, run_dir, evaluator)
    exporter = run_exporter(cfg.export, run_dir / "exports", parts, cfg.model_dump(mode="json", by_alias=True),
                            clock=lambda: clock.now())  # the run's clock (tests replace it)
    parts.train(True)
    held = EpochRows(rows=sum(b.size for b in batches)) if batches is not None else EpochRows() if t.mode == "online" else None
    progress = Progress(cfg, state.step, held, enabled=parts.lead)  # total and ETA from the data (CSV: estimated as it reads)
    reporter = Reporter(cfg, parts, history, progress, state.step)
    cadence = _Cadence(cfg, checkpointer, reporter, exporter)
    return _Run(cfg, run_dir, parts, history, checkpointer, evaluator, reporter, exporter, cadence), state


def _quiet(r: _Run, state: RunState, stages: TrainStages, run: Scheduler) -> bool:
    """On a quiet engine after ``state.step``: what is due of the TTL sweep and train record,
    the window report, the eval, the checkpoint and the export. True: early stopping stops the
    run here (after its eval; nothing else is done)."""
    every_eval, step = r.cfg.eval.every, state.step
    if r.reporter.log_due(step):
        expire_tables(r.parts)  # TTL sweep at log time: bounded work, rows expire within log_every steps
        r.reporter.train_record(state, stages, run)
    r.reporter.window_after(step)
    if every_eval and step % every_eval == 0:
        r.reporter.note(r.evaluator.evaluate(step, state))
        if step != r.cfg.train.max_steps and r.evaluator.stops(step):
            return True
    r.checkpointer.after_step(state)
    r.exporter.after_step(step)  # export.every_steps / every_s: full or delta export
    return False


def _finish(r: _Run, state: RunState, first_step: int, bad_rows: dict[str, int], files: bool) -> RunResult:
    """The end of a run: TTL sweep, last export and checkpoint, bad rows over every rank
    (``files``: each rank counted its own), the window's and the final eval's records
    (``restore_best``), plot and ``summary.json``."""
    parts, history = r.parts, r.history
    expire_tables(parts)
    r.exporter.finish(state.step)
    final = r.checkpointer.save(state)
    if files:  # each rank counted the bad rows of its own files
        assert parts.dist is not None
        bad_rows = functools.reduce(_merge, parts.dist.all_gather(bad_rows), {})
    r.reporter.finish(state.step, first_step)  # the window as the run ends
    metrics = r.evaluator.finish(state.step)  # the final state's held-out eval; restore_best
    if parts.lead:
        history.plot()
    history.close()
    summary = {"step": state.step, "checkpoint": str(final), **metrics, "bad_rows": bad_rows, **r.reporter.summary(),
               **r.evaluator.summary()}
    if parts.lead:
        write_bytes_atomic(r.run_dir / "summary.json", json.dumps(json_safe(summary), indent=1).encode(), WriteError)
    return RunResult(r.run_dir, state.step, metrics, history.records, parts, bad_rows)


def _start(cfg: RunConfig, parts: Components, dist: DistributedRun | None, run_dir: Path, evaluator: Evaluator) -> RunState:
    """Where the run starts: afresh, at a resumed checkpoint's state (``train.resume``: parts,
    data position, random state and early stopping exactly as saved), or afresh from a
    checkpoint's weights (``train.init_from``)."""
    t = cfg.train
    state = RunState(data=start_data(cfg, dist))
    if t.resume or t.init_from:
        ckpt = resolve_checkpoint(t.resume or t.init_from)  # type: ignore[arg-type]
        if t.resume and t.init_from:  # (a finetune resumed: init_from only started it)
            log.info("train.resume %s: the run continues from its checkpoint; train.init_from (%s) only started it and "
                     "is not read again", t.resume, t.init_from)
        restored = restore(parts, ckpt, exact=bool(t.resume), cfg=cfg)
        if t.resume:
            world = 1 if dist is None else dist.world_size
            state = restored.state.resumed(str(ckpt), t.mode == "online", world, shards_files(cfg, dist))
            evaluator.resume(restored.dense, ckpt, run_dir)
    return state


def _prepared_ahead(parts: Components) -> int:
    """Batches a device cache's host half is prepared ahead of its fetch, when the embedding
    stages run on threads: 1 where a table group of one process has a group cache
    (``TrainStages.fetch``), else 0."""
    cached = any(g.cache is not None for ec in parts.collections() for g in ec.groups)
    if cached and once.first("train.prepared_ahead", parts.dist is None):
        log.info("pipeline: a table group's device cache decides each batch's rows one batch ahead, while the batch "
                 "before computes" if parts.dist is None else "pipeline: a table group's device cache decides each "
                 "batch's rows when its fetch may run (distributed: a sharded fetch exchanges IDs with the other ranks "
                 "in lockstep; pipeline.embedding_staleness > 0 lets fetches run ahead)")
    return int(cached and parts.dist is None)


def _pipeline(data: TrainLoader, stages: TrainStages, d: QueueDepths, inline: bool) -> tuple[list[Stage], list[Stage]]:
    """The stages ahead of the compute (the loader's, then plan, fetch, [to device]) and behind
    it (update, metrics); ``inline``: on the caller's thread (``pipeline.engine``)."""
    ahead = data.stages() + [Stage("plan", stages.plan, d.plan, inline=inline),
                             Stage("fetch", stages.fetch, d.fetch, inline=inline)]
    if stages.copies:
        ahead.append(Stage("device", stages.to_device, d.device, inline=inline))
    behind = [Stage("update", stages.update, d.update, inline=inline), Stage("metrics", stages.metrics, d.update, inline=inline)]
    return ahead, behind


class _Cadence:
    """When the trainer needs a quiet engine after a step: a train record, an eval, a
    checkpoint, an export or a window report is due."""

    def __init__(self, cfg: RunConfig, checkpointer: Checkpointer, reporter: Reporter, exporter: Any) -> None:
        self.t, self.checkpointer, self.windows, self.exporter = cfg.train, checkpointer, reporter.windows, exporter
        self.every_eval = cfg.eval.every
        self.one_process = checkpointer.parts.dist is None

    def quiet_after(self, s: int) -> bool:
        t = self.t
        return s % t.log_every == 0 or bool(self.every_eval and s % self.every_eval == 0) or self.checkpointer.due(s) \
            or self.exporter.due(s) or self.windows.after(s)

    def barrier_after(self, s: int) -> bool:
        """``quiet_after``, deciding the time-based reports when step ``s`` is fetched (so the
        fetch gate and the loop agree on them): a checkpoint is due once ``checkpoint.every_s``
        passed since the last save (one process: distributed, the ranks agree on it after
        each step, as on the window's ``window_every_s`` and the exporter's ``every_s``), and no
        other is marked before it is written."""
        if self.one_process:
            if self.checkpointer.time_due():
                self.checkpointer.mark(s)
            self.windows.decide(s)
        return self.quiet_after(s)


def _merge(acc: dict[str, int], report: Any) -> dict[str, int]:
    """``acc`` plus a report's counts per reason (a ``BadRowReport``, or a dict of them)."""
    counts = (report if isinstance(report, dict) else getattr(report, "counts", None)) or {}
    out = dict(acc)
    for k, v in dict(counts).items():
        out[k] = out.get(k, 0) + int(v)
    return out
