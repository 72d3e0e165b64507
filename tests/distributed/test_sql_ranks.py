"""``data.format: sql`` on 2 ranks under ``data.shard: rows``: every rank runs the query and
trains its slice of each global batch; stopped mid-epoch and resumed by key, the 2-rank run
ends where one process trained on the same query does (within float tolerance: the ranks sum
in another order), with the same position (the last key trained)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.checkpoint.load import read_manifest, resolve_checkpoint
from ember.config import from_dict
from ember.testing.distributed import assert_states_close, checkpoint_state
from ember.train.loop import train
from tests.distributed.ranks import run_ranks
from ember.testing.clicks import clicks_run
from tests.train.test_sql_train import ROWS, Sqlite, _sql, rows

pytest.importorskip("adbc_driver_sqlite", reason="needs adbc-driver-sqlite: pip install 'ember[sql]'")


def _raw(tmp_path: Path, name: str, data: dict, **train_kw: object) -> dict:
    """The SQL tests' run, in fp32: ranks and one process agree to fp32's tolerance (under bf16
    each rank rounds its own partial gradient sums)."""
    return clicks_run(tmp_path, name, data, precision="fp32", **train_kw)


def _train_rank(rank: int, world: int, raw: dict) -> int:
    return train(from_dict(raw)).step


def _train_rank_in(rank: int, world: int, folders: list[str], raw: dict) -> int:
    import os

    os.chdir(folders[rank])  # data.sql.uri is relative: each rank opens the database in its own folder
    return train(from_dict(raw)).step


@pytest.mark.dist
@pytest.mark.slow
def test_two_ranks_resume_by_key_and_match_one_process(tmp_path: Path) -> None:
    db = Sqlite(tmp_path / "clicks.db")
    db.load("clicks", rows(0, ROWS, 10))
    data = _sql(db)
    steps = -(-ROWS // 64)
    one = train(from_dict(_raw(tmp_path, "one", data)))
    assert one.step == steps
    assert run_ranks(_train_rank, 2, (_raw(tmp_path, "two", data, max_steps=4),), timeout=240) == [4, 4]
    cut = read_manifest(resolve_checkpoint(tmp_path / "two"))["position"]
    keys = sorted(rows(0, ROWS, 10).column("id").to_pylist())
    assert cut == {"epoch": 0, "batch": 4, "sql_key": keys[255], "sql_key_max": keys[-1]}
    resumed = _raw(tmp_path, "two", data, resume=str(tmp_path / "two"))
    assert run_ranks(_train_rank, 2, (resumed,), timeout=240) == [steps, steps]
    assert_states_close(checkpoint_state(tmp_path / "one"), checkpoint_state(tmp_path / "two"))


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [0, 150], ids=["key_order", "shuffled"])
def test_every_rank_trains_the_rows_rank_0_pinned_though_rows_arrive_between_their_queries(tmp_path: Path,
                                                                                      shuffle: int) -> None:
    """Each rank runs the query itself. Rank 1 here sees 150 rows more (higher keys, as if
    committed between rank 0's pin of the epoch and rank 1's): both ranks take rank 0's pin
    (``pin_epoch``) and train the rows rank 0 saw, as one process on them does; with each rank
    pinning its own, rank 1 would have more batches than rank 0."""
    folders = [tmp_path / "r0", tmp_path / "r1"]
    for i, folder in enumerate(folders):
        folder.mkdir()
        db = Sqlite(folder / "clicks.db")
        db.load("clicks", rows(0, ROWS, 10))
        if i == 1:
            db.load("clicks", rows(7, 150, 10 + 3 * ROWS), mode="append")
    data = {**_sql(Sqlite(folders[0] / "clicks.db")), "shuffle_buffer": shuffle}
    steps = -(-ROWS // 64)
    one = train(from_dict(_raw(tmp_path, "one", data)))
    assert one.step == steps
    data["sql"]["uri"] = "clicks.db"
    two = _raw(tmp_path, "two", data)
    assert run_ranks(_train_rank_in, 2, ([str(f) for f in folders], two), timeout=240) == [steps, steps]
    assert_states_close(checkpoint_state(tmp_path / "one"), checkpoint_state(tmp_path / "two"))
