"""Evaluation: score a stream of batches, report AUC and logloss per task."""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch

from ember.batch import Batch
from ember.errors import DataError
from ember.train.builder import Components
from ember.train.metrics import evaluate_predictions

__all__ = ["evaluate", "predict_batches"]


@torch.no_grad()
def predict_batches(parts: Components, batches: Iterable[Batch], max_batches: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities and labels, both [N, T], for every batch (eval mode; tables do not grow)."""
    was_training = parts.model.training
    parts.train(False)
    probs, labels = [], []
    try:
        for i, batch in enumerate(batches):
            if max_batches is not None and i >= max_batches:
                break
            batch = _to_device(parts.local_batch(batch), parts.device)  # distributed: this rank's slice
            probs.append(torch.sigmoid(parts.forward(batch)).float().cpu().numpy())
            labels.append(batch.labels.cpu().numpy())
    finally:
        parts.train(was_training)
    t = len(parts.task_names)
    p = np.concatenate(probs) if probs else np.zeros((0, t), np.float32)
    y = np.concatenate(labels) if labels else np.zeros((0, t), np.float32)
    return parts.gather_rows(p), parts.gather_rows(y)  # distributed: every rank's slices


def evaluate(parts: Components, batches: Iterable[Batch], max_batches: int | None = None) -> dict[str, float]:
    """``auc/<task>`` and ``logloss/<task>`` over the batches, plus ``rows``; when ``batches``
    skips bad rows (a loader with ``on_bad_rows: skip``), also ``skipped_rows``, so rows left
    out of the metrics are counted where the metrics are. AUC is NaN (with a warning) when a
    task's labels hold one class."""
    probs, labels = predict_batches(parts, batches, max_batches)
    report = getattr(batches, "bad_rows", None)
    if not len(probs):  # AUC and logloss of nothing would be a silent NaN
        data = getattr(batches, "data", None)
        files = data.paths("eval") if data is not None and data.format != "synthetic" else []
        where = f"data.eval ({', '.join(files[:5])})" if files else "data.eval (or the synthetic eval split)"
        skipped = f"; {report}" if report is not None and report.total else ""
        raise DataError(f"evaluation got no rows: {where} gave no batch{skipped}; give eval files with rows, check "
                        "that data.on_bad_rows: skip did not skip them all, or unset data.eval to train without "
                        "evaluation")
    out = evaluate_predictions(labels, probs, parts.task_names)
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
    return Batch(dense.to(device, non_blocking=True), batch.sparse, labels.to(device, non_blocking=True))
