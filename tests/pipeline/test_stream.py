"""StreamLoader: batches spanning files, equal to the offline loader's in file order; resumed
at any batch's stream position it yields exactly the batches after it (bad rows skipped too)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ember.errors import CheckpointError
from ember.featurize.schema import Schema
from ember.pipeline.loader import make_batches
from ember.pipeline.stream import StreamLoader, StreamPosition
from ember.source.config import DataConfig

SCHEMA = Schema(labels=["y"], dense=[{"name": "d"}], sparse=[{"name": "c"}])


def _files(tmp_path: Path, bad: bool = False) -> DataConfig:
    n = 0
    for f, rows in enumerate([7, 3, 10, 5]):  # rows 0..24, one per line, in file order
        lines = ["y,d,c"]
        for _ in range(rows):
            lines.append(f"{n % 2},{n},id{n}")
            n += 1
        if bad and f == 2:
            lines.insert(4, "1,notanumber,x")  # skipped: not counted in the file's rows
        (tmp_path / f"part-{f}.csv").write_text("\n".join(lines) + "\n")
    return DataConfig(format="csv", train=str(tmp_path), batch_size=4, shuffle_buffer=0,
                      on_bad_rows="skip" if bad else "error", csv={"block_bytes": 4096})


def _rows(batches) -> list[int]:
    return [int(v) for b in batches for v in b.dense[:, 0].tolist()]


@pytest.mark.parametrize("bad", [False, True])
def test_resumed_at_any_batch_it_yields_exactly_the_rest(tmp_path, bad):
    data = _files(tmp_path, bad)
    whole = StreamLoader(data, SCHEMA)
    batches = list(whole)
    assert _rows(batches) == list(range(25)) and [b.size for b in batches] == [4] * 6 + [1]
    offline = list(make_batches(data, SCHEMA, "train"))  # the offline loader in file order: the same batches
    for a, b in zip(batches, offline, strict=True):
        assert torch.equal(a.dense, b.dense) and torch.equal(a.sparse.values, b.sparse.values)
    positions = [whole.stream_position(k) for k in range(len(batches) + 1)]
    assert positions[0] == StreamPosition()
    assert (Path(positions[2].file).name, positions[2].rows, len(positions[2].done)) == ("part-1.csv", 1, 1)
    for k in range(1, len(batches) + 1):
        p = StreamPosition.from_position({"epoch": 0, "batch": k, **positions[k].to_dict()}, "ckpt")
        rest = StreamLoader(data, SCHEMA, p, start_batch=k)
        assert _rows(rest) == list(range(min(4 * k, 25), 25)), k
        read_again = bad and not any("part-2" in f for f in p.done)  # the bad row's file is read (again)
        assert rest.bad_rows.total == int(read_again), k
    # drop_last: the final partial batch is not trained
    assert _rows(StreamLoader(data.model_copy(update={"drop_last": True}), SCHEMA)) == list(range(24))


def test_a_stopped_stream_keeps_its_partial_batch_for_the_resumed_run(tmp_path):
    data = _files(tmp_path)
    loader = StreamLoader(data, SCHEMA, stop=lambda: True)  # stop before the end: no partial batch
    assert _rows(loader) == list(range(24))


def test_positions_without_a_stream_or_a_lost_file_are_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="train.init_from=ck"):
        StreamPosition.from_position({"epoch": 0, "batch": 3}, "ck")
    data = _files(tmp_path)
    gone = StreamPosition(("a.csv",), str(tmp_path / "gone.csv"), 2)
    with pytest.raises(CheckpointError, match="gone.csv, which no longer exists"):
        list(StreamLoader(data, SCHEMA, gone, start_batch=3))


def test_a_worker_process_yields_the_same_batches_and_positions(tmp_path):
    """pipeline.data_workers: 1: the same batches, every position recorded here, the stop
    relayed to the worker (its partial batch kept back) and its bad-row counts returned."""
    data = _files(tmp_path, bad=True)
    here = StreamLoader(data, SCHEMA, stop=lambda: True)
    there = StreamLoader(data, SCHEMA, stop=lambda: True, workers=1)
    a, b = list(here), list(there)
    assert _rows(a) == _rows(b) == list(range(24))
    for k in range(len(a) + 1):
        assert here.stream_position(k) == there.stream_position(k), k
    assert there.bad_rows.counts == here.bad_rows.counts == {"d: not a number": 1}
