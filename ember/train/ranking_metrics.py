"""What a ranking team reads beside AUC and logloss: GAUC, calibration, ECE, NE, per slice.

Every metric here is a pure function of labels, probabilities and (for GAUC and slices) the
raw key columns of the eval rows (``Batch.keys``); :func:`ranking_report` puts them together
under the keys ``evaluate`` returns. A metric that is undefined for a set of rows (one class
only, no positive) is NaN in the returned dict (``null`` in JSON files, see
``metrics.json_safe``), and a warning line says which and why, never a crash.

Definitions and references:

- GAUC (group AUC; Zhou et al., "Deep Interest Network for Click-Through Rate Prediction",
  KDD 2018, eq. 9; He & McAuley's per-user AUC): the AUC of each group's rows (e.g. each
  user's), averaged weighted by the group's rows (``eval.gauc_weight: rows``) or by its
  positives (``clicks``, as DIN weighs by impressions or clicks). A group whose labels hold one
  class has no AUC: it is skipped and counted (``gauc_groups_skipped/<task>``).
- calibration: sum of predictions / sum of labels (the mean prediction over the observed rate;
  1.0 is calibrated on average; He et al., "Practical Lessons from Predicting Clicks on Ads at
  Facebook", ADKDD 2014, section 3).
- ECE (expected calibration error; Naeini et al., AAAI 2015; Guo et al., ICML 2017): rows sorted
  by prediction, cut into ``bins`` equal-mass bins (``numpy.array_split`` sizes: the first
  ``N % bins`` bins hold one row more); ECE = sum over bins of (rows_b / N) * |mean p_b - mean y_b|.
- NE (normalized entropy; He et al. 2014, section 2.2): logloss divided by the entropy of the
  eval set's base rate r = mean(y), ``-(r log r + (1 - r) log(1 - r))``; below 1 the model beats
  predicting the base rate for every row.
"""

from __future__ import annotations

import logging
import math
from typing import Literal, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ember.train.metrics import auc, logloss
from ember import once

__all__ = ["group_auc", "calibration", "expected_calibration_error", "normalized_entropy", "task_metrics",
           "ranking_report", "top_values", "headline"]

log = logging.getLogger("ember")
NAN = float("nan")


def _positive(labels: np.ndarray) -> np.ndarray:
    return np.asarray(labels, dtype=np.float64).ravel() > 0.5


def group_auc(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray,
              weight: Literal["rows", "clicks"] = "rows") -> tuple[float, int]:
    """(GAUC, groups skipped): the AUC of each group's rows (ties by average rank, as
    :func:`~ember.train.metrics.auc`), averaged weighted by the group's rows or positives;
    groups with one class are skipped and counted. NaN when no group has both classes.

    ``groups``: [N] group codes (any values that compare, e.g. :func:`_codes`' output).

    Example:
        >>> y = np.array([1, 0, 1, 0, 0, 0])
        >>> p = np.array([.9, .1, .2, .8, .5, .7])
        >>> group_auc(y, p, np.array([0, 0, 1, 1, 2, 2]))  # AUC 1 and 0; group 2 is one class
        (0.5, 1)
    """
    pos = _positive(labels)
    s = np.asarray(scores, dtype=np.float64).ravel()
    g = np.asarray(groups).ravel()
    if not g.size:
        return NAN, 0
    _, g = np.unique(g, return_inverse=True)
    g = g.ravel()
    n_groups = int(g.max()) + 1
    order = np.lexsort((s, g))  # by group, then score
    gs, ss, ys = g[order], s[order], pos[order]
    n = gs.size
    group_start = np.r_[True, gs[1:] != gs[:-1]]
    run_start = group_start | np.r_[True, ss[1:] != ss[:-1]]  # a run: equal scores within a group
    first = np.flatnonzero(run_start)
    ends = np.r_[first[1:], n]
    group_first = np.flatnonzero(group_start)  # indexed by group code (every code occurs)
    # 1-based rank within the group, averaged over each run of ties
    avg_rank = first - group_first[gs[first]] + (ends - first + 1) / 2.0
    ranks = np.repeat(avg_rank, ends - first)
    rank_sum = np.bincount(gs, weights=ranks * ys, minlength=n_groups)
    n_pos = np.bincount(gs, weights=ys.astype(np.float64), minlength=n_groups)
    n_all = np.bincount(gs, minlength=n_groups).astype(np.float64)
    n_neg = n_all - n_pos
    ok = (n_pos > 0) & (n_neg > 0)
    skipped = int((~ok).sum())
    if not ok.any():
        return NAN, skipped
    aucs = (rank_sum[ok] - n_pos[ok] * (n_pos[ok] + 1) / 2.0) / (n_pos[ok] * n_neg[ok])
    w = n_all[ok] if weight == "rows" else n_pos[ok]
    return float((aucs * w).sum() / w.sum()), skipped


