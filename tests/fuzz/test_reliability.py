"""The seeded reliability study (``ember.testing.fuzz``; ``bench/fuzz_reliability.py`` runs it
at length and writes the table): bad CSV/TSV, Parquet and ORC inputs, damaged files, and faults
while a checkpoint is written. Every outcome must be right: a clear error naming the file (and
the bad row), a skip whose count equals the bad rows planted, a full read, or a recovered
checkpoint; never a silent drop, a crash or lost data.

By default every kind runs once (about 35 inputs); the slow test draws 200 more (times
``EMBER_FUZZ_SCALE``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ember.testing import fuzz
from tests.fuzz.conftest import fuzz_scale


def _problems(outcomes: list[tuple[fuzz.Case, fuzz.Outcome]]) -> list[str]:
    """Every outcome that is not right. Values changed by damage pass only where the file has no
    checksum to catch them (ORC; Parquet written without page checksums): nothing can tell."""
    bad = []
    for case, o in outcomes:
        if o.outcome in fuzz.RIGHT:
            continue
        if o.outcome == "undetected_change" and (case.format == "orc" or not case.checksummed):
            continue
        bad.append(f"{case.kind} seed={case.seed}: {o.outcome}: {o.detail[:300]}")
    return bad


def _run(cases: list[fuzz.Case], workdir: Path) -> list[tuple[fuzz.Case, fuzz.Outcome]]:
    return [(c, fuzz.run_case(c, workdir / "case")) for c in cases]


def test_every_kind_of_bad_input_and_fault_ends_right(tmp_path):
    cases = []
    for i, kind in enumerate(fuzz.KINDS):
        case = fuzz.make_case(kind, np.random.default_rng([12, i]))
        case.seed = (12, i)
        cases.append(case)
    outcomes = _run(cases, tmp_path)
    assert _problems(outcomes) == []
    seen = {o.outcome for _, o in outcomes}
    assert {"clear_error", "counted_skip", "clean_read", "recovered"} <= seen  # every right outcome occurs


@pytest.mark.slow
def test_reliability_study_many_inputs(tmp_path):
    outcomes = []
    fuzz.study(7, 200 * fuzz_scale(), tmp_path, on_outcome=lambda c, o: outcomes.append((c, o)))
    assert _problems(outcomes) == []


# ---- the judge itself: a harness that cannot see a defect proves nothing --------------------------


def _csv_case(tmp_path: Path, policy: str) -> fuzz.Case:
    rng = np.random.default_rng([3, 1])
    while True:
        case = fuzz.make_case("csv.wrong_fields", rng)
        if case.original is None:  # not the gzip variant: rows known
            case.policy = policy
            return case


def test_the_judge_sees_a_silent_drop_and_a_miscount(tmp_path):
    case = _csv_case(tmp_path, "skip")
    assert fuzz.run_case(case, tmp_path / "c").outcome == "counted_skip"
    case.rows += 1  # one row more than comes out: as if the reader lost it without a count
    assert fuzz.run_case(case, tmp_path / "c").outcome == "silent_drop"
    case.rows -= 1
    case.bad -= 1  # a count above the rows planted bad
    assert fuzz.run_case(case, tmp_path / "c").outcome != "counted_skip"


def test_the_judge_wants_the_file_and_the_row_named(tmp_path):
    case = _csv_case(tmp_path, "error")
    assert fuzz.run_case(case, tmp_path / "c").outcome == "clear_error"
    case.bad_rows = [r + 100_000 for r in case.bad_rows]  # the error names a row that is not bad
    assert fuzz.run_case(case, tmp_path / "c").outcome == "unclear_error"
    assert fuzz._judge_error(case, "something failed", ["/elsewhere/x.csv"]).outcome == "unclear_error"


def test_the_judge_sees_lost_checkpoints(tmp_path, monkeypatch):
    import ember.checkpoint.load as load

    case = fuzz.make_case("checkpoint.enospc", np.random.default_rng(5))
    assert fuzz.run_case(case, tmp_path / "c").outcome == "clear_error"

    def broken(path):
        raise load.CheckpointError("no checkpoint")

    monkeypatch.setattr(load, "resolve_checkpoint", broken)
    assert fuzz.run_case(case, tmp_path / "c").outcome == "data_lost"


def test_the_table_counts_every_outcome():
    outs = [fuzz.Outcome("a", "clear_error"), fuzz.Outcome("a", "crash"), fuzz.Outcome("b", "counted_skip")]
    text, totals = fuzz.table(outs)
    assert totals["inputs"] == 3 and totals["crash"] == 1 and totals["clear_error"] == 1
    assert "| a | 2 | 1 |" in text and "| **total** | **3** |" in text
