"""Reliability study: bad inputs and faults by the hundred, each classified (ember.testing.fuzz).

Inputs: CSV/TSV with wrong field counts, bad numbers, bad labels (NaN, inf, outside [0, 1]),
bytes that are not UTF-8, quotes that do not close on their line, blank lines, 1-3 MiB lines,
empty / header-only / blank files, missing columns, truncated gzip; Parquet and ORC files with
flipped bytes, truncations, garbage spans, noise, wrong column types (a list where a label is
expected, structs, maps), bad labels and numbers, missing columns, no rows; and faults while a
checkpoint is written (ENOSPC at every write / fsync / rename, SIGKILL at each of them).

The cases run in a worker process that streams one JSON line per outcome; a worker that dies
(a segfault or abort in native code) is a crash of the case it was running, and a new worker
goes on with the next case. Prints the table per input kind, then, on its last line, one JSON
object: inputs, clear_errors, counted_skips, silent_drops, crashes, data_lost (and the rest).

Then the surfaces that are not data files (ember.testing.surfaces, ``--surfaces N`` cases of
each, 0 to leave them out): config files and overrides generated from the config schema, command
lines, output paths, and the scoring API on 127.0.0.1; their counts join the JSON line as
surface_cases, surface_tracebacks, surface_other_exits, surface_lost_files, surface_5xx, surface_hangs.

Usage: PYTHONPATH=. python bench/fuzz_reliability.py [--seed 0] [--count 1000] [--surfaces 300]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(seed: int, count: int, start: int, workdir: str) -> None:
    """Run cases ``start..count-1`` of ``(seed, count)``; one JSON line per case on stdout."""
    from ember.testing import fuzz

    for i, case in enumerate(fuzz.cases(seed, count)):
        if i < start:
            continue
        print(json.dumps({"i": i, "kind": case.kind, "start": True}), flush=True)
        o = fuzz.run_case(case, Path(workdir) / "case")
        print(json.dumps({"i": i, "kind": o.kind, "outcome": o.outcome, "detail": o.detail[:400],
                          "format": case.format, "checksummed": case.checksummed}), flush=True)


def run(seed: int, count: int) -> list[dict]:
    """Every case's outcome, restarting the worker after a case that killed it."""
    results: list[dict] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="ember-fuzz-") as tmp:
        start = 0
        while start < count:
            proc = subprocess.Popen([sys.executable, __file__, "--worker", str(start), "--seed", str(seed),
                                     "--count", str(count), "--workdir", tmp],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
            running = None
            assert proc.stdout is not None
            for line in proc.stdout:
                rec = json.loads(line)
                if rec.get("start"):
                    running = rec
                    continue
                results.append(rec)
                running = None
                start = rec["i"] + 1
                if len(results) % 100 == 0:
                    print(f"  {len(results)}/{count} cases", file=sys.stderr, flush=True)
            err = proc.stderr.read() if proc.stderr else ""
            code = proc.wait()
            if running is not None:  # the worker died inside this case
                results.append({"i": running["i"], "kind": running["kind"], "outcome": "crash",
                                "detail": f"worker exit {code}: {err[-300:]}"})
                start = running["i"] + 1
            elif code != 0:
                raise RuntimeError(f"fuzz worker failed outside a case (exit {code}): {err[-2000:]}")
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count", type=int, default=1000, help="inputs to try (about 0.15 s each on 2 cores)")
    p.add_argument("--surfaces", type=int, default=300, help="cases of each non-data surface (0: none)")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker is not None:
        worker(args.seed, args.count, args.worker, args.workdir)
        return

    from ember.testing import fuzz

    t0 = time.perf_counter()
    results = run(args.seed, args.count)
    outcomes = [fuzz.Outcome(r["kind"], r["outcome"], r.get("detail", "")) for r in results]
    text, totals = fuzz.table(outcomes)
    print(f"reliability study: seed {args.seed}, {args.count} inputs, {time.perf_counter() - t0:.0f} s\n")
    print(text)
    wrong = [r for r in results if r["outcome"] not in fuzz.RIGHT]
    if wrong:
        print("\nnot right:")
        for r in wrong:
            print(f"  {r['kind']} case {r['i']}: {r['outcome']}: {r.get('detail', '')[:300]}")
    # values changed by damage in files without checksums (ORC; Parquet written without them)
    unguarded = sum(1 for r in results if r["outcome"] == "undetected_change"
                    and (r.get("format") == "orc" or not r.get("checksummed", True)))
    surfaces = _surfaces(args.seed, args.surfaces) if args.surfaces else {}
    from benchkit import json_line  # the machine (CPU model, bf16) in the final line
    print(json_line({
        **surfaces,
        "seed": args.seed, "inputs": totals["inputs"], "clear_errors": totals["clear_error"],
        "counted_skips": totals["counted_skip"], "clean_reads": totals["clean_read"],
        "recovered": totals["recovered"], "silent_drops": totals["silent_drop"], "crashes": totals["crash"],
        "data_lost": totals["data_lost"], "unclear_errors": totals["unclear_error"],
        "accepted_bad": totals["accepted_bad"], "undetected_changes": totals["undetected_change"],
        "undetected_changes_without_checksums": unguarded,
    }))


def _surfaces(seed: int, count: int) -> dict[str, int]:
    """Run the surface study; print its table and defects; the counts for the JSON line."""
    from ember.testing.surfaces import study

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ember-surfaces-") as tmp:
        result = study(count, Path(tmp), seed)
    print(f"\nsurfaces: {count} cases each, {time.perf_counter() - t0:.0f} s")
    for surface, kinds in result["tally"].items():
        print(f"  {surface:14s} " + "  ".join(f"{k}: {v}" for k, v in sorted(kinds.items())))
    for surface, examples in result["examples"].items():
        for e in examples:
            print(f"  defect in {surface}: {e[:400]}")
    allk: dict[str, int] = {}
    for kinds in result["tally"].values():
        for k, v in kinds.items():
            allk[k] = allk.get(k, 0) + v
    return {"surface_cases": sum(allk.values()), "surface_tracebacks": allk.get("traceback", 0),
            "surface_other_exits": allk.get("other", 0), "surface_lost_files": allk.get("lost", 0),
            "surface_5xx": allk.get("5xx", 0), "surface_hangs": allk.get("hang", 0)}


if __name__ == "__main__":
    main()