def calibration(labels: np.ndarray, probs: np.ndarray) -> float:
    """Sum of predictions over sum of labels (mean prediction / observed rate); NaN without a positive.

    Example:
        >>> calibration(np.array([1, 0, 0, 0]), np.array([.5, .5, .5, .5]))  # predicts 2 clicks, 1 seen
        2.0
    """
    y = np.asarray(labels, dtype=np.float64).ravel()
    total = float(y.sum())
    return float(np.asarray(probs, dtype=np.float64).sum() / total) if total > 0 else NAN


def expected_calibration_error(labels: np.ndarray, probs: np.ndarray, bins: int = 10) -> float:
    """ECE over ``bins`` equal-mass bins of the rows sorted by prediction (see the module doc);
    NaN for no rows.

    Example:
        >>> round(expected_calibration_error(np.array([0, 1, 0, 1]), np.array([.1, .2, .7, .8]), bins=2), 6)  # bins: |.15 - .5|, |.75 - .5|
        0.3
    """
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.asarray(probs, dtype=np.float64).ravel()
    if not y.size:
        return NAN
    order = np.argsort(p, kind="mergesort")
    total = 0.0
    for idx in np.array_split(order, bins):
        if idx.size:
            total += idx.size * abs(float(p[idx].mean()) - float(y[idx].mean()))
    return total / y.size


def normalized_entropy(labels: np.ndarray, probs: np.ndarray) -> float:
    """Logloss over the entropy of the base rate mean(labels); NaN when the labels hold one
    class (the base rate's entropy is 0).

    Example:
        >>> round(normalized_entropy(np.array([1, 0]), np.array([0.5, 0.5])), 6)  # the base rate itself: 1
        1.0
    """
    y = np.asarray(labels, dtype=np.float64).ravel()
    if not y.size:
        return NAN
    r = float(y.mean())
    if r <= 0.0 or r >= 1.0:
        return NAN
    return logloss(y, probs) / -(r * math.log(r) + (1 - r) * math.log(1 - r))


def task_metrics(labels: np.ndarray, probs: np.ndarray, bins: int, groups: np.ndarray | None = None,
                 weight: Literal["rows", "clicks"] = "rows") -> dict[str, float]:
    """One task's metrics over one set of rows: ``auc``, ``logloss``, ``calibration``, ``ece``,
    ``ne``, and with ``groups`` ``gauc`` and ``gauc_groups_skipped`` (labels, probs: [N])."""
    out = {"auc": auc(labels, probs), "logloss": logloss(labels, probs) if len(labels) else NAN,
           "calibration": calibration(labels, probs), "ece": expected_calibration_error(labels, probs, bins),
           "ne": normalized_entropy(labels, probs)}
    if groups is not None:
        out["gauc"], skipped = group_auc(labels, probs, groups, weight)
        out["gauc_groups_skipped"] = float(skipped)
    return out


