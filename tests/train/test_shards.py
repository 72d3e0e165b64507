"""``FileShards``: the bookkeeping of data.shard: files, with two ranks' agreements simulated
in one process (the elementwise max ``DistributedRun.agree`` computes)."""

from __future__ import annotations

import pytest
import torch

from ember.batch import Batch, SparseFeatures
from ember.errors import ConfigError
from ember.featurize.schema import Schema
from ember.pipeline.loader import empty_batch
from ember.train.shards import FileShards

SCHEMA = Schema.parse({"labels": ["y"], "dense": [{"name": "d"}], "sparse": [{"name": "a", "weight_column": "w"}]})


def _feed(shards: FileShards, sizes: list[int]) -> list:
    """Push a rank's batches through its ``shard`` stage; the first 8 items it yields."""
    stage = shards.stage(1)
    out = []
    for n in sizes:
        out += list(stage.fn(empty_batch(SCHEMA) if n == 0 else _rows(n)))
    it = iter(stage.finish())
    out += [next(it) for _ in range(8 - len(out))]
    return out


def _rows(n: int) -> Batch:
    return Batch(torch.zeros(n, 1), SparseFeatures(["a"], torch.arange(n), torch.ones(n, dtype=torch.int64),
                                                   torch.ones(n)), torch.zeros(n, 1))


def test_ranks_agree_on_global_rows_the_end_and_positions():
    """Rank 0 has batches of 4, 4, 4, 3 rows, rank 1 of 4, 2: each yields its batches then
    empty ones; after each step both hear the rows of two steps ahead, learn each step's
    global rows, that no rank has rows from step 4 on, and each rank's position."""
    a, b = FileShards(0, 2, empty_batch(SCHEMA), [0, 0]), FileShards(1, 2, empty_batch(SCHEMA), [0, 0])
    items_a, items_b = _feed(a, [4, 4, 4, 3]), _feed(b, [4, 2])
    assert [x.size for x in items_a] == [4, 4, 4, 3, 0, 0, 0, 0] and [x.size for x in items_b] == [4, 2, 0, 0, 0, 0, 0, 0]
    # what FileShards.start hears: the max over ranks of each rank's slots of steps 0 and 1
    first = [max(x, y) for x, y in zip(a._slots(0) + a._slots(1), b._slots(0) + b._slots(1))]
    for s in (a, b):
        s._note(0, first[:2])
        s._note(1, first[2:])
    rows = []
    for step in range(6):
        if a.end is not None and step >= a.end:
            break
        rows.append((a.global_rows(step), b.global_rows(step)))
        agreed = [max(x, y) for x, y in zip(a.ask(step), b.ask(step))]
        a.hear(step, agreed)
        b.hear(step, agreed)
    assert rows == [(8, 8), (6, 6), (4, 4), (3, 3)] and a.end == b.end == 4
    assert a.positions(1) == [1, 1] and a.positions(3) == [3, 2] and a.positions(4) == [4, 2]
    assert empty_batch(SCHEMA).sparse.weights is not None  # laid out as a weighted feature's batches


def test_ranks_that_see_other_training_files_are_a_config_error(tmp_path):
    """A node whose copy of data.train lists other files stops every rank (checked once at the
    start with one all_gather; here the other rank's answer is made up)."""
    from types import SimpleNamespace

    from ember.config import RunConfig
    from ember.train.distributed import check_same_files

    for name in ("a.csv", "b.csv"):
        (tmp_path / name).write_text("y,d\n1,2\n")
    cfg = RunConfig.model_validate({"data": {"format": "csv", "train": str(tmp_path), "shard": "files"},
                                    "schema": {"labels": ["y"], "sparse": [{"name": "d"}]}, "model": {"type": "lr"}})
    check_same_files(cfg, SimpleNamespace(all_gather=lambda digest: [digest, digest]))
    with pytest.raises(ConfigError, match=r"rank\(s\) \[1\] list other files than rank 0 \(2 here\)"):
        check_same_files(cfg, SimpleNamespace(all_gather=lambda digest: [digest, "other"]))
