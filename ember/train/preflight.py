"""Checks that run before the first training step, so a run fails in seconds, not after hours.

``check_run`` (called at the start of ``train()``): the train and eval paths expand to files;
each file has the schema's columns and at least one row, read from its header or footer only
(CSV: the first lines; Parquet/ORC: the metadata); the output directory is writable; and a run
directory that already holds a run is replaced only when asked, one that holds anything else
never (``check_run_dir``, the rule of ``ember.outputs``). ``check_disk`` (once the tables
and model are built): the checkpoints ``checkpoint.keep`` keeps fit the free space.
``check_resume`` (part of ``check_run``): ``train.resume`` names a run not finished already.
``no_steps_error`` names the train files of a run that trained no step.

Example:
    >>> from ember.config import from_dict
    >>> cfg = from_dict({"data": {"format": "csv", "train": "/nonexistent/*.csv"}, "schema": {
    ...     "labels": ["y"], "sparse": [{"name": "a"}]}, "model": {"type": "lr"}})
    >>> check_run(cfg, Path("/tmp/run"))
    Traceback (most recent call last):
    ...
    ember.errors.ConfigError: data path '/nonexistent/*.csv' matches no csv file; ...
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal


from ember.config import RunConfig
from ember.errors import CapacityError, ConfigError, DataError, MissingColumnsError
from ember.fileio import fmt_bytes, free_bytes, nearest_existing
from ember.outputs import check_own, check_writable, output_kind
from ember.pipeline.loader import missing_keys_error
from ember.source.config import DataConfig
from ember.source.file_source import names
from ember.source.files import expand_paths
from ember.source.protocol import source_for
from ember.source.synthetic import synthetic_columns
from ember.train.builder import Components
from ember.train.early_stop import EarlyStopping
from ember.train.tensorboard import require_tensorboard

__all__ = ["check_run", "check_run_dir", "check_resume", "check_disk", "check_data", "no_steps_error", "holds_run",
           "resumes_in"]

log = logging.getLogger("ember")
Split = Literal["train", "eval"]
_EVAL_KEYS = "eval.group_by / eval.slices"


def check_run(cfg: RunConfig, run_dir: Path, overwrite: bool = True, splits: tuple[Split, ...] = ("train", "eval")) -> None:
    """Every check that needs no built parts: data files and schema of ``splits``, output
    directory, run name."""
    keys = cfg.eval.key_columns  # eval.group_by / eval.slices: the eval data must have them too
    for split in splits:
        columns = cfg.schema.columns
        wanted = [k for k in keys if k not in columns] if split == "eval" else []
        try:
            check_data(cfg.data, columns + wanted, split)
        except MissingColumnsError as e:
            raise missing_keys_error(e, wanted, _EVAL_KEYS) from None
    if keys and "eval" in splits and cfg.data.format == "synthetic":
        dense, sparse = synthetic_columns(cfg.data.synthetic)
        names = ["label", *dense, *sparse]
        missing = [k for k in keys if k not in names]
        if missing:
            raise missing_keys_error(MissingColumnsError("", missing, names), missing, _EVAL_KEYS)
    check_resume(cfg)
    if cfg.train.resume is None:
        check_run_dir(run_dir, overwrite)
    elif not resumes_in(cfg, run_dir) and holds_run(run_dir):  # the continuation would go into another run
        if not overwrite:
            raise ConfigError(
                f"train.resume {cfg.train.resume} would continue in run directory {run_dir} (train.out_dir / "
                f"train.run_name), which holds another run; set train.run_name to the resumed run's name to continue "
                f"it there, or a new name to continue it in a new directory, or pass --overwrite to replace {run_dir}")
        check_run_dir(run_dir, overwrite)
    init = cfg.train.init_from
    if init is not None and holds_run(run_dir) and cfg.train.resume is None and \
            Path(init).resolve().is_relative_to(run_dir.resolve()):
        raise ConfigError(f"train.init_from {init} lies inside run directory {run_dir}, which this run would "
                          "replace; copy the checkpoint elsewhere or pick another train.run_name")
    if cfg.train.tensorboard:
        require_tensorboard()
    EarlyStopping.from_run(cfg)  # its config errors (a metric naming no task, no eval data) before anything is built
    base = nearest_existing(run_dir)
    if not base.is_dir():
        raise ConfigError(f"output directory {run_dir} cannot be written ({base} is not a directory); "
                          "set train.out_dir to a writable directory")
    check_writable(base, f"output directory {run_dir}", "set train.out_dir to a writable directory")


def check_run_dir(run_dir: Path, overwrite: bool) -> None:
    """A run goes to a new (or empty) directory, or replaces an earlier run there when
    ``overwrite``; a directory holding anything else (an export, files ember did not write) is
    never replaced (``ember.outputs``). A run that never reached a checkpoint is no run."""
    if not run_dir.exists() or (run_dir.is_dir() and next(run_dir.iterdir(), None) is None):
        return
    kind = output_kind(run_dir)
    if kind != "run":
        holds = f"holds {kind} output" if kind else "holds files ember did not write" if run_dir.is_dir() else "is a file"
        raise ConfigError(f"run directory {run_dir} (train.out_dir / train.run_name) already exists and {holds}, not a "
                          "training run; a run replaces only an earlier run, even with --overwrite: pick another "
                          "train.run_name or train.out_dir")
    if holds_run(run_dir) and not overwrite:
        raise ConfigError(
            f"run directory {run_dir} already holds a run (train.run_name '{run_dir.name}'); pick another "
            "train.run_name, resume it with train.resume=" f"{run_dir}, or pass --overwrite to replace it")
    if holds_run(run_dir):  # replaced: only if every entry in it is the run's
        check_own(run_dir, "run", f"run directory {run_dir} (train.out_dir / train.run_name)")


def check_resume(cfg: RunConfig) -> None:
    """ConfigError when ``train.resume`` or ``train.init_from`` names an export (it holds no
    optimizer state or position: not a checkpoint), or ``train.resume`` an offline run that is
    finished already: its checkpoint reached ``train.max_steps`` or the end of epoch
    ``train.epochs`` (it would train no step). The error names the step and epoch it ended at
    and the key to raise. Reads the manifest only (the hashes are checked when the run loads it)."""
    t = cfg.train
    if t.init_from is not None:
        _checkpoint_manifest("train.init_from", t.init_from)
    if t.resume is None or t.mode == "online":  # online: a resumed run reads whatever rows arrived since
        return
    manifest = _checkpoint_manifest("train.resume", t.resume)
    step, epoch = int(manifest["step"]), int(manifest["position"]["epoch"])
    trained_on, now = (manifest.get("config") or {}).get("data", {}).get("train"), cfg.data.model_dump(mode="json").get("train")
    if trained_on is not None and trained_on != now:
        log.warning("train.resume %s: data.train is %s, the run read %s before; it resumes at the checkpoint's place "
                    "(batch %s of epoch %d) in the data given now", t.resume, now, trained_on,
                    manifest["position"].get("batch", "?"), epoch)
    was = (manifest.get("config") or {}).get("data", {}).get("batch_size")
    if "batch" in manifest["position"] and was is not None and was != cfg.data.batch_size:
        raise ConfigError(f"train.resume {t.resume}: its data position counts batches of {was} rows (batch "
                          f"{manifest['position']['batch']} of epoch {epoch}), but data.batch_size is now "
                          f"{cfg.data.batch_size}: it would resume at the wrong row; resume with data.batch_size={was}, "
                          "or start a finetune from it with train.init_from")
    if t.max_steps is not None and step >= t.max_steps:
        raise ConfigError(f"train.resume {t.resume}: the run is finished: it reached step {step} and train.max_steps is "
                          f"{t.max_steps}; raise train.max_steps above {step} to train further (e.g. "
                          f"train.max_steps={max(2 * step, step + 1)})")
    if epoch >= t.epochs:
        raise ConfigError(f"train.resume {t.resume}: the run is finished: it reached step {step} after {epoch} full "
                          f"epoch(s) and train.epochs is {t.epochs}; raise train.epochs above {epoch} to train further "
                          f"(e.g. train.epochs={epoch + 1})")


def _checkpoint_manifest(key: str, given: str) -> dict:
    """The manifest of the checkpoint ``key`` names (a run directory: its latest); ConfigError
    when it is an export."""
    from ember.checkpoint.load import read_manifest, resolve_checkpoint
    from ember.outputs import manifest_kind

    ckpt = resolve_checkpoint(given)
    if manifest_kind(ckpt) == "export":  # (anything else: read_manifest says what is wrong with it)
        raise ConfigError(f"{key} {given} is an export (written by ember export or train --export), not a checkpoint: "
                          "it holds no optimizer state or data position; give a training run directory or one of its "
                          "checkpoints (<run>/checkpoints/step-N)")
    return read_manifest(ckpt)


def resumes_in(cfg: RunConfig, run_dir: Path) -> bool:
    """Whether ``train.resume`` names a checkpoint of ``run_dir`` (the run continues where it was)."""
    return cfg.train.resume is not None and Path(cfg.train.resume).resolve().is_relative_to(run_dir.resolve())


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run's results (checkpoints or a summary), not just a failed start."""
    return (run_dir / "checkpoints").is_dir() or (run_dir / "summary.json").exists()


