"""MkDocs hook: the configuration and CLI references are regenerated from the code at every
build (``docs/gen_reference.py``), before the pages are read: the site cannot drift from the
schema or the parser. The generated pages are kept in the repository too, so links to them work
without building; ``tests/test_docs.py`` fails when they are out of date."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_reference  # noqa: E402


def on_pre_build(config: Any) -> None:
    gen_reference.write_references()
