"""fp16 loss scaling across ranks: an overflow on one rank only skips the step on every rank."""

from __future__ import annotations

import pytest
import torch

from ember.train.precision import LossScaler
from tests.distributed.ranks import init, run_ranks

pytestmark = [pytest.mark.dist]


def _scale_with_inf_on_rank_0(rank: int, world_size: int) -> list[tuple[bool, float, int]]:
    import torch.distributed as dist

    init()

    def agree(bad: bool) -> bool:
        t = torch.tensor([int(bad)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    scaler = LossScaler(init_scale=8.0, growth_interval=2, agree=agree)
    seen = []
    for step in range(3):
        g = torch.tensor([8.0, 16.0])
        if rank == 0 and step == 1:
            g[1] = float("inf")  # rank 0 alone overflows at step 1
        seen.append((scaler.unscale_([g]), scaler.scale, scaler.skipped))
    return seen


def test_an_overflow_on_one_rank_skips_the_step_on_every_rank():
    ranks = run_ranks(_scale_with_inf_on_rank_0, 2)
    # step 0 clean; step 1 skipped everywhere and the scale halves everywhere; step 2 clean
    assert ranks[0] == ranks[1] == [(True, 8.0, 0), (False, 4.0, 1), (True, 4.0, 1)]
    alone = LossScaler(init_scale=8.0, growth_interval=2)  # without agreement rank 1 would have stepped
    assert alone.unscale_([torch.tensor([8.0, 16.0])]) and alone.unscale_([torch.tensor([8.0, 16.0])])
