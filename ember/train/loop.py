"""The training loop, read top to bottom. ``train_step`` is one step in plain form (forward,
loss, backward, dense step, sparse step). ``train`` runs the same work as a pipeline of stages
(``ember.train.stages``: read -> featurize -> plan -> fetch -> [to device] -> compute -> update
-> metrics) on threads or in line, and logs, evaluates and checkpoints on a quiet engine.
SIGINT / SIGTERM finish the batches already fetched, checkpoint, and raise ``RunInterrupted``.
``train.mode: online`` makes one pass over a stream of files (``ember.pipeline.stream``; its
checkpoints record the stream position) instead of epochs; ``eval.window_rows`` reports the
training forward's scores of the most recent rows (``ember.train.window``).
Distributed, the ranks agree each step (one tiny all-reduce) so that a signal to any rank stops
them all after the same step, with one checkpoint; under ``data.shard: files`` the same
all-reduce tells every rank the others' rows two steps ahead (``ember.train.shards``).
Everything else (building parts, data, checkpoint files) lives elsewhere.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from ember.allocator import advise
from ember.batch import Batch
from ember.checkpoint.load import (
    load_dense, load_tables, resolve_checkpoint, restore_rng, restore_table_state, verify_checkpoint,
)
from ember.checkpoint.delta import run_exporter
from ember.checkpoint.save import save_checkpoint
from ember.config import RunConfig, to_yaml
from ember.distributed.process_group import DistributedRun
from ember.errors import CheckpointError, ConfigError, RunInterrupted, WriteError
from ember.fileio import write_bytes_atomic
from ember.outputs import mark
from ember.embedding.optimizer import SparseOptimizer
from ember.pipeline.config import engine_on_threads
from ember.pipeline.loader import BatchList, empty_batch, make_batches
from ember.pipeline.scheduler import Scheduler, Stage
from ember.pipeline.staleness import FetchGate, WriteLog
from ember.pipeline.stream import StreamLoader, StreamPosition
from ember.train.builder import Components, build_components
from ember.train.early_stop import EarlyStopping
from ember.train.distributed import config_differences, flatten, lead_prepares_run, start_run
from ember.train.evaluate import evaluate
from ember.train.history import History
from ember.train.metrics import json_safe
from ember.train.preflight import check_disk, check_run, holds_run, no_steps_error
from ember.train.progress import EpochRows, Progress
from ember.train.schedule import lr_record
from ember.train.shards import FileShards, shard_start
from ember.train.stages import TrainStages
from ember.train.window import RollingWindow

log = logging.getLogger("ember.train")
_clock = time.monotonic  # the clock of train.checkpoint_every_s and eval.window_every_s (tests replace it)

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
    """One step: forward, loss, backward, dense step, sparse step; returns the (detached) loss."""
    logits = parts.forward(batch)  # every table group: plan (dedupe), fetch rows, pool
    loss = parts.loss(batch, logits, task_weights)
    opt = parts.sparse_optimizer
    ready = parts.backward(loss, opt.steps)  # dense grads + one summed gradient per unique ID; dense step
    SparseOptimizer.apply(ready, opt.steps)  # update the touched rows and write them back to their tiers
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
        with _SignalsHeld():  # torchrun's SIGTERM after a sibling died must not cut the explanation short
            error = dist.failure(e)  # another rank stopped: RankLost naming it
            dist.close()
            dist = None
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
    if cfg.train.resume is None and holds_run(run_dir):
        shutil.rmtree(run_dir)
    return not run_dir.exists()


def _train(cfg: RunConfig, run_dir: Path, dist: DistributedRun | None = None,
           batches: Sequence[Batch] | None = None) -> RunResult:
    t = cfg.train
    advise(cfg.data.batch_size)
    parts, run_dir = prepare_run(cfg, run_dir, dist)
    if parts.lead:
        check_disk(cfg, parts, run_dir)
    history = History(run_dir, resume=t.resume is not None, tensorboard=t.tensorboard, write=parts.lead)
    task_w = torch.tensor(t.task_weights, device=parts.device) if t.task_weights else None
    step, epoch, start_batch = 0, 0, 0
    online = t.mode == "online"
    if online and batches is not None:
        raise ConfigError("train.mode: online streams data.train; batches held in memory have no stream: pass "
                          "batches with train.mode: offline, or data.train files without them")
    stream_start = StreamPosition()  # online: where the stream starts (a resumed run: the checkpoint's)
    rank, world = (0, 1) if dist is None else (dist.rank, dist.world_size)
    files = dist is not None and cfg.data.shard == "files"  # data.shard: files (ember.train.shards)
    if files and batches is not None:
        raise ConfigError("data.shard: files gives each rank its own data.train files; batches held in memory have "
                          "none: use data.shard: rows with them")
    rank_starts = [0] * world  # files: each rank's first batch in its own files, this epoch
    early = EarlyStopping.from_run(cfg)  # None unless train.early_stopping
    if t.resume or t.init_from:
        ckpt = resolve_checkpoint(t.resume or t.init_from)  # type: ignore[arg-type]
        manifest = verify_checkpoint(ckpt, parts.dist)  # distributed: the ranks share the hashing
        load_tables(ckpt, parts.collections(), manifest, parts.owned())
        dense = load_dense(ckpt)
        with _fits(ckpt, manifest, cfg, "model"):
            parts.model.load_state_dict(dense["model"])
        if t.resume:  # exact continuation: optimizers, counters, data position and RNG too
            with _fits(ckpt, manifest, cfg, "train.dense_optimizer"):
                parts.dense_optimizer.load_state_dict(dense["optimizer"])
            if parts.scaler is not None and "loss_scaler" in dense:
                parts.scaler.load_state_dict(dense["loss_scaler"])
            restore_table_state(parts.collections(), dense, parts.owned())
            step = manifest["step"]
            epoch, start_batch = manifest["position"]["epoch"], manifest["position"]["batch"]
            shard_start(manifest["position"], world, rank, files)  # ConfigError when the position does not fit
            if files and start_batch:
                rank_starts = [int(b) for b in manifest["position"]["rank_batches"]]
            stream_start = _stream_start(cfg, manifest["position"], ckpt)
            restore_rng(dense["rng"])
            if early is not None:
                early.load_state_dict(dense.get("early_stopping"), ckpt.parent, run_dir / "checkpoints")

    saved: dict[tuple[int, int, int], Path] = {}
    last_save = [_clock()]  # when the last checkpoint was written (train.checkpoint_every_s)
    stream: list[StreamLoader] = []  # online: the loader, whose stream position the checkpoints record
    shards: list[FileShards] = []  # files: this pass's shard agreement, whose positions the checkpoints record

    def checkpoint(epoch: int, batch: int) -> Path:
        if (step, epoch, batch) in saved:  # this exact state is on disk already
            return saved[(step, epoch, batch)]
        state = {"model": parts.model.state_dict(), "optimizer": parts.dense_optimizer.state_dict()}
        if parts.scaler is not None:
            state["loss_scaler"] = parts.scaler.state_dict()
        if early is not None:
            state["early_stopping"] = early.state_dict()
        position: dict[str, Any] = {"epoch": epoch, "batch": batch}
        if stream:
            position.update(stream[0].stream_position(batch).to_dict())
        if files:  # each rank's batch index in its own files (0 at an epoch's start)
            if not batch:
                ranks = [0] * world
            elif shards:
                ranks = shards[0].positions(batch - shards[0].first_batch)
            else:  # resumed with nothing left to train: where the checkpoint was
                ranks = list(rank_starts)
            position.update({"shard": "files", "world_size": world, "rank_batches": ranks})
        # distributed: every rank writes its own part of every table, rank 0 the manifest last
        path = save_checkpoint(run_dir / "checkpoints", step, parts.collections(), state, position,
                               cfg.model_dump(mode="json", by_alias=True), t.keep_checkpoints, parts.dist)
        saved[(step, epoch, batch)] = path
        last_save[0] = _clock()
        return path

    def run_eval(position: tuple[int, int] | None = None) -> dict[str, float]:
        """Evaluate and log; during training (``position``: epoch, batch) early stopping watches it."""
        if cfg.data.eval is None and cfg.data.format != "synthetic":
            return {}
        batches = make_batches(cfg.data, cfg.schema, "eval", threaded=cfg.pipeline.enabled, depth=cfg.pipeline.depth)
        m = evaluate(parts, batches, t.eval_max_batches)
        watched = {} if early is None or position is None else early.observe(step, m, lambda: checkpoint(*position))
        history.log({"kind": "eval", "step": step, **m, **watched})
        return m

    bad_rows: dict[str, int] = {}
    metrics: dict[str, float] = {}
    pipe = cfg.pipeline
    exporter = run_exporter(cfg.export, run_dir / "exports", parts, cfg.model_dump(mode="json", by_alias=True))

    closing = [False]  # the pass is over: a watched stream stops waiting for files

    def train_loader(epoch: int, start_batch: int) -> Any:
        if batches is not None:
            return BatchList(batches, epoch, start_batch, pipe.depth)
        if online:
            stream[:] = [StreamLoader(cfg.data, cfg.schema, stream_start, start_batch, pipe.depth,
                                      stop=lambda: stop.signum is not None or closing[0], workers=pipe.data_workers)]
            return stream[0]
        if files:
            return make_batches(cfg.data, cfg.schema, "train", epoch=epoch, start_batch=rank_starts[rank],
                                depth=pipe.depth, workers=pipe.data_workers, part=(rank, world))
        # distributed synthetic data: each rank generates and featurizes its slice of each batch alone
        mine = (rank, world) if dist is not None and cfg.data.format == "synthetic" else None
        return make_batches(cfg.data, cfg.schema, "train", epoch=epoch, start_batch=start_batch, depth=pipe.depth,
                            workers=pipe.data_workers, rank_slice=mine)

    parts.train(True)
    held = EpochRows(rows=sum(b.size for b in batches)) if batches is not None else EpochRows() if online else None
    progress = Progress(cfg, step, held, enabled=parts.lead)  # total and ETA from the data (CSV: estimated as it reads)
    done = t.max_steps is not None and step >= t.max_steps  # e.g. resumed at the end already
    first_step, finished_already = step, done
    first_epoch = epoch  # the run's first pass over the data (bad rows are counted in it)
    batch_idx = start_batch
    k = t.embedding_staleness
    engine_threads, why = engine_on_threads(pipe, parts.device.type == "cuda", k, dist is not None)
    if parts.lead and pipe.enabled:
        log.info(why)

    logged = [step]  # the step of the last train record (bytes are reported per step since)
    due: set[int] = set()  # steps after which train.checkpoint_every_s asked for a checkpoint
    window, report_window = _rolling_window(cfg, parts)  # eval.window_rows: progressive validation

    def quiet_after(s: int) -> bool:
        """Whether the trainer needs a quiet engine after step ``s`` (log, eval, checkpoint)."""
        return s % t.log_every == 0 or bool(t.eval_every and s % t.eval_every == 0) or bool(
            t.checkpoint_every and s % t.checkpoint_every == 0) or s in due or exporter.due(s) or report_window.after(s)

    def barrier_after(s: int) -> bool:
        """``quiet_after``, deciding time-based checkpoints when step ``s`` is fetched (so the
        fetch gate and the loop agree on them): one is due once ``checkpoint_every_s`` passed
        since the last save, and no other is marked before it is written."""
        if parts.dist is None and checkpoint_due():
            due.add(s)
        report_window.decide(s)
        return quiet_after(s)

    def checkpoint_due() -> bool:
        return t.checkpoint_every_s is not None and not due and _clock() - last_save[0] >= t.checkpoint_every_s

    stopping: int | None = None  # the signal that stops the run (distributed: agreed on by every rank)

    with _StopSignals() as stop:
        while epoch < t.epochs and not done:
            loader = train_loader(epoch, start_batch)
            progress.watch(loader)
            base = step
            gate = FetchGate(k, lambda b: barrier_after(base + b + 1), None if t.max_steps is None else t.max_steps - step)
            shard = FileShards(rank, world, empty_batch(cfg.schema), rank_starts, start_batch) if files else None
            shards[:] = [shard] if shard is not None else []
            stages = TrainStages(parts, gate, WriteLog(k), task_w, first_step=base, window=window, shards=shard)
            d = pipe.depth
            ahead = loader.stages() + ([shard.stage(d.featurize)] if shard is not None else [])
            il = not engine_threads
            ahead += [Stage("plan", stages.plan, d.plan, inline=il), Stage("fetch", stages.fetch, d.fetch, inline=il)]
            if stages.copies:
                ahead.append(Stage("device", stages.to_device, d.device, inline=il))
            behind = [Stage("update", stages.update, d.update, inline=il), Stage("metrics", stages.metrics, d.update, inline=il)]
            batch_idx = start_batch
            t0 = time.perf_counter()
            run = Scheduler(ahead, behind, threaded=pipe.enabled, stop_timeout_s=pipe.stop_timeout_s)
            try:
                for item in run:
                    if shard is not None and item.index == 0:  # the rows of the pass's first steps
                        assert parts.dist is not None
                        shard.start(parts.dist)
                        if shard.end == 0:
                            break  # no rank has a row (e.g. header-only files): no step
                        if shard.end is not None:
                            gate.end_at(shard.end)
                    with run.timing("compute"):
                        stages.compute(item)
                    run.hand_back(item)
                    step += 1
                    batch_idx += 1
                    progress.advance(step)
                    if parts.dist is None:
                        stopping = stop.signum
                    else:  # one tiny all-reduce: every rank stops after the same step, and checkpoints it
                        # (files: and learns every rank's rows two steps ahead; the pass ends where none has any)
                        agreed = parts.dist.agree([stop.signum or 0, int(checkpoint_due())]
                                                  + (shard.ask(item.index) if shard is not None else []))
                        signum, time_due = agreed[:2]
                        if shard is not None:
                            shard.hear(item.index, agreed[2:])
                            if shard.end is not None:
                                gate.end_at(shard.end)
                        stopping = signum or None
                        if time_due:  # at step + 2: its batch is not fetched yet (the pipeline's fetch
                            due.add(step + 2)  # of step + 1 may be), so the fetch gate holds after it
                    if stopping is not None:
                        gate.stop()  # no more fetches; the batches already fetched still train
                    if quiet_after(step):
                        run.drain()
                        if step % t.log_every == 0:
                            loss_sum, seen = stages.take_metrics()
                            now = time.perf_counter()
                            rec = {"kind": "train", "step": step, "epoch": epoch, "loss": loss_sum / max(seen, 1),
                                   "samples_per_s": seen / (now - t0)}
                            rec.update(lr_record(parts, step))
                            rec.update(_table_stats(parts))
                            if parts.dist is not None:  # this rank's tables; bytes exchanged per step
                                rec.update(parts.dist.exchange.take_stats(step - logged[0]))
                                logged[0] = step
                            rec.update({f"pipeline.{key}": v for key, v in run.stats().items()})
                            history.log(rec)
                            progress.update(step, rec)
                            t0 = now
                        if report_window.after(step):
                            report_window.log(step, history)
                        if t.eval_every and step % t.eval_every == 0:
                            metrics = run_eval((epoch, batch_idx))
                            progress.note(_fmt(metrics))
                            if early is not None and step != t.max_steps and early.stop_here(step):
                                done = True
                                break  # before gate.release(): nothing is fetched past the stop
                        if t.checkpoint_every and step % t.checkpoint_every == 0 or step in due:
                            checkpoint(epoch, batch_idx)
                            due.discard(step)
                        exporter.after_step(step)  # export.every_steps / every_s: full or delta export
                        gate.release()
                    if t.max_steps is not None and step >= t.max_steps:
                        done = True
                        break
                run.drain()
            finally:
                closing[0] = True
                gate.stop()
                run.close()
            if epoch == first_epoch:  # a bad row counts once: every later epoch re-reads the same rows
                bad_rows = _merge(bad_rows, loader.bad_rows)
            if parts.dist is None:
                stopping = stop.signum  # also a signal during the last step
            if stopping is not None:
                progress.close()
                path = checkpoint(epoch, batch_idx)
                raise RunInterrupted(stopping, str(path))
            if online:
                done = True  # one pass: the stream ended (idle timeout, or the files listed at start)
            if not done:
                epoch, start_batch, rank_starts = epoch + 1, 0, [0] * world
                if not t.eval_every:
                    metrics = run_eval((epoch, 0))
                    progress.note(_fmt(metrics))
                    if early is not None and epoch < t.epochs and early.stop_here(step):
                        done, batch_idx = True, 0  # the next epoch would start at its batch 0
    progress.close()
    if step == first_step and not finished_already and not (online and t.resume):  # e.g. header-only files
        raise no_steps_error(cfg.data)  # (a resumed online run may find no new rows: it ends as it was)
    for ec in parts.collections():
        for table in ec.tables.values():
            table.expire()
    exporter.finish(step)
    final = checkpoint(epoch, batch_idx if done else 0)
    if files:  # each rank counted the bad rows of its own files
        assert parts.dist is not None
        summed: dict[str, int] = {}
        for counts in parts.dist.all_gather(bad_rows):
            summed = _merge(summed, counts)
        bad_rows = summed
    if window is not None and report_window.last != step and step > first_step:
        report_window.log(step, history)  # the window as the run ends
    last = history.records[-1] if history.records else {}
    if not metrics or last.get("kind") != "eval" or "window_rows" in last:  # no held-out eval of the final state yet
        metrics = run_eval()
    if early is not None:  # restore_best: the run's model and metrics become the best eval's
        history.log({"kind": "early_stopping", "step": step, **early.summary()})
        metrics = early.finish(parts, metrics, history.records)
    if parts.lead:
        history.plot()
    history.close()
    summary = {"step": step, "checkpoint": str(final), **metrics, "bad_rows": bad_rows,
               **({"window": json_safe(window.metrics())} if window is not None else {}),
               **({"early_stopping": early.summary()} if early is not None else {})}
    if parts.lead:
        write_bytes_atomic(run_dir / "summary.json", json.dumps(json_safe(summary), indent=1).encode(), WriteError)
    return RunResult(run_dir, step, metrics, history.records, parts, bad_rows)


class _StopSignals:
    """While training (on the main thread): SIGINT and SIGTERM ask the loop to stop at the next
    batch and checkpoint (``signum`` is set); a second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _stream_start(cfg: RunConfig, position: dict[str, Any], ckpt: Path) -> StreamPosition:
    """Where a resumed online run's stream starts: the checkpoint's stream position (an offline
    run's checkpoint has none; an offline run cannot resume an online one's)."""
    if cfg.train.mode == "online":
        return StreamPosition.from_position(position, str(ckpt))
    if "files_done" in position:
        raise CheckpointError(f"{ckpt} was written by a train.mode: online run (its position is in a stream of files); "
                              "resume it with train.mode: online, or start an offline run from its weights with "
                              f"train.init_from={ckpt}")
    return StreamPosition()


