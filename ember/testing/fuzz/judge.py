"""Running a data case (the preflight and the threaded loader, as ``ember train`` does) and
judging what came out against what the case planted."""

from __future__ import annotations

import shutil
import traceback
from pathlib import Path
from typing import Any

from ember.errors import EmberError
from ember.pipeline.loader import make_batches
from ember.source.config import DataConfig
from ember.testing.fuzz.case import Case, Outcome, SCHEMA
from ember.testing.fuzz.cases import FAULT_KINDS
from ember.testing.fuzz.faults import _run_fault
from ember.train.preflight import check_data


def _fingerprint(batches: Any) -> tuple:
    """Rows and order-sensitive sums of every tensor: two reads agree iff (almost surely) equal."""
    rows, lab, den, ids, lens = 0, 0.0, 0.0, 0, 0
    for k, b in enumerate(batches):
        w = float(k + 1)
        rows += b.size
        lab += w * float(b.labels.double().sum())
        den += w * float(b.dense.double().nan_to_num(123.0).sum())
        ids = (ids + int(b.sparse.values.sum()) * (k + 1)) % (1 << 61)
        lens += int(b.sparse.lengths.sum())
    return rows, round(lab, 6), round(den, 3), ids, lens


def _read(case: Case, paths: list[str]) -> tuple[tuple, int]:
    """Preflight + threaded loader over ``paths``: (fingerprint, rows counted as skipped)."""
    data = DataConfig.parse({"format": case.format, "train": paths, "batch_size": 50, "shuffle_buffer": 0,
                             "on_bad_rows": case.policy, **case.data}, where="data")
    check_data(data, SCHEMA.columns, "train")
    loader = make_batches(data, SCHEMA, "train", threaded=True)
    return _fingerprint(loader), loader.bad_rows.total


def _names_file(msg: str, paths: list[str]) -> bool:
    return any(p in msg for p in paths)


def run_case(case: Case, workdir: Path) -> Outcome:
    """Run one case in ``workdir`` (emptied first) and classify what happened."""
    if case.kind in FAULT_KINDS:
        return _run_fault(case, workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    paths = []
    for name, body in case.files:
        (workdir / name).write_bytes(body)
        paths.append(str(workdir / name))
    expected = None
    if case.original is not None:  # the undamaged file's read is the reference
        ref = workdir / "reference"
        ref.mkdir()
        (ref / case.files[0][0]).write_bytes(case.original)
        try:
            expected = _read(case, [str(ref / case.files[0][0])])
        except Exception as e:  # the generator made an unreadable original: a bug of this module
            return Outcome(case.kind, "crash", f"reference read failed: {type(e).__name__}: {e}")
    try:
        got = _read(case, paths)
    except EmberError as e:
        return _judge_error(case, str(e), paths)
    except Exception as e:
        tb = traceback.format_exception(type(e), e, e.__traceback__)[-3:]
        return Outcome(case.kind, "crash", f"{type(e).__name__}: {e} | {''.join(tb).strip()[-400:]}")
    return _judge_read(case, got, expected)


def _judge_error(case: Case, msg: str, paths: list[str]) -> Outcome:
    if not _names_file(msg, paths):
        return Outcome(case.kind, "unclear_error", f"names no file: {msg[:300]}")
    if case.must_fail:
        if case.column and f"'{case.column}'" not in msg and case.column not in msg:
            return Outcome(case.kind, "unclear_error", f"names not column {case.column}: {msg[:300]}")
        return Outcome(case.kind, "clear_error", msg[:200])
    if case.original is not None:
        return Outcome(case.kind, "clear_error", msg[:200])  # damage: naming the file is what we can ask
    if case.bad and case.policy == "error":
        if not any(f" row {r}," in msg or f" row {r} " in msg for r in case.bad_rows):
            return Outcome(case.kind, "unclear_error", f"names none of rows {case.bad_rows}: {msg[:300]}")
        return Outcome(case.kind, "clear_error", msg[:200])
    return Outcome(case.kind, "unclear_error", f"error on an input that reads ({case.policy}): {msg[:300]}")


def _judge_read(case: Case, got: tuple[tuple, int], expected: tuple[tuple, int] | None) -> Outcome:
    (rows, *_), skipped = got
    if case.must_fail:
        return Outcome(case.kind, "silent_drop" if rows < max(case.rows, 1) else "accepted_bad",
                       f"read {rows} rows, skipped {skipped}, from an input that cannot be read")
    if expected is not None:  # damaged: all rows, equal to the original's, or an error
        if rows + skipped < expected[0][0]:
            return Outcome(case.kind, "silent_drop", f"{rows} rows + {skipped} skipped of {expected[0][0]}")
        if got[0] != expected[0] or skipped:
            return Outcome(case.kind, "undetected_change" if not case.checksummed or case.format == "orc"
                           else "accepted_bad", f"read {got} vs {expected}")
        return Outcome(case.kind, "clean_read")
    want = case.rows - (case.bad if case.policy == "skip" else 0)
    if rows + skipped < case.rows or rows < want:
        return Outcome(case.kind, "silent_drop", f"{rows} rows + {skipped} skipped of {case.rows} (bad {case.bad})")
    if case.bad and case.policy == "error":
        return Outcome(case.kind, "accepted_bad", f"no error for bad rows {case.bad_rows}; read {rows}")
    if skipped != case.bad or rows != want:
        return Outcome(case.kind, "accepted_bad" if rows > want else "silent_drop",
                       f"{rows} rows, {skipped} skipped; planted {case.bad} bad of {case.rows}")
    return Outcome(case.kind, "counted_skip" if case.bad else "clean_read")
