"""``LATEST`` names the newest complete checkpoint; when it names none (empty, a missing or an
incomplete directory) the newest complete one is used and the warning says what LATEST held."""

from __future__ import annotations

import json
import logging

import pytest

from ember.checkpoint.load import resolve_checkpoint
from ember.errors import CheckpointError


def _checkpoints(root, steps):
    for s in steps:
        d = root / "checkpoints" / f"step-{s:08d}"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({"step": s}))
    return root / "checkpoints"


@pytest.mark.parametrize("latest, says", [("step-00000002\n", None), ("", "LATEST is empty"),
                                          ("  \n", "LATEST is empty"),
                                          ("step-00000009", "LATEST names step-00000009, which is missing or incomplete")])
def test_latest_or_the_newest_complete_checkpoint(tmp_path, caplog, latest, says):
    root = _checkpoints(tmp_path, [1, 2])
    (root / "LATEST").write_text(latest)
    with caplog.at_level(logging.WARNING, logger="ember"):
        assert resolve_checkpoint(tmp_path) == root / "step-00000002"
    if says is None:
        assert not caplog.records
    else:
        assert says in caplog.text and "using" in caplog.text


def test_an_empty_latest_and_no_checkpoint_is_named(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "LATEST").write_text("")
    with pytest.raises(CheckpointError, match="LATEST is empty, and no complete checkpoint exists"):
        resolve_checkpoint(tmp_path)