class _WindowReports:
    """When the rolling window is reported: every ``eval.window_every`` steps (default
    ``train.log_every``), and, with ``eval.window_every_s``, after the first step whose batch
    is fetched that long after the last report (decided at the fetch, like time-based
    checkpoints, so the fetch gate and the loop agree)."""

    def __init__(self, window: RollingWindow | None, every: int | None, every_s: float | None) -> None:
        self.window, self.every, self.every_s = window, every, every_s
        self.due: set[int] = set()
        self.last = -1  # the step last reported
        self._at = _clock() if window is not None and every_s is not None else 0.0  # when it was

    def decide(self, s: int) -> None:
        if self.window is not None and self.every_s is not None and not self.due and _clock() - self._at >= self.every_s:
            self.due.add(s)

    def after(self, s: int) -> bool:
        return self.window is not None and (bool(self.every and s % self.every == 0) or s in self.due)

    def log(self, step: int, history: History) -> None:
        """One ``eval`` record of the window (``window_rows``: the pairs it held) at ``step``."""
        assert self.window is not None
        m = self.window.metrics()
        if m:
            history.log({"kind": "eval", "step": step, **m})
        self.due.discard(step)
        self.last = step
        if self.every_s is not None:
            self._at = _clock()


def _rolling_window(cfg: RunConfig, parts: Components) -> tuple[RollingWindow | None, _WindowReports]:
    """``eval.window_rows``' window (None when unset) and when to report it."""
    e = cfg.eval
    window = RollingWindow(e.window_rows, parts.task_names) if e.window_rows is not None else None
    every = e.window_every or (cfg.train.log_every if e.window_every_s is None else None)
    return window, _WindowReports(window, every, e.window_every_s)


