"""The fenced code blocks of README.md and docs/*.md, for the tests that run them.

A block runs in the tests unless it is ``text`` (diagrams, formulas, layouts: not code) or the
line before it says why it cannot: ``<!-- not-run: REASON -->`` (a cluster launch, the test
suite itself). Everything else (python, yaml, sh) is run by tests/test_docs.py or, for the
README's walkthrough, tests/test_readme_walkthrough.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(\S.*?)\s*-->")
_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    code: str
    not_run: str | None  # the reason, when the block is marked not-run

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line} ({self.lang or 'no language'})"


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    out = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.search(before)
        line = text.count("\n", 0, m.start()) + 1
        out.append(Block(path, line, m.group(1), m.group(2), marker.group(1) if marker else None))
    return out


def all_blocks() -> list[Block]:
    return [b for p in doc_files() for b in blocks(p)]
