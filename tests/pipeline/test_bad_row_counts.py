"""Bad rows are counted per distinct row of the data, once per run: a bad row in a 3-epoch run
is one bad row (every epoch re-reads the same rows)."""

from __future__ import annotations

from pathlib import Path

from ember.config import from_dict
from ember.train.loop import train


def test_a_bad_row_in_a_three_epoch_run_counts_once(tmp_path: Path) -> None:
    lines = ["label,I1,C1"] + [f"{i % 2},{i},c{i % 7}" for i in range(60)]
    lines[5] += ",extra"  # a field too many
    lines[9] = "1,x,c1"  # not a number
    path = tmp_path / "train.csv"
    path.write_text("\n".join(lines) + "\n")
    raw = {"data": {"format": "csv", "train": str(path), "batch_size": 16, "shuffle_buffer": 0, "on_bad_rows": "skip"},
           "schema": {"labels": ["label"], "dense": [{"name": "I1"}], "sparse": [{"name": "C1"}]},
           "embedding": {"dim": 4}, "model": {"type": "lr"},
           "train": {"out_dir": str(tmp_path), "run_name": "r", "progress": False, "threads": 1, "epochs": 3}}
    result = train(from_dict(raw))
    assert result.bad_rows == {"<row>: wrong number of fields": 1, "I1: not a number": 1}
    assert result.step == 3 * -(-58 // 16)  # every epoch trained (the 58 good rows each time)
