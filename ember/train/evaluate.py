"""Evaluation: score a stream of batches, report AUC and logloss per task, and what
``eval:`` asks for beside them (calibration, ECE, NE, GAUC, slices: ``ranking_metrics``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

import numpy as np
import torch

from ember.batch import Batch
from ember.errors import ConfigError, DataError, Diverged
from ember.pipeline.loader import FileLoader
from ember.train.builder import Components
from ember.train.config import EvalConfig
from ember.train.metrics import evaluate_predictions
from ember.train.ranking_metrics import ranking_report

__all__ = ["evaluate", "predict_batches", "predict_keyed"]


def predict_batches(parts: Components, batches: Iterable[Batch], max_batches: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities and labels, both [N, T], for every batch (eval mode; tables do not grow)."""
    probs, labels, _ = predict_keyed(parts, batches, max_batches)
    return probs, labels


@torch.no_grad()
def predict_keyed(parts: Components, batches: Iterable[Batch], max_batches: int | None = None,
                  keys: Iterable[str] = ()) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """``predict_batches``, and the key columns ``keys`` of the same rows, column -> [N] (from
    each ``Batch.keys``; under distributed eval gathered from every rank, as the rows are)."""
    keys = list(keys)
    was_training = parts.model.training
    parts.train(False)
    probs, labels = [], []
    kept: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    try:
        for i, batch in enumerate(batches):
            if max_batches is not None and i >= max_batches:
                break
            batch = parts.local_batch(batch)  # distributed: this rank's slice
            if keys:
                lacking = [k for k in keys if batch.keys is None or k not in batch.keys]
                if lacking:
                    raise ConfigError(f"eval.group_by / eval.slices name column(s) {lacking}, but the eval batches do "
                                      f"not carry them (Batch.keys holds {sorted(batch.keys or {})}): evaluate a "
                                      "Loader (make_batches), which carries them, or build the batches with keys=")
                for k in keys:
                    kept[k].append(np.asarray(batch.keys[k]))  # type: ignore[index]  # checked above
            batch = _to_device(batch, parts.device)
            probs.append(torch.sigmoid(parts.forward(batch)).float().cpu().numpy())
            labels.append(batch.labels.cpu().numpy())
    finally:
        parts.train(was_training)
    t = len(parts.task_names)
    p = np.concatenate(probs) if probs else np.zeros((0, t), np.float32)
    y = np.concatenate(labels) if labels else np.zeros((0, t), np.float32)
    # distributed: every rank's slices, keys too, so each rank's metrics are of all rows
    columns = {k: parts.gather_rows(np.concatenate(v) if v else np.zeros(0, object)) for k, v in kept.items()}
    return parts.gather_rows(p), parts.gather_rows(y), columns


def evaluate(parts: Components, batches: Iterable[Batch], max_batches: int | None = None,
             config: EvalConfig | None = None) -> dict[str, float]:
    """``auc/<task>`` and ``logloss/<task>`` over the batches, plus ``rows``; when ``batches``
    skips bad rows (a loader with ``on_bad_rows: skip``), also ``skipped_rows``, so rows left
    out of the metrics are counted where the metrics are. AUC is NaN (with a warning) when a
    task's labels hold one class.

    ``config`` (default ``parts.eval_config``, the run's ``eval:``) adds ``calibration/<task>``,
    ``ece/<task>`` and ``ne/<task>``, with ``group_by`` ``gauc/<task>`` and
    ``gauc_groups_skipped/<task>``, with ``slices`` every metric per slice value
    (``ember.train.ranking_metrics.ranking_report``); a :class:`FileLoader` is asked to carry the
    columns they name (``FileLoader.carry``), other batches must hold them in ``Batch.keys``."""
    config = config or parts.eval_config or EvalConfig()
    columns = config.key_columns
    if columns and isinstance(batches, FileLoader):
        batches.carry(columns, "eval.group_by / eval.slices")  # the message preflight's check gives too
    probs, labels, keys = predict_keyed(parts, batches, max_batches, columns)
    report = getattr(batches, "bad_rows", None)
    if not len(probs):  # AUC and logloss of nothing would be a silent NaN
        data = getattr(batches, "data", None)
        files = data.paths("eval") if data is not None and data.format != "synthetic" else []
        where = f"data.eval ({', '.join(files[:5])})" if files else "data.eval (or the synthetic eval split)"
        skipped = f"; {report}" if report is not None and report.total else ""
        raise DataError(f"evaluation got no rows: {where} gave no batch{skipped}; give eval files with rows, check "
                        "that data.on_bad_rows: skip did not skip them all, or unset data.eval to train without "
                        "evaluation")
    bad = ~np.isfinite(probs).all(axis=1)
    if bad.any():  # an AUC of NaN scores ranks them somewhere: a number that means nothing
        raise Diverged(f"eval: {int(bad.sum())} of {len(probs)} rows score NaN or infinite (the first is row "
                       f"{int(np.argmax(bad))}): the model's weights are not finite (a diverged run), or those rows' "
                       "dense values are infinite; no metric is computed over such scores")
    out = evaluate_predictions(labels, probs, parts.task_names)
    out.update(ranking_report(labels, probs, parts.task_names, keys, config.group_by, config.gauc_weight,
                              config.calibration_bins, config.slices, config.slice_top))
    out["rows"] = float(len(probs))
    if report is not None and report.skip:
        out["skipped_rows"] = float(report.total)
    return out


def _to_device(batch: Batch, device: torch.device) -> Batch:
    """Dense part and labels to the model's device; IDs stay on the host, where the tables are."""
    if device.type == "cpu":
        return batch
    # pinned host buffers make the copies asynchronous, so they overlap the embedding lookups
    dense, labels = batch.dense.pin_memory(), batch.labels.pin_memory()
    # the key columns stay with the batch, on the host; eval reads no teacher scores
    return replace(batch, dense=dense.to(device, non_blocking=True), labels=labels.to(device, non_blocking=True),
                   teacher=None)
