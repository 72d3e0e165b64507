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


def _cfg_files(train: str):
    from ember.config import RunConfig

    return RunConfig.model_validate({"data": {"format": "csv", "train": train, "shard": "files"},
                                     "schema": {"labels": ["y"], "sparse": [{"name": "d"}]}, "model": {"type": "lr"}})


def _check_on_two_ranks(cfg, node0, node1, monkeypatch):
    """``check_same_files`` as rank 0 in ``node0`` (a working directory: a node's copy of the
    data), with the other rank's part of each all_gather being what it sent in ``node1`` (run
    first, told that rank 0's hash differs, so it sends its files too)."""
    from types import SimpleNamespace

    from ember.train.distributed import check_same_files

    sent: list = []
    monkeypatch.chdir(node1)
    with pytest.raises(ConfigError):
        check_same_files(cfg, SimpleNamespace(all_gather=lambda obj: sent.append(obj) or [
            ("another hash", None) if isinstance(obj, tuple) else [], obj]))
    monkeypatch.chdir(node0)
    heard = iter(sent)
    check_same_files(cfg, SimpleNamespace(all_gather=lambda obj: [obj, next(heard)]))


def test_ranks_that_see_other_training_files_are_a_config_error(tmp_path, monkeypatch):
    """A node whose copy of data.train lists other files, or a file of another size, stops
    every rank, naming the file (checked once at the start; here rank 1's answers are what
    the check sends from its own directory)."""
    nodes = [tmp_path / "n0", tmp_path / "n1"]
    for node in nodes:
        (node / "data").mkdir(parents=True)
        for name in ("a.csv", "b.csv"):
            (node / "data" / name).write_text("y,d\n1,2\n")
    cfg = _cfg_files("data")
    _check_on_two_ranks(cfg, *nodes, monkeypatch)  # identical copies
    (nodes[1] / "data" / "b.csv").write_text("y,d\n1,2\n0,3\n")  # an out-of-date copy: same name, other size
    with pytest.raises(ConfigError, match=r"the ranks see different data.train files: 'data/b.csv' has 12 bytes on "
                                          r"rank 1 and 8 on rank 0; every rank must see the same files"):
        _check_on_two_ranks(cfg, *nodes, monkeypatch)
    (nodes[1] / "data" / "b.csv").write_text("y,d\n1,3\n")  # the same size, other rows
    with pytest.raises(ConfigError, match=r"'data/b.csv' has other contents on rank 1 than on rank 0 \(the same size"):
        _check_on_two_ranks(cfg, *nodes, monkeypatch)
    (nodes[1] / "data" / "b.csv").write_text("y,d\n1,2\n")
    (nodes[1] / "data" / "c.csv").write_text("y,d\n1,2\n")
    with pytest.raises(ConfigError, match=r"rank 1 lists 'data/c.csv', which rank 0 does not"):
        _check_on_two_ranks(cfg, *nodes, monkeypatch)


def test_a_rank_that_cannot_list_the_training_files_stops_every_rank_naming_it(tmp_path, monkeypatch):
    """A path missing on one node: that rank's error reaches the comparison in place of its
    files, so rank 0 names it too (not a collective failing on a rank that had left)."""
    nodes = [tmp_path / "n0", tmp_path / "n1"]
    for node in nodes:
        node.mkdir()
    (nodes[0] / "t.csv").write_text("y,d\n1,2\n")
    with pytest.raises(ConfigError, match=r"not every rank can list data.train: rank 1: data path 't.csv' matches "
                                          r"no csv file.*; every rank must see the same files at the same paths"):
        _check_on_two_ranks(_cfg_files("t.csv"), *nodes, monkeypatch)