def _codes(values: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Integer codes [N] and the name of each code, for a key column's values (None / NaN:
    ``null``); names as the values print (``US``, ``3``)."""
    arr = pa.array(np.asarray(values), from_pandas=True) if np.asarray(values).dtype != object \
        else pa.array(list(values), from_pandas=True)
    enc = pc.dictionary_encode(arr, null_encoding="encode")
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    names = ["null" if v is None else str(v) for v in enc.dictionary.to_pylist()]
    return codes, names


def top_values(values: np.ndarray, top: int) -> list[tuple[str, np.ndarray]]:
    """``(value, row mask)`` of the ``top`` most frequent values of a slice column (ties by
    name), then ``("other", mask)`` for every other value's rows, if any. A name printed twice
    (the value ``"other"`` beside the rest, ``"null"`` beside a missing value) gets ``#2``.

    Example:
        >>> [(v, m.tolist()) for v, m in top_values(np.array(["US", "DE", "US", "FR"]), 1)]
        [('US', [True, False, True, False]), ('other', [False, True, False, True])]
    """
    codes, names = _codes(values)
    counts = np.bincount(codes, minlength=len(names))
    ranked = sorted(range(len(names)), key=lambda c: (-counts[c], names[c]))
    out = [(names[c], codes == c) for c in ranked[:top]]
    if len(ranked) > top:
        out.append(("other", np.isin(codes, ranked[top:])))
    seen: dict[str, int] = {}
    for i, (name, mask) in enumerate(out):  # a value printed like another ("other", "null", 1 and "1"): numbered
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            out[i] = (f"{name}#{seen[name]}", mask)
    return out


def ranking_report(labels: np.ndarray, probs: np.ndarray, tasks: Sequence[str], keys: Mapping[str, np.ndarray],
                   group_by: str | None = None, weight: Literal["rows", "clicks"] = "rows", bins: int = 10,
                   slices: Sequence[str] = (), slice_top: int = 10) -> dict[str, float]:
    """Per task ``calibration/<task>``, ``ece/<task>``, ``ne/<task>`` (and with ``group_by``
    ``gauc/<task>``, ``gauc_groups_skipped/<task>``); per value of each slice column (top
    ``slice_top`` by rows, the rest as ``other``) every metric, ``auc/<task>/<col>=<value>``
    and so on, plus ``rows/<col>=<value>``. ``labels``, ``probs``: [N, T]; ``keys``: column ->
    [N] values, holding ``group_by`` and ``slices``. Undefined metrics are NaN, warned about."""
    groups = _codes(keys[group_by])[0] if group_by is not None else None
    out: dict[str, float] = {}
    undefined: list[str] = []
    sets: list[tuple[str, np.ndarray | None]] = [("", None)]
    for col in slices:
        sets += [(f"/{col}={value}", mask) for value, mask in top_values(keys[col], slice_top)]
    for suffix, mask in sets:
        if mask is not None:
            out[f"rows{suffix}"] = float(mask.sum())
        for t, task in enumerate(tasks):
            y, p = labels[:, t], probs[:, t]
            g = groups
            if mask is not None:
                y, p, g = y[mask], p[mask], (None if g is None else g[mask])
            m = task_metrics(y, p, bins, g, weight)
            if mask is None:  # auc and logloss of all rows are evaluate_predictions' (and its one-class warning)
                del m["auc"], m["logloss"]
            for name, value in m.items():
                key = f"{name}/{task}{suffix}"
                out[key] = value
                if math.isnan(value):
                    undefined.append(key)
    if undefined:
        _warn_undefined(undefined)
    return out


def headline(metrics: Mapping[str, float]) -> str:
    """The eval metrics one progress line shows: every task's (``auc/<task>=0.7312``), not the
    per-slice ones (``metrics.jsonl`` and ``summary.json`` hold those), counts whole.

    Example:
        >>> headline({"auc/y": 0.73123, "gauc_groups_skipped/y": 4.0, "auc/y/country=US": 0.7, "rows": 9.0})
        'auc/y=0.7312 gauc_groups_skipped/y=4'
    """
    shown = []
    for k, v in metrics.items():
        if k.count("/") != 1 or k.startswith("rows/"):
            continue
        shown.append(f"{k}={v:.0f}" if k.startswith("gauc_groups_skipped/") else f"{k}={v:.4f}")
    return " ".join(shown)


_WHY = {"auc": "labels of one class", "gauc": "no group with both classes", "calibration": "no positive label",
        "ne": "labels of one class (the base rate's entropy is 0)", "ece": "no rows", "logloss": "no rows"}


def _warn_undefined(keys: list[str]) -> None:
    """One warning line for the metrics that are undefined (recorded as NaN / null), each key
    warned about once per process (an eval every N steps repeats the same)."""
    new = [k for k in keys if once.first("ranking_metrics.undefined", k)]
    if not new:
        return
    shown = ", ".join(f"{k} ({_WHY.get(k.split('/', 1)[0], 'undefined')})" for k in new[:8])
    more = f" and {len(new) - 8} more" if len(new) > 8 else ""
    log.warning("eval: %d metric(s) undefined, recorded as NaN / null: %s%s; they need rows of both classes "
                "(GAUC: groups with both)", len(new), shown, more)
