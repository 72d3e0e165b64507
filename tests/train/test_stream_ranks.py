"""StreamRanks (distributed online training): the ranks' streams agree batch by batch; the pass
ends on every rank before the first step some rank lacks or cuts short (its stream ended
first), and batches of one size that end in other places are a DataError. Two ranks simulated
in one process: the agreement is the elementwise max of what each asks."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ember.errors import DataError
from ember.train.shards import AHEAD
from ember.train.stream_ranks import StreamRanks


@dataclass
class _Batch:
    size: int


class _Stream:
    """Batches of the given sizes, each ending in file ``f<k>`` (``files``) at its rows so far."""

    def __init__(self, sizes: list[int], files: list[str] | None = None) -> None:
        self.sizes, self.files = sizes, files or ["f"] * len(sizes)

    def cut_after(self, batches: int) -> tuple[str | None, int]:
        return self.files[batches - 1], sum(self.sizes[:batches])


class _Both:
    """The process group's ``agree`` for ``start``: the max of this rank's values and the other's."""

    def __init__(self, other: StreamRanks) -> None:
        self.other = other

    def agree(self, values: list[int]) -> list[int]:
        theirs = [v for s in range(AHEAD) for v in self.other._slots(s)]
        return [max(a, b) for a, b in zip(values, theirs)]


def _pass(a: _Stream, b: _Stream) -> tuple[int | None, list[list[int]]]:
    """Run both ranks' ``agree`` stages over their streams, then agree step by step until the
    pass ends; returns the agreed end and the batches each rank's stage let through."""
    ranks = [StreamRanks(s, 0) for s in (a, b)]  # type: ignore[arg-type]
    out: list[list[int]] = [[], []]
    for r, s, o in zip(ranks, (a, b), out):
        stage = r.stage(1)
        for size in s.sizes:
            o.extend(x.size for x in stage.fn(_Batch(size)))
        o.extend(x.size for x in stage.finish())
    ranks[0].start(_Both(ranks[1]))  # type: ignore[arg-type]
    ranks[1].start(_Both(ranks[0]))  # type: ignore[arg-type]
    step = 0
    while ranks[0].end is None and step < 20:
        agreed = [max(x, y) for x, y in zip(ranks[0].ask(step), ranks[1].ask(step))]
        for r in ranks:
            r.hear(step, agreed)
        step += 1
    assert ranks[0].end == ranks[1].end
    return ranks[0].end, out


def test_the_same_stream_on_both_ranks_ends_where_it_ends():
    assert _pass(_Stream([4, 4, 4, 2]), _Stream([4, 4, 4, 2])) == (4, [[4, 4, 4, 2]] * 2)


def test_a_stream_that_ended_first_ends_the_pass_for_both():
    """Rank 0's idle timeout fired before a file rank 1 took: the pass ends before rank 1's
    extra batches; a last partial batch where the other rank cut a full one ends it too (its
    rows stay for the resumed run)."""
    assert _pass(_Stream([4, 4, 4]), _Stream([4, 4, 4, 4, 4]))[0] == 3
    assert _pass(_Stream([4, 4, 4, 2]), _Stream([4, 4, 4, 4, 3]))[0] == 3
    assert _pass(_Stream([]), _Stream([4]))[0] == 0  # no step at all


def test_batches_cut_from_files_in_other_orders_are_a_data_error():
    with pytest.raises(DataError, match="batch 1.*different orders"):
        _pass(_Stream([4, 4, 4], ["a", "b", "c"]), _Stream([4, 4, 4], ["a", "c", "b"]))


def test_the_stage_holds_two_batches_back_until_the_stream_ends():
    r = StreamRanks(_Stream([4, 4, 4, 4]), 0)  # type: ignore[arg-type]
    stage = r.stage(1)
    assert [len(stage.fn(_Batch(4))) for _ in range(4)] == [0, 0, 1, 1]
    assert len(list(stage.finish())) == 2
