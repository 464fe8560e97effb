"""`train --profile-batches` is timed as the scaled runs are: no device sync inside the timed window, one at
each end (a sync per step made the one-GPU profile slower than the runs it predicts)."""
import pytest
import torch
import torch.distributed as dist

from meshscale.execute.launcher import RankContext
from meshscale.train import runner
from meshscale.train.config import TrainConfig
from meshscale.train.loop import train_worker
from meshscale.train.timing import Clock


def test_profile_runs_without_per_step_timing(monkeypatch):
    seen, launches = [], []

    def fake_worker(ctx, cfg):
        seen.append(cfg)
        return {"summary": {"rank": 0, "steps": cfg.steps, "first_step": 0, "max_param_diff": 0.0, "timed_steps": 10,
                            "samples_per_s": 4.0 * cfg.batch_per_rank, "params": 1, "flops_per_sample": 1.0},
                "rows": [{"step": i, "lr": 0.1} for i in range(cfg.steps)]}

    def fake_launch(fn, world, args, **kwargs):
        launches.append(world)
        return [fn(None, *args)]

    monkeypatch.setattr(runner, "train_worker", fake_worker)
    monkeypatch.setattr(runner, "launch", fake_launch)
    monkeypatch.setattr(runner, "gradient_readiness", lambda cfg, batch: [(10, 1.0)])
    result = runner.profile(TrainConfig(steps=12), [32, 8])
    assert launches == [1]  # one process for every batch size, smallest first
    assert [c.timing for c in seen] == [False, False] and [c.batch_per_rank for c in seen] == [8, 32]
    assert [r["step_time_s"] for r in result.rows] == pytest.approx([0.25, 0.25])  # batch / the window's rate
    assert result.meta["profile"] is True and result.rows[0]["compute_s"] is None


@pytest.mark.parametrize("timing, syncs", [(False, 2), (True, None)])
def test_the_timed_window_syncs_only_at_its_ends(monkeypatch, timing, syncs):
    calls = []
    monkeypatch.setattr(Clock, "sync", lambda self: calls.append(1))
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        cfg = TrainConfig(steps=6, timing_warmup=2, batch_per_rank=4, timing=timing)
        out = train_worker(RankContext(0, 1, 0, "gloo", torch.device("cpu"), store), cfg)
    finally:
        dist.destroy_process_group()
    assert out["summary"]["samples_per_s"] > 0
    if syncs is None:  # with per-step timing every step syncs: the contrast that makes the check mean something
        assert len(calls) >= cfg.steps
    else:
        assert len(calls) == syncs
