"""`ember predict` reads compressed CSV as training does (.gz, .bz2, .zst, .lz4 by extension)
and scores it exactly as the same rows uncompressed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from ember.cli import main

SMALL = {"num_sparse": 3, "num_dense": 2, "vocab_size": 50}


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compressed")
    cfg = tmp / "run.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": {"preset": "synthetic", "synthetic": {**SMALL, "rows": 512, "eval_rows": 64}, "batch_size": 64},
        "embedding": {"dim": 4}, "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
        "train": {"out_dir": str(tmp), "run_name": "run", "progress": False, "threads": 1, "max_steps": 3}}))
    assert main(["train", "--config", str(cfg), "--export", str(tmp / "export")]) == 0
    return tmp


@pytest.mark.parametrize("ext", [".gz", ".bz2", ".zst", ".lz4"])
def test_compressed_csv_scores_as_plain_csv(export, ext):
    tmp = export
    for name in ("rows.csv", f"rows.csv{ext}"):
        if not (tmp / name).exists():
            assert main(["generate", "--rows", "40", "--split", "eval", "--out", str(tmp / name),
                         "--options", json.dumps(SMALL)]) == 0
    scores = {}
    for name in ("rows.csv", f"rows.csv{ext}"):
        out = tmp / f"p-{name}.csv"
        assert main(["predict", "--export", str(tmp / "export"), "--input", str(tmp / name), "--output", str(out),
                     "--overwrite"]) == 0
        scores[name] = np.loadtxt(out, delimiter=",", skiprows=1)
    assert scores["rows.csv"].shape == (40,)
    np.testing.assert_array_equal(scores["rows.csv"], scores[f"rows.csv{ext}"])
