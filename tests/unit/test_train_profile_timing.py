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
    assert "kernel_categories" not in result.meta   # a CPU's profile has no kernels to categorize


@pytest.mark.parametrize("traced", ["ok", "fails"])
def test_a_gpu_profile_keeps_its_step_times_when_the_category_trace_fails(monkeypatch, traced):
    import meshscale.train.kernel_categories as categories

    def fake_worker(ctx, cfg):
        return {"summary": {"rank": 0, "steps": cfg.steps, "first_step": 0, "max_param_diff": 0.0, "timed_steps": 10,
                            "samples_per_s": 4.0 * cfg.batch_per_rank, "params": 1, "flops_per_sample": 1.0},
                "rows": []}

    def fake_categories(cfg, device):
        if traced == "fails":
            raise RuntimeError("CUPTI unavailable")
        return {"seconds_per_step": {"optimizer": 0.001}, "kernel_s_per_step": 0.001, "batch_per_rank": 32}

    monkeypatch.setattr(runner, "train_worker", fake_worker)
    monkeypatch.setattr(runner, "launch", lambda fn, world, args, **kw: [fn(None, *args)])
    monkeypatch.setattr(runner, "gradient_readiness", lambda cfg, batch: [(10, 1.0)])
    monkeypatch.setattr(categories, "kernel_categories", fake_categories)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(runner, "check_gpus", lambda count: None)   # no GPU here: the trace is faked
    result = runner.profile(TrainConfig(steps=12, device="cuda"), [32, 8])
    assert [r["step_time_s"] for r in result.rows] == pytest.approx([0.25, 0.25])
    if traced == "ok":
        assert result.meta["kernel_categories"]["batch_per_rank"] == 32
    else:
        assert "kernel_categories" not in result.meta
        assert result.meta["kernel_categories_missing"] == "RuntimeError: CUPTI unavailable"


@pytest.mark.parametrize("timing", [False, True])
def test_the_timed_window_syncs_only_at_its_ends(monkeypatch, timing):
    syncs, waits = [], []
    monkeypatch.setattr(Clock, "sync", lambda self: syncs.append(1))
    monkeypatch.setattr(Clock, "wait", lambda self, mark: waits.append(mark))
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        cfg = TrainConfig(steps=6, timing_warmup=2, batch_per_rank=4, timing=timing)
        out = train_worker(RankContext(0, 1, 0, "gloo", torch.device("cpu"), store), cfg)
    finally:
        dist.destroy_process_group()
    assert out["summary"]["samples_per_s"] > 0
    assert len(syncs) == 2  # the window's ends: no step stops the device
    # per-step timing reads each step's marks once the device has passed them: one wait a step, never a sync
    assert len(waits) == (cfg.steps if timing else 0)
    if timing:
        rows = out["rows"]
        assert all(r["step_time_s"] > 0 and r["samples_per_s"] > 0 and "loss" in r for r in rows)


class _DeviceClock(Clock):
    """A device clock whose marks are numbers, and which records what the host waited for."""

    def __init__(self):
        self.cuda, self.now, self.waited = True, 0.0, []

    def mark(self):
        self.now += 1.0
        return self.now

    def seconds(self, a, b):
        return b - a

    def sync(self):
        pass

    def wait(self, mark):
        self.waited.append(mark)


def test_a_timed_step_on_a_device_is_read_once_the_next_is_queued(tmp_path):
    from meshscale.train.loop import run_steps
    from meshscale.train.step_log import StepLog
    from meshscale.train.timing import TimedStep, Window
    clock, events = _DeviceClock(), []
    cfg = TrainConfig(steps=4, timing=True)

    class DeviceLoss:
        """A loss on the device: reading it directly would wait for all the work queued after it."""
        is_cuda = True

        def __init__(self, value):
            self.value = value

        def detach(self):
            return self

        def to(self, device, non_blocking=False):
            assert device == "cpu" and non_blocking
            events.append(("copy", self.value))
            return torch.tensor(self.value)

        def item(self):
            raise AssertionError("a device tensor's item() waits for the next step too")

    def step_fn(step):
        events.append(("run", step))
        start = clock.mark()
        clock.now += step  # step k takes k more units on the device
        return {"step": step}, DeviceLoss(float(step)), TimedStep(clock, start, start, clock.mark(),
                                                                  per_step={"samples": 8})

    class Log(StepLog):
        def add(self, row, loss=None):
            events.append(("write", row["step"]))
            super().add(row, loss)
    log = Log(None, None, False, cfg.steps, 0, "")
    ctx = RankContext(0, 1, 0, "gloo", torch.device("cpu"), dist.HashStore())
    run_steps(ctx, cfg, 0, log, Window(clock, 0), step_fn, lambda done: None, "test")
    # no row is read before the next step is queued; the last one at the end
    # and its loss comes by a copy queued right behind it, never by reading the device tensor
    assert events == [("run", 0), ("copy", 0.0), ("run", 1), ("write", 0), ("copy", 1.0), ("run", 2), ("write", 1),
                      ("copy", 2.0), ("run", 3), ("write", 2), ("copy", 3.0), ("write", 3)]
    starts, ends = [1, 3, 6, 10], [2, 5, 9, 14]  # marks: start, k units of work, end
    # a step's time runs to the next step's start; the last one's to its own end
    assert [r["step_time_s"] for r in log.rows] == [3 - 1, 6 - 3, 10 - 6, 14 - 10]
    assert clock.waited == starts[1:] + ends[-1:]
    assert [r["samples_per_s"] for r in log.rows] == pytest.approx([8 / r["step_time_s"] for r in log.rows])
    assert [r["loss"] for r in log.rows] == [0.0, 1.0, 2.0, 3.0]
