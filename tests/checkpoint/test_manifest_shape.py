"""A checkpoint's manifest.json that parses but is not a manifest (a list, no tables, no files) is a
CheckpointError naming the checkpoint (exit 2 from every command), never a raw KeyError."""

from __future__ import annotations

import json

import pytest

from ember.checkpoint.load import read_manifest
from ember.errors import CheckpointError


@pytest.mark.parametrize("manifest, says", [
    ([1, 2], "holds a JSON list, not a checkpoint's manifest"),
    ({"format_version": 1}, 'lacks its "tables" list or "files" mapping'),
    ({"format_version": 1, "tables": None, "files": {}}, 'lacks its "tables" list'),
    ({"format_version": 1, "tables": [1], "files": {}}, 'lacks its "tables" list'),
    ({"format_version": 1, "tables": [], "files": []}, '"files" mapping'),
    ({"format_version": 99, "tables": [], "files": {}}, "format version 99 is not one this ember reads"),
])
def test_a_manifest_of_the_wrong_shape_is_a_checkpoint_error(tmp_path, manifest, says):
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=f"checkpoint {tmp_path}: ") as e:
        read_manifest(tmp_path)
    assert says in str(e.value)


def test_a_manifest_that_is_not_text_is_a_checkpoint_error(tmp_path):
    (tmp_path / "manifest.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(CheckpointError, match="cannot read manifest.json"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 1, "tables": [], "files": {}}))
    assert read_manifest(tmp_path)["tables"] == []
