"""``data.shard: files``: each rank trains batches of batch_size / N rows of its own files.

Three CSV files of different lengths on 2 ranks (rank 0: files 0 and 2, rank 1: file 1, which
also holds a bad row): rank 1 runs out after 2 steps, rank 0 trains 3 more, its last partial.
The run stops at step 3 (in line), its checkpoint records each rank's position in its own
files, and a resume (pipeline threads) finishes the epoch: the end state equals one process
trained on the global batches the ranks formed (rank 0's batch s with rank 1's batch s), so
every row trained exactly once, in that order, with the loss over each step's true rows.
The ranks are spawned from this process (``tests.distributed.ranks``; the launch is not what
is tested here).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from ember.batch import Batch, SparseFeatures
from ember.batch.sparse import JaggedFeature
from ember.checkpoint.load import read_manifest, resolve_checkpoint
from ember.config import load
from ember.errors import ConfigError
from ember.featurize.schema import Schema
from ember.pipeline.loader import make_batches
from ember.source.config import DataConfig
from ember.testing.distributed import assert_states_close, checkpoint_state
from ember.train.loop import train
from tests.distributed.ranks import run_ranks, train_config

SCHEMA = {"labels": ["y"], "dense": [{"name": "d"}], "sparse": [{"name": "a"}, {"name": "b"}]}


def _csv(path: Path, rows: range, bad: bool = False) -> str:
    lines = [f"{i % 2},{i * 0.1:.1f},a{i % 11},b{i % 5}" for i in rows]
    if bad:
        lines.insert(3, "1,not-a-number,a1,b1")
    path.write_text("y,d,a,b\n" + "\n".join(lines) + "\n")
    return str(path)


def _files(root: Path) -> list[str]:
    return [_csv(root / "f0.csv", range(0, 10)), _csv(root / "f1.csv", range(100, 107), bad=True),
            _csv(root / "f2.csv", range(200, 209))]


def _config(root: Path) -> Path:
    _files(root)
    cfg = {
        "data": {"format": "csv", "train": str(root / "*.csv"), "eval": str(root / "f0.csv"), "batch_size": 8,
                 "shuffle_buffer": 0, "on_bad_rows": "skip", "shard": "files"},
        "schema": SCHEMA,
        "embedding": {"dim": 3},
        "tables": [{"name": "a", "optimizer": {"type": "adagrad", "lr": 0.1}},
                   {"name": "b", "optimizer": {"type": "sgd", "lr": 0.1}}],
        "model": {"type": "deepfm", "deep_mlp": [4]},
        "train": {"epochs": 1, "log_every": 1, "progress": False, "threads": 1, "out_dir": str(root / "runs"),
                  "precision": "fp32", "dense_optimizer": {"type": "adam", "lr": 0.01}},
        "pipeline": {"enabled": False},
    }
    path = root / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _cat(parts: list[Batch]) -> Batch:
    """The rows of ``parts`` one after another, as one batch."""
    feats = [p.sparse.to_dict() for p in parts]
    joined = {}
    for k in feats[0]:
        offsets = [feats[0][k].offsets]
        for f in feats[1:]:
            offsets.append(f[k].offsets[1:] + offsets[-1][-1])
        joined[k] = JaggedFeature(torch.cat([f[k].values for f in feats]), torch.cat(offsets), None)
    sparse = SparseFeatures.from_dict(joined)
    return Batch(torch.cat([p.dense for p in parts]), sparse, torch.cat([p.labels for p in parts]))


def test_loader_reads_its_files_in_batches_of_its_share(tmp_path):
    f0, f1, f2 = _files(tmp_path)
    schema = Schema.parse(SCHEMA)
    data = DataConfig(format="csv", train=str(tmp_path / "*.csv"), batch_size=8, shuffle_buffer=0, on_bad_rows="skip",
                      shard="files")
    mine = make_batches(data, schema, "train", part=(0, 2))
    assert [b.size for b in mine] == [4, 4, 4, 4, 3]  # files 0 and 2: 19 rows
    assert torch.equal(torch.cat([b.dense for b in make_batches(data, schema, "train", part=(0, 2))])[:, 0],
                       torch.tensor([i * 0.1 for i in [*range(10), *range(200, 209)]], dtype=torch.float32))
    other = make_batches(data, schema, "train", part=(1, 2))
    assert [b.size for b in other] == [4, 3] and other.bad_rows.total == 1  # file 1: 7 good rows, 1 bad
    with pytest.raises(ConfigError, match="4 ranks its own training files, but data.train has 3"):
        list(make_batches(data, schema, "train", part=(0, 4)))
    with pytest.raises(ValueError, match="synthetic data has none"):
        DataConfig(shard="files")


@pytest.mark.dist
@pytest.mark.slow
def test_two_ranks_train_every_row_of_their_files_once_and_resume(tmp_path):
    path = _config(tmp_path)
    runs = tmp_path / "runs"
    for args in (["train.run_name=files", "train.max_steps=3"],
                 ["train.run_name=files2", f"train.resume={runs / 'files'}", "pipeline.enabled=true"]):
        run_ranks(train_config, 2, (path, args), timeout=240)
    # the stop at step 3: rank 0 trained 3 of its batches, rank 1 both of its own (then empty batches)
    position = read_manifest(resolve_checkpoint(runs / "files"))["position"]
    assert position == {"epoch": 0, "batch": 3, "shard": "files", "world_size": 2, "rank_batches": [3, 2]}
    summary = json.loads((runs / "files2" / "summary.json").read_text())
    assert summary["step"] == 5 and summary["bad_rows"] == {"d: not a number": 1}
    trained = [r for r in map(json.loads, (runs / "files2" / "metrics.jsonl").read_text().splitlines())
               if r["kind"] == "train"]
    assert [r["step"] for r in trained] == [4, 5]

    # one process on the ranks' global batches: rank 0's batch s and rank 1's batch s together
    cfg = load(path, ["train.run_name=one", "data.shard=rows"])
    schema = cfg.schema
    files = sorted(tmp_path.glob("f*.csv"))
    rank0 = list(make_batches(cfg.data.model_copy(update={"train": [str(files[0]), str(files[2])], "batch_size": 4}), schema))
    rank1 = list(make_batches(cfg.data.model_copy(update={"train": [str(files[1])], "batch_size": 4}), schema))
    steps = [_cat([rank0[s]] + rank1[s:s + 1]) for s in range(len(rank0))]
    assert [b.size for b in steps] == [8, 7, 4, 4, 3]  # 26 good rows
    one = train(cfg, batches=steps)
    assert one.step == 5
    mine, ref = checkpoint_state(runs / "files2"), checkpoint_state(runs / "one")
    assert mine["position"] == {"epoch": 1, "batch": 0, "shard": "files", "world_size": 2, "rank_batches": [0, 0]}
    assert_states_close({**ref, "position": None}, {**mine, "position": None})
    ref_losses = {r["step"]: r["loss"] for r in one.history if r["kind"] == "train"}
    assert [r["loss"] for r in trained] == pytest.approx([ref_losses[4], ref_losses[5]], abs=1e-6)

    # the mid-epoch position is in each rank's own files: another world size (here 1) refuses it
    with pytest.raises(ConfigError, match="written mid-epoch by a data.shard: files run on 2 ranks"):
        train(load(path, ["train.run_name=again", f"train.resume={runs / 'files'}"]))