@contextmanager
def _fits(ckpt: Path, manifest: dict[str, Any], cfg: RunConfig, section: str) -> Iterator[None]:
    """Turn torch's error for a state that does not fit (another model shape, another dense
    optimizer) into a CheckpointError naming the config keys that differ from the checkpoint's
    run (every rank of a distributed run raises the same)."""
    try:
        yield
    except (RuntimeError, ValueError, KeyError) as e:
        mine = {k: v for k, v in flatten(cfg.model_dump(mode="json", by_alias=True)).items() if k.startswith(section + ".")}
        saved = {k: v for k, v in flatten(manifest.get("config", {})).items() if k.startswith(section + ".")}
        diffs = config_differences([saved, mine], names=["checkpoint", "this config"])
        raise CheckpointError(
            f"checkpoint {ckpt} does not fit this config's {section} ({type(e).__name__}: {' '.join(str(e).split())[:240]}); "
            + (f"it was written with {'; '.join(diffs)}; " if diffs else "")
            + f"resume or init_from it with the {section} it was trained with") from None


class _SignalsHeld:
    """SIGINT and SIGTERM are noted, not acted on, for the moment of the block (on the main
    thread; elsewhere nothing changes)."""

    def __enter__(self) -> "_SignalsHeld":
        self._old: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, lambda signum, frame: None)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _table_stats(parts: Components) -> dict[str, float]:
    """Per-table rows and tier metrics since the last log (hit rates, promotions, evictions)."""
    out: dict[str, float] = {}
    for ec in parts.collections():
        for name, table in ec.tables.items():
            table.expire()  # TTL sweep at log time: bounded work, rows expire within log_every steps
            for key, value in table.stats().items():
                out[f"{name}/{key}"] = value
            table.reset_step_stats()
    return out


def _merge(acc: dict[str, int], report: Any) -> dict[str, int]:
    """``acc`` plus a report's counts per reason (a ``BadRowReport``, or a dict of them)."""
    counts = (report if isinstance(report, dict) else getattr(report, "counts", None)) or {}
    out = dict(acc)
    for k, v in dict(counts).items():
        out[k] = out.get(k, 0) + int(v)
    return out


def _fmt(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4f}" for k, v in metrics.items() if k != "rows")
