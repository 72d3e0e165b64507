"""The dense model under DistributedDataParallel, with gradients summed (not averaged).

Each rank's loss is its rows' share of the global batch mean (sum of its rows' losses divided
by the global batch size), so the sum of the ranks' gradients is the gradient of the global
mean: the gradient one process computes on the whole batch. DDP's default hook averages over
ranks, so a sum hook replaces it; the embedding gradients, summed by their owners, follow the
same rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch import nn

from ember.distributed.exchange import Exchange
from ember.distributed.process_group import DistributedRun
from ember.errors import ConfigError

__all__ = ["wrap_model", "allreduce_sum_hook", "SumHookState"]


@dataclass
class SumHookState:
    """What ``allreduce_sum_hook`` needs: the group to sum over (None: the default group) and
    the exchange whose ``dense`` counter takes the bytes (None: not counted)."""

    group: dist.ProcessGroup | None = None
    exchange: Exchange | None = None
    group_size: int = 1


def allreduce_sum_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks the annotations' objects; this module's are strings
    """DDP communication hook: all-reduce each gradient bucket (``dist.GradBucket``) as a sum
    over ranks; returns the future of the summed buffer.

    Counts each bucket's bytes in ``state.exchange``'s ``dense`` counter as a ring all-reduce
    moves them: each rank sends and receives ``2 (n-1)/n`` x the bucket's bytes over a group of
    n ranks (the measured bucket payload times the ring's factor: gloo and NCCL pick their own
    algorithm, whose wire bytes are not observable here)."""
    buf = bucket.buffer()
    if state is not None and state.exchange is not None:
        n = state.group_size
        wire = int(round(2 * (n - 1) / n * buf.numel() * buf.element_size()))
        state.exchange.note("dense", wire, wire)
    group = state.group if state is not None else None
    fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def has_state_buffers(model: nn.Module) -> bool:
    """Whether ``model`` holds persistent buffers (state a forward may change, e.g. running
    statistics), which DDP must broadcast before each forward. ember's models hold only
    non-persistent ones, index tensors built from the config and equal on every rank: a
    broadcast of those each step would only add a collective's latency to the step (on a slow
    link, the wait behind the embedding exchange's traffic)."""
    return any(name not in m._non_persistent_buffers_set for m in model.modules() for name in m._buffers)


def wrap_model(model: nn.Module, run: DistributedRun) -> nn.Module:
    """``model`` under DDP (parameters broadcast from rank 0, gradients summed over ranks; with
    embedding ranks, over the dense ranks only: ``run.dense_group``). Call it on dense ranks.

    BatchNorm is refused: its batch statistics would be each rank's slice's, not the global
    batch's, so results would depend on the world size.
    """
    bn = [name for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if bn:
        raise ConfigError(f"the model has BatchNorm layers {bn[:3]}, which distributed training does not support yet "
                          "(their statistics would be per rank); set batchnorm: false in the model's MLPs")
    ids = [run.model_device.index] if run.model_device.type == "cuda" else None
    group = run.dense_group
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, process_group=group,
                                              broadcast_buffers=has_state_buffers(model))
    ddp.register_comm_hook(SumHookState(group, run.exchange, len(run.dense_ranks)), allreduce_sum_hook)
    return ddp