def check_data(data: DataConfig, columns: list[str], split: Split) -> list[str]:
    """The units of ``split`` checked (file paths, a query's label, a table's data files; none
    for synthetic data, an unset split or a watched one); raises when a path matches nothing, a
    unit lacks a column, or the split holds no row (``Source.check``: headers, footers, metadata
    or ``LIMIT 1`` only)."""
    if not data.holds(split):
        return []
    return [u.name for u in source_for(data).check(split, columns)]


def no_steps_error(data: DataConfig, resumed_at: tuple[int, int] | None = None) -> DataError:
    """The error for a run that trained no step: which data gave no batch, and what to check.
    ``resumed_at``: (epoch, batch) a resumed run started from, when the data ended before it."""
    if resumed_at is not None and resumed_at[1] > 0:
        epoch, batch = resumed_at
        return DataError(f"training ran 0 steps: the run resumed at batch {batch} of epoch {epoch} (where its checkpoint "
                         f"stopped), and data.train gave no batch past it: the data holds fewer batches than the run "
                         f"read before (data.train or data.batch_size changed since?); resume with the data it was "
                         f"trained on, raise train.epochs to go on with the next epoch, or start a new run from the "
                         f"checkpoint's weights with train.init_from")
    if data.watch is not None:
        return DataError(f"training ran 0 steps: no rows arrived in data.train ({', '.join(data.paths('train'))}) "
                         f"within data.watch.idle_timeout_s ({data.watch.idle_timeout_s} s); check that files of "
                         f"format {data.format} appear there and become ready (data.watch.ready: {data.watch.ready}), "
                         "or raise the timeout")
    if data.format == "sql":
        return DataError("training ran 0 steps: data.sql.query gave no batch; check that it returns rows, that "
                         "data.on_bad_rows: skip did not skip them all, and data.drop_last with fewer rows than "
                         "data.batch_size")
    if data.format == "iceberg" and data.iceberg is not None:
        return DataError(f"training ran 0 steps: data.iceberg.table '{data.iceberg.table}' gave no batch; check that "
                         "its snapshot holds rows the row filter keeps, that data.on_bad_rows: skip did not skip them "
                         "all, and data.drop_last with fewer rows than data.batch_size")
    where = "the synthetic generator" if data.format == "synthetic" else names(expand_paths(data.paths("train"), data.format,
                                                                                        data.storage_options, "data.train"))
    return DataError(f"training ran 0 steps: data.train ({where}) gave no batch; check that the files hold rows, "
                     "that data.on_bad_rows: skip did not skip them all, and data.drop_last with fewer rows than "
                     "data.batch_size")


