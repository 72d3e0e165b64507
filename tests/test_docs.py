"""The docs are a product, tested like one.

- every config field carries its doc, and every CLI option its help (the references are
  generated from them, so a missing one is a hole in the docs);
- the generated reference pages in docs/reference/ are what the code generates now;
- every code block in README.md and docs/ runs: python blocks are executed, yaml blocks are
  validated as (parts of) run configs, shell blocks are the README walkthrough's (run by
  tests/test_readme_walkthrough.py) or carry a ``<!-- not-run: REASON -->`` marker; ``text``
  blocks are diagrams and formulas, not code;
- ``mkdocs build --strict`` passes (skipped, saying why, where mkdocs is not installed).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from ember.cli import build_parser
from ember.config import from_dict
from ember.config_base import deep_merge
from tests.doc_blocks import REPO, Block, all_blocks, blocks
from tests.test_readme_walkthrough import walkthrough

sys.path.insert(0, str(REPO / "docs"))
import gen_reference  # noqa: E402

ALL = all_blocks()
RUNNABLE = {"python", "yaml", "sh"}


def test_every_config_field_has_a_doc():
    assert gen_reference.undocumented_fields() == []


def test_every_cli_option_has_help():
    assert gen_reference.options_without_help() == []


def test_help_is_plain_words_with_an_example():
    """No reStructuredText markup in any help; every command's help ends with an example of it."""
    parser = build_parser()
    subs = gen_reference._subparsers(parser)
    for name, text in [("ember", parser.format_help()), *((n, p.format_help()) for n, p in subs.items())]:
        assert "``" not in text and ":mod:" not in text and ":class:" not in text, name
        if name != "ember":
            assert f"Example:\n  ember {name} " in text, name


def test_generated_references_are_current():
    """The pages kept in docs/reference/ are what the code generates (spacing aside: argparse
    wraps help a little differently from one Python version to the next)."""
    for rel, make in gen_reference.REFERENCES.items():
        kept, now = ((REPO / "docs" / rel).read_text(), make())
        assert kept.split() == now.split(), f"docs/{rel} is stale: run python docs/gen_reference.py"


def test_config_reference_names_every_section():
    text = gen_reference.config_reference()
    for heading in ["## `data`", "## `data.csv`", "## `schema.sparse[]`", "## `storage`", "## `schedule`", "## `train`",
                    "## `train.early_stopping`", "## `pipeline.depth`", "## `distributed`", "## `export`", "## `eval`",
                    "## `checkpoint`"]:
        assert heading in text
    assert "| `every_s` |" in text and "| `train.eval_every` | `eval.every` |" in text and "| `schema` |" in text and "schema_" not in text


def test_every_block_is_runnable_or_says_why_not():
    for b in ALL:
        assert b.lang, f"{b}: give the block a language (python, yaml, sh, or text for a diagram)"
        if b.not_run is None:
            assert b.lang in RUNNABLE | {"text"}, f"{b}: unknown language; mark it <!-- not-run: REASON -->"
    marked = [b for b in ALL if b.not_run]
    assert len(marked) <= 12, f"keep not-run blocks few: {[str(b) for b in marked]}"


def test_shell_blocks_are_the_walkthrough():
    """Shell blocks that run are the README walkthrough's, which test_readme_walkthrough runs;
    the getting-started page shows the same blocks."""
    runs = set(walkthrough())
    for b in ALL:
        if b.lang == "sh" and b.not_run is None:
            assert b.code in runs, f"{b}: a shell block that no test runs; mark it not-run or make it the walkthrough's"
    started = [b.code for b in blocks(REPO / "docs" / "getting-started.md") if b.lang == "sh" and not b.not_run]
    assert started == walkthrough()


def _demo() -> dict:
    return yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())


@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "yaml" and not b.not_run], ids=str)
def test_yaml_block_is_a_valid_config(block: Block):
    """A full config (with data and model) validates as it is; a fragment laid over the demo config."""
    raw = yaml.safe_load(block.code)
    assert isinstance(raw, dict), f"{block}: not a YAML mapping"
    from_dict(raw if {"data", "model"} <= raw.keys() else deep_merge(_demo(), raw))


@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "python" and not b.not_run], ids=str)
def test_python_block_runs(block: Block, tmp_path, monkeypatch):
    """Each python block runs as written, in a fresh directory holding the repository's configs/."""
    if "ember.portable" in block.code and not all(importlib.util.find_spec(m) for m in ("onnx", "onnxruntime")):
        pytest.skip("onnx / onnxruntime are not installed: pip install 'ember[portable]' (make test installs them)")
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    exec(compile(block.code, str(block), "exec"), {"__name__": "__docs__"})


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
                    reason="mkdocs-material is not installed (pip install -e '.[docs]', or the dev extra)")
def test_the_site_builds_strict(tmp_path):
    """`mkdocs build --strict`: no broken link, no missing page, no docstring mkdocstrings cannot
    render; offline (no plugin fetches anything)."""
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "site" / "reference" / "config" / "index.html").exists()
