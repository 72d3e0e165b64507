"""The metrics a run ends with (its return value, summary.json, the console) are those of its
final state, the checkpoint summary.json names, whatever ``eval.every`` was."""

from __future__ import annotations

import json

from ember.config import from_dict
from ember.train.loop import train


def test_the_final_state_is_evaluated_when_the_last_periodic_eval_came_before_the_last_step(tmp_path):
    raw = {"data": {"preset": "synthetic", "batch_size": 256,
                    "synthetic": {"rows": 2048, "eval_rows": 512, "vocab_size": 500, "num_sparse": 3}},
           "embedding": {"dim": 4}, "model": {"type": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8]},
           "eval": {"every": 3},  # evals at steps 3 and 6; the run ends at step 8
           "train": {"out_dir": str(tmp_path), "run_name": "r", "progress": False, "threads": 1, "log_every": 100}}
    result = train(from_dict(raw))
    assert result.step == 8
    records = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("kind") == "eval"]
    assert [r["step"] for r in evals] == [3, 6, 8]
    assert result.metrics["auc/label"] == evals[-1]["auc/label"] != evals[-2]["auc/label"]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["step"] == 8 and summary["checkpoint"].endswith("step-00000008")
    assert summary["auc/label"] == evals[-1]["auc/label"]
