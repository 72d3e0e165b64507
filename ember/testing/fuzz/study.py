"""The seeded study (many cases, each classified) and its reliability table."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Callable

from ember.testing.fuzz.case import Case, OUTCOMES, Outcome
from ember.testing.fuzz.cases import cases
from ember.testing.fuzz.judge import run_case


def study(seed: int, count: int, workdir: Path, kinds: list[str] | None = None,
          on_outcome: Callable[[Case, Outcome], None] | None = None) -> list[Outcome]:
    """Run ``count`` cases in ``workdir``; ``on_outcome`` sees each as it is classified."""
    out = []
    for case in cases(seed, count, kinds):
        o = run_case(case, workdir / "case")
        out.append(o)
        if on_outcome is not None:
            on_outcome(case, o)
    shutil.rmtree(workdir / "case", ignore_errors=True)
    return out


def table(outcomes: list[Outcome]) -> tuple[str, dict[str, int]]:
    """The reliability table (markdown, one row per kind family and a total) and its totals."""
    fam: dict[str, Counter] = {}
    for o in outcomes:
        fam.setdefault(o.kind, Counter())[o.outcome] += 1
    cols = ["inputs", *OUTCOMES]
    lines = ["| input kind | " + " | ".join(c.replace("_", " ") for c in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    total: Counter = Counter()
    for kind in sorted(fam):
        c = fam[kind]
        n = sum(c.values())
        total.update(c)
        lines.append(f"| {kind} | {n} | " + " | ".join(str(c.get(k, 0)) for k in OUTCOMES) + " |")
    n = sum(total.values())
    lines.append(f"| **total** | **{n}** | " + " | ".join(f"**{total.get(k, 0)}**" for k in OUTCOMES) + " |")
    totals = {"inputs": n, **{k: int(total.get(k, 0)) for k in OUTCOMES}}
    return "\n".join(lines), totals
