"""The in-process multi-rank harness (``tests.distributed.ranks``): its ranks, forked from a
forkserver started once, see what a spawned rank would: the caller's environment at the call,
a numpy global generator of their own, and the caller's stdout and stderr (under pytest, the
current test's capture, not that of the test that started the forkserver)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from tests.distributed.ranks import init, run_ranks, run_ranks_killed

pytestmark = [pytest.mark.dist]


def _report(rank: int, world_size: int, tag: str) -> dict:
    import numpy as np
    import torch
    import torch.distributed as dist

    init()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print(f"{tag}: out of rank {rank}", flush=True)
    print(f"{tag}: err of rank {rank}", file=sys.stderr, flush=True)
    return {"sum": t.item(), "env": os.environ.get("RANKS_TEST_PROBE"), "draw": float(np.random.rand()),
            "rank": os.environ["RANK"], "world": os.environ["WORLD_SIZE"],
            "forked": "tests.distributed._preload" in sys.modules}  # what the forkserver imported


@pytest.mark.parametrize("call", ["first", "second"])
def test_ranks_see_the_callers_environment_and_output(call, monkeypatch, capfd):
    monkeypatch.setenv("RANKS_TEST_PROBE", call)  # not import-time: the forkserver's ranks take it
    ranks = run_ranks(_report, 2, (call,))
    assert [r["sum"] for r in ranks] == [3.0, 3.0]
    assert [(r["rank"], r["world"]) for r in ranks] == [("0", "2"), ("1", "2")]
    assert all(r["env"] == call for r in ranks)
    assert ranks[0]["draw"] != ranks[1]["draw"]  # not the forkserver's numpy state twice
    assert all(r["forked"] for r in ranks) or os.environ.get("EMBER_TEST_SPAWN") == "1"
    out, err = capfd.readouterr()
    assert all(f"{call}: out of rank {r}" in out and f"{call}: err of rank {r}" in err for r in (0, 1)), (out, err)


def _die_unless(rank: int, world_size: int, survivor: int) -> int:
    if rank != survivor:
        os.kill(os.getpid(), signal.SIGKILL)
    return rank


def test_killed_ranks_pass_and_a_rank_that_was_not_killed_is_named():
    run_ranks_killed(_die_unless, 2, (2,), timeout=60)  # no survivor: every rank SIGKILLed, as expected
    with pytest.raises(AssertionError, match=r"rank 1: exit code 0, returned"):
        run_ranks_killed(_die_unless, 2, (1,), timeout=60)
