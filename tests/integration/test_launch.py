"""The launcher: ranks start, results return in rank order, a failing or dying rank never hangs the rest."""
import os
import time

import pytest
import torch
import torch.distributed as dist

from meshscale.errors import MeshscaleError
from meshscale.execute import WorkerError, launch


def _sum_ranks(ctx, n):
    t = torch.full((n,), float(ctx.rank + 1))
    ctx.phase("all_reduce")
    dist.all_reduce(t)
    return ctx.rank, t[0].item()


def _one_rank_dies(ctx):
    ctx.phase("all_reduce of 4 elements")
    if ctx.rank == 1:
        os._exit(3)
    t = torch.ones(4)
    dist.all_reduce(t)
    return True


def _one_rank_raises(ctx):
    ctx.phase("setup")
    if ctx.rank == 2:
        raise ValueError("bad thing")
    dist.barrier()
    return True


def _one_rank_never_arrives(ctx):
    ctx.phase("broadcast")
    if ctx.rank == 0:
        time.sleep(60)
    t = torch.ones(4)
    dist.broadcast(t, 0)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_results_in_rank_order(world):
    out = launch(_sum_ranks, world, (8,), timeout_s=30)
    total = world * (world + 1) / 2
    assert out == [(r, total) for r in range(world)]


def test_dead_rank_is_named_and_others_stop():
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"rank 1 died \(exit code 3\) during all_reduce of 4 elements"):
        launch(_one_rank_dies, 3, timeout_s=20)
    assert time.monotonic() - start < 20


def test_raising_rank_is_named():
    with pytest.raises(WorkerError, match="rank 2 failed with ValueError: bad thing during setup"):
        launch(_one_rank_raises, 3, timeout_s=20)


def test_hanging_rank_hits_the_timeout():
    start = time.monotonic()
    # the rank that never arrived is named, not the one that timed out waiting for it
    with pytest.raises(WorkerError, match=r"^rank 0 stopped making progress .* during broadcast"):
        launch(_one_rank_never_arrives, 2, timeout_s=3)
    assert time.monotonic() - start < 15


def test_too_many_gpus_is_a_clear_error():
    with pytest.raises(MeshscaleError, match="asked for 64 GPUs"):
        launch(_sum_ranks, 64, (1,), backend="nccl")
