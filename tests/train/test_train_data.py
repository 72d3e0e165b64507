"""open_train_loader: one opening for every source and shard mode, each a ``Loader``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ember.config import from_dict
from ember.errors import ConfigError
from ember.pipeline.loader import BatchList, FileLoader, Loader, make_batches
from ember.pipeline.stream import StreamLoader, StreamPosition
from ember.source.protocol import source_for
from ember.train.run_state import RunState, ShardPositions
from ember.train.train_data import check_train_data, open_train_loader, start_data

SCHEMA = {"labels": ["y"], "sparse": [{"name": "c"}]}


def _synthetic(**train):
    return from_dict({"data": {"preset": "synthetic", "synthetic": {"rows": 100, "num_sparse": 2}, "batch_size": 16},
                      "model": {"type": "lr"}, "train": {"progress": False, **train}})


def _files(tmp_path, **train):
    for name, n in (("a.csv", 20), ("b.csv", 12)):
        (tmp_path / name).write_text("y,c\n" + "".join(f"{i % 2},x{i}\n" for i in range(n)))
    return from_dict({"data": {"format": "csv", "train": str(tmp_path / "*.csv"), "batch_size": 8, "shuffle_buffer": 0},
                      "schema": SCHEMA, "model": {"type": "lr"}, "train": {"progress": False, **train}})


def _check_protocol(loader: Loader) -> None:
    for name in ("position", "num_batches", "bad_rows", "stages", "__iter__"):
        assert hasattr(loader, name), name


def test_every_source_opens_as_a_loader(tmp_path):
    cfg = _synthetic()
    epoch = open_train_loader(cfg, RunState(epoch=1, batch=2))
    assert isinstance(epoch.loader, FileLoader) and epoch.loader.position == (1, 2) and epoch.shards is None
    assert epoch.data_position(3) is None  # epoch and batch say it all
    held = list(make_batches(cfg.data, cfg.schema))
    memory = open_train_loader(cfg, RunState(batch=1), batches=held)
    assert isinstance(memory.loader, BatchList) and [b.size for b in memory] == [b.size for b in held[1:]]
    online = _files(tmp_path, mode="online")
    stream = open_train_loader(online, RunState(data=start_data(online, None)))
    assert isinstance(stream.loader, StreamLoader)
    assert [b.size for b in stream] == [8, 8, 8, 8]
    assert stream.data_position(3) == StreamPosition((str(tmp_path / "a.csv"),), str(tmp_path / "b.csv"), 4)
    assert not stream.loader.stop()
    stream.close()  # the pass is over: a watched stream stops waiting for files
    assert stream.loader.stop()
    for loader in (epoch, memory, stream, epoch.loader, memory.loader, stream.loader):
        _check_protocol(loader)




def test_file_shards_open_this_rank_s_files_and_record_every_rank_s_position(tmp_path):
    cfg = _files(tmp_path)
    cfg = from_dict({**cfg.model_dump(mode="json", by_alias=True), "data": {**cfg.data.model_dump(mode="json", by_alias=True), "shard": "files"}})
    sent: list = []  # what the ranks agreed on through rank 0 (the epoch's pin: None for files)
    dist = SimpleNamespace(rank=1, world_size=2, data_slice=(1, 2),  # a dense rank: its slice among 2
                           broadcast=lambda obj, src=0: sent.append(obj) or obj)
    assert start_data(cfg, dist) == ShardPositions((0, 0))
    opened = open_train_loader(cfg, RunState(epoch=0, batch=1, data=ShardPositions((1, 1))), dist)
    assert opened.loader.position == (0, 1) and opened.loader.part == (1, 2)  # rank 1: b.csv, from its batch 1
    assert opened.shards is not None and opened.shards.starts == [1, 1] and opened.shards.first_batch == 1
    assert [s.name for s in opened.stages()][-1] == "shard"
    assert opened.data_position(0) == ShardPositions((0, 0)) and sent == [None]


def test_the_loader_reads_through_the_source_that_pinned_its_epoch(tmp_path, monkeypatch):
    """One source per pass: the one ``pin_epoch`` asked (an Iceberg table's catalog and table
    loaded there) is the one the loader reads through, not a second made beside it."""
    import ember.train.train_data as train_data

    made = []

    def counted(data):
        made.append(source_for(data))
        return made[-1]

    monkeypatch.setattr(train_data, "source_for", counted)
    opened = open_train_loader(_files(tmp_path), RunState())
    assert len(made) == 1 and opened.loader.source is made[0]


def test_batches_in_memory_need_an_offline_run_sharded_by_rows(tmp_path):
    held = [object()]
    with pytest.raises(ConfigError, match="train.mode: online streams data.train"):
        check_train_data(_files(tmp_path, mode="online"), None, held)  # type: ignore[arg-type]
    cfg = _files(tmp_path)
    cfg = from_dict({**cfg.model_dump(mode="json", by_alias=True), "data": {**cfg.data.model_dump(mode="json", by_alias=True), "shard": "files"}})
    with pytest.raises(ConfigError, match="data.shard: files gives each rank"):
        check_train_data(cfg, SimpleNamespace(rank=0, world_size=2), held)  # type: ignore[arg-type]
    check_train_data(cfg, None, held)  # type: ignore[arg-type]  # one process: files sharding is off