def check_disk(cfg: RunConfig, parts: Components, run_dir: Path) -> int:
    """Estimated bytes of the checkpoints a run keeps (``checkpoint.keep`` + one being written,
    + early stopping's best);
    CapacityError when even the dense part cannot fit, a warning when the estimate does not."""
    dense = sum(p.numel() * p.element_size() for p in parts.model.parameters()) * 3  # weights + 2 Adam moments
    table = 0
    train_rows = _train_rows(cfg)  # once: a SQL source counts with a query, object storage reads footers
    for ec in parts.collections():
        for t in ec.tables.values():
            features = [f.name for f in ec.features if f.table_name == t.name]
            table += _rows_bound(cfg, features, train_rows) * (8 + 4 * t.config.stored_words)  # rows packed at the table's dtype
    es = cfg.train.early_stopping
    copies = cfg.checkpoint.keep + 1 + (1 if es is not None and es.save_best else 0)  # + early stopping's best
    free = free_bytes(run_dir)
    if dense * copies > free:
        raise CapacityError(f"{run_dir}: {copies} checkpoints of the dense model alone take {fmt_bytes(dense * copies)} "
                            f"but {fmt_bytes(free)} is free; free space, set train.out_dir on a larger volume or "
                            "lower checkpoint.keep")
    need = (dense + table) * copies
    if need > free:
        log.warning("checkpoints may need up to %s at %s (%d kept + 1 being written, tables at their largest) but %s "
                    "is free; free space or lower checkpoint.keep if a save fails", fmt_bytes(need), run_dir,
                    copies - 1, fmt_bytes(free))
    return need


def _train_rows(cfg: RunConfig) -> int:
    """Training rows as the source counts them without reading them (files: Parquet/ORC row
    counts, CSV extrapolated from the lines in its first 64 KiB; SQL: ``COUNT(*)``); 0 for
    synthetic data and streams (no bound known up front)."""
    data = cfg.data
    if data.format == "synthetic" or not data.holds("train") or data.watch is not None:
        return 0
    return source_for(data).count("train", estimate=True).rows or 0


def _rows_bound(cfg: RunConfig, features: list[str], train_rows: int) -> int:
    """The most rows a table read by ``features`` can reach: each feature adds its vocabulary
    (synthetic) or one ID per train row (``train_rows``, see ``_train_rows``; multi-hot
    features may add more)."""
    data = cfg.data
    if data.format == "synthetic":
        index = {s.name: i for i, s in enumerate(cfg.schema.sparse)}
        return sum(data.synthetic.vocab(index[f]) for f in features if index.get(f, data.synthetic.num_sparse)
                   < data.synthetic.num_sparse)
    return train_rows * len(features)
