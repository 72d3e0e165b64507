"""RunState: the run's place, and the one parser of a checkpoint's position."""

import pytest

from ember.errors import CheckpointError, ConfigError
from ember.pipeline.stream import StreamPosition
from ember.train.run_state import RunState, ShardPositions, data_position

# positions as checkpoints written before RunState existed hold them
OFFLINE = {"step": 12, "position": {"epoch": 1, "batch": 4}}
ONLINE = {"step": 5, "position": {"epoch": 0, "batch": 5, "files_done": ["a.csv"], "file": "b.csv", "file_rows": 3}}
FILES = {"step": 3, "position": {"epoch": 0, "batch": 3, "shard": "files", "world_size": 2, "rank_batches": [3, 2]}}


@pytest.mark.parametrize("manifest", [OFFLINE, ONLINE, FILES])
def test_existing_positions_parse_and_write_back_unchanged(manifest):
    state = RunState.from_dict(manifest)
    assert state.to_dict() == manifest
    assert RunState.from_dict(state.to_dict()) == state


def test_data_positions_are_typed():
    assert RunState.from_dict(OFFLINE) == RunState(12, 1, 4, None)
    assert data_position(ONLINE["position"]) == StreamPosition(("a.csv",), "b.csv", 3)
    assert data_position(FILES["position"]) == ShardPositions((3, 2))
    assert ShardPositions((3, 2)).world_size == 2


def test_next_epoch_starts_every_rank_at_its_files_start():
    state = RunState.from_dict(FILES)
    state.next_epoch()
    assert (state.epoch, state.batch, state.data) == (1, 0, ShardPositions((0, 0)))
    plain = RunState.from_dict(OFFLINE)
    plain.next_epoch()
    assert (plain.epoch, plain.batch, plain.data) == (2, 0, None)


def test_an_online_state_resumes_online_only():
    online = RunState.from_dict(ONLINE)
    assert online.resumed("ck", online=True, world_size=1, files=False) == online
    with pytest.raises(CheckpointError, match="written by a train.mode: online run.*train.init_from=ck"):
        online.resumed("ck", online=False, world_size=1, files=False)
    with pytest.raises(CheckpointError, match="holds no stream position.*train.init_from=ck"):
        RunState.from_dict(OFFLINE).resumed("ck", online=True, world_size=1, files=False)


def test_shard_positions_resume_mid_epoch_only_on_the_same_world_size():
    files = RunState.from_dict(FILES)
    assert files.rank_starts(2, True) == [3, 2]
    assert files.resumed("ck", False, 2, True).data == ShardPositions((3, 2))
    at_start = RunState(3, 1, 0, ShardPositions((3, 2)))
    assert at_start.rank_starts(3, True) == [0, 0, 0]  # an epoch's start: any world size
    assert at_start.resumed("ck", False, 3, True).data == ShardPositions((0, 0, 0))
    assert RunState.from_dict(OFFLINE).resumed("ck", False, 3, False).data is None
    with pytest.raises(ConfigError, match="run on 2 ranks; this run has 3"):
        files.rank_starts(3, True)
    with pytest.raises(ConfigError, match="resume it with data.shard: files on 2 ranks"):
        files.rank_starts(1, False)
    with pytest.raises(ConfigError, match="counts global batches"):
        RunState.from_dict(OFFLINE).rank_starts(2, True)


def test_shard_positions_keep_the_snapshot_the_epoch_pinned():
    """Iceberg under data.shard: files: the ranks share out one snapshot's files; a mid-epoch
    resume must read that snapshot, so the position keeps it (a new epoch drops it)."""
    from ember.source.iceberg import IcebergPosition

    manifest = {"step": 3, "position": {**FILES["position"], "iceberg_snapshot": 77}}
    state = RunState.from_dict(manifest)
    assert state.data == ShardPositions((3, 2), IcebergPosition(77)) and state.pinned == IcebergPosition(77)
    assert state.to_dict() == manifest
    assert state.resumed("ck", False, 2, True).pinned == IcebergPosition(77)
    state.next_epoch()
    assert state.data == ShardPositions((0, 0)) and state.pinned is None
