"""``data.format: iceberg`` on 2 ranks under ``data.shard: files``: the ranks share out the data
files of one snapshot, rank 0's (``pin_epoch``), and a mid-epoch checkpoint keeps it, so a
resume after more snapshots were committed trains what the uninterrupted run did."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.checkpoint.load import read_manifest, resolve_checkpoint
from ember.config import from_dict
from ember.testing.distributed import assert_states_close, checkpoint_state
from tests.distributed.ranks import run_ranks

pytest.importorskip("pyiceberg", reason="the Iceberg tests need pyiceberg: pip install 'ember[iceberg]'")
pytest.importorskip("sqlalchemy", reason="the Iceberg tests' SQL catalog needs sqlalchemy: pip install 'ember[iceberg]'")

from tests.train.test_iceberg_train import PARTS, Lake, _raw, rows  # noqa: E402


def _train_rank(rank: int, world: int, raw: dict) -> int:
    from ember.train.loop import train

    return train(from_dict(raw)).step


@pytest.mark.dist
@pytest.mark.slow
def test_file_shards_resume_on_the_snapshot_the_epoch_began_with(tmp_path: Path) -> None:
    lake = Lake(tmp_path / "lake")
    lake.create("db.clicks", PARTS)
    data = {**lake.data(), "shard": "files", "shuffle_buffer": 0}
    whole = run_ranks(_train_rank, 2, (_raw(tmp_path, "whole", data),), timeout=240)
    assert run_ranks(_train_rank, 2, (_raw(tmp_path, "part", data, max_steps=2),), timeout=240) == [2, 2]
    position = read_manifest(resolve_checkpoint(tmp_path / "part"))["position"]
    snapshot = lake.catalog.load_table("db.clicks").current_snapshot().snapshot_id
    assert position["shard"] == "files" and position["iceberg_snapshot"] == snapshot
    lake.append("db.clicks", rows(3, 99, 5000))  # a fourth data file: the next epoch's, not this one's
    resumed = run_ranks(_train_rank, 2, (_raw(tmp_path, "part", data, resume=str(tmp_path / "part")),), timeout=240)
    assert resumed == whole
    assert_states_close(checkpoint_state(tmp_path / "whole"), checkpoint_state(tmp_path / "part"))
