"""The per-rank training loop, one for the data-parallel modes and the parallel layouts: build, restore a
checkpoint, run the steps (each timed, logged, checked and checkpointed as asked), then summarize what was
measured."""
from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import asdict
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from meshscale.errors import MeshscaleError
from meshscale.execute import RankContext, in_torchrun
from meshscale.train import checkpoint
from meshscale.train.build import build
from meshscale.train.config import TrainConfig
from meshscale.train.data import open_data
from meshscale.train.exchange import flat_params
from meshscale.train.moe import moe_counters
from meshscale.train.graphed import EAGER_STEPS
from meshscale.train.parallel.breakdown import StepProfile
from meshscale.train.parallel.comm import comm_by_dimension, recorded_entries
from meshscale.train.recipe import learning_rate
from meshscale.train.step import evaluate, run_step
from meshscale.train.step_log import StepLog
from meshscale.train.timing import TimedStep, Window
from meshscale.train.trace import StepTracer
from meshscale.train.trainer import Trainer

COMM_STEPS = 5  # steps a layout's per-dimension communication is counted over (the last timed ones)


def train_worker(ctx: RankContext, cfg: TrainConfig) -> dict[str, Any]:
    """One rank of a training run (started by `meshscale.execute.launcher`). Rank 0 returns the per-step rows."""
    ctx.phase(f"building {cfg.model} ({cfg.layout.parallel_layout().describe()})" if cfg.is_transformer
              else "building the model")
    # FSDP2 warns once per rank that the root module returns a view (the logits reshaped for the loss); nothing
    # here changes that view in place, so the warning says nothing about this run
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    # torch 2.13 warns, once per rank, that slicing a flattened mesh dimension (the fsdp x cp and experts' meshes)
    # will be deprecated; it is how torch 2.11 on the GPU machines takes them, and nothing a user can change
    warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    t = build(cfg, ctx.device, ctx.rank, ctx.world_size)
    built = peak_memory(ctx.device)
    if ctx.device.type == "cuda":   # the steps' own peak from here on (the build's is kept beside it)
        torch.cuda.reset_peak_memory_stats(ctx.device)
    start = restore(ctx, t)
    log = open_log(ctx, cfg, start, f"{cfg.model} {t.layout.describe()}" if t.layout else None)
    window = Window(t.clock, first_timed_step(t, start))
    steps = TrainSteps(t, StepTracer(cfg.logging.trace, ctx.rank, window.first_step, cfg.steps, t), start, window)
    try:
        run_steps(ctx, cfg, start, log, window, steps, lambda done: save_checkpoint(ctx, t, done), t.label)
    finally:
        steps.tracer.close()
    out = {"summary": summarize(ctx, t, start, len(log.rows), window, steps, built),
           "rows": log.rows if ctx.rank == 0 else []}
    if cfg.debug.return_params and ctx.rank == 0:
        out["params"] = flat_params(t.model.parameters()).cpu().numpy()  # a tensor would travel by fd passing, which dies with the rank
    del t  # free the DDP reducer before the group goes (teardown deadlock)
    return out


class TrainSteps:
    """The step as `run_steps` calls it (``steps(step) -> (row, loss)``): traced when asked, checked against
    rank 0 when asked; a layout's last warm-up steps profiled for each dimension's communication, which is also
    counted over the last timed steps. benchmarks/resnet_host_profile.py runs this same object."""

    def __init__(self, t: Trainer, tracer: StepTracer, start: int = 0, window: Window | None = None):
        self.t, self.tracer = t, tracer
        self.max_param_diff = 0.0
        self.started_ns: dict[int, int] = {}
        first = window.first_step if window is not None else start
        # the last warm-up steps (never this run's first) under the profiler: the throughput window stays unprofiled
        self.profiled = StepProfile(range(max(start + 1, first - t.cfg.comm_breakdown_steps), first)
                                    if t.cfg.timing else range(0), t.clock, t.layout) if t.layout else None

    def __call__(self, step: int) -> StepOutput:
        t = self.t
        self.started_ns[step] = time.time_ns()
        with self.tracer.step(step), self.profiled.step(step) if self.profiled else contextlib.nullcontext():
            row, loss, timed = run_step(t, step, learning_rate(t.cfg, t.spec, step))
        if t.cfg.debug.verify_sync and t.layout is None:  # a layout's ranks hold different shards
            self.max_param_diff = max(self.max_param_diff, difference_to_rank0(t))
        # a graph's loss is overwritten by the next replay: copy it
        return row, loss.clone() if t.graphed is not None else loss.detach(), timed


# a step's row, its loss tensor and, when timed, its marks
StepOutput = tuple[dict[str, Any], Any, Optional[TimedStep]]


def run_steps(ctx: RankContext, cfg: TrainConfig, start: int, log: StepLog, window: Window,
              step_fn: Callable[[int], StepOutput], save: Callable[[int], None], label: str) -> None:
    """Steps ``start`` .. ``cfg.steps - 1``: each recorded as this rank's phase, timed by ``window``, run by
    ``step_fn(step) -> (row, loss, timed)``, logged, and checkpointed by ``save(steps done)`` when due. On a GPU a
    timed step's row is completed and written once the next step is queued (`TimedStep`)."""
    pending: StepOutput | None = None

    def complete(next_start: Any = None) -> None:
        nonlocal pending
        if pending is not None:
            row, loss, timed = pending
            if next_start is None and timed.clock.cuda:  # before a checkpoint and at the end: the loss's copy
                timed.clock.sync()                        # was queued after the step's marks
            row.update(timed.times(next_start), loss=loss.item())  # a host copy, landed once the marks passed
            log.add(row)
            pending = None
    try:
        for step in range(start, cfg.steps):
            ctx.phase(f"training step {step} ({label})")
            if cfg.debug.fault_step == step and ctx.rank == ctx.world_size - 1:
                os._exit(17)  # fault injection for the tests: die without a word, as a killed worker does
            window.at_step(step)
            row, loss, timed = step_fn(step)
            if timed is None:  # untimed: the loss stays on the device until the log flushes
                log.add(row, loss)
            else:
                complete(timed.start)
                # the loss comes to the host by a copy queued behind the step: `loss.item()` on the device tensor
                # would wait for everything queued after it too (the next step), which stops a host-bound loop
                # from running ahead at every step
                pending = (row, host_copy(loss), timed)
                if not timed.clock.cuda:  # the host clock's marks are passed when taken: the row is complete now
                    complete()
            if checkpoint_due(cfg, step + 1):
                ctx.phase(f"saving the checkpoint of step {step + 1}")
                complete()
                log.flush()
                save(step + 1)
        window.stop()
        complete()
        log.flush()
    finally:
        log.close()


def host_copy(value: Any) -> Any:
    """A device tensor copied to (pinned) host memory without waiting: read it once the device has passed the
    point where the copy was queued."""
    return value.detach().to("cpu", non_blocking=True) if value.is_cuda else value


def restore(ctx: RankContext, t: Trainer) -> int:
    """The step to start from: the latest checkpoint's (loaded into the model, exchange and scaler; a layout's
    shards resharded to this layout) when asked to resume, or when torchrun restarts the workers of a run that
    checkpoints; else 0."""
    directory = t.cfg.checkpoint.dir
    if not directory or not (t.cfg.checkpoint.resume or (in_torchrun() and checkpoint.latest_step(directory) is not None)):
        return 0
    ctx.phase("loading the checkpoint")
    if t.exchange.sharded:
        step = checkpoint.load_sharded(directory, t.model, t.exchange.optimizer)
    else:
        state = checkpoint.load(directory, ctx.rank, ctx.world_size)
        checkpoint.load_weights(t.model, state["model"], directory)
        t.exchange.load_state_dict(state["exchange"])
        if t.scaler is not None and state.get("scaler"):
            t.scaler.load_state_dict(state["scaler"])
        step = state["step"]
    if step >= t.cfg.steps:  # nothing would train, and the run would look like a finished one
        raise MeshscaleError(f"the checkpoint in {directory} is at step {step} and --steps {t.cfg.steps} is "
                             f"not beyond it; give --steps more than {step} or another --checkpoint-dir")
    return step


def open_log(ctx: RankContext, cfg: TrainConfig, start: int, title: str | None = None) -> StepLog:
    """Every rank keeps its rows; rank 0 also writes them where --log, --tensorboard and the progress bar say."""
    if ctx.rank != 0:
        return StepLog(None, None, False, cfg.steps, start, "")
    return StepLog(cfg.logging.jsonl, cfg.logging.tensorboard, cfg.logging.progress, cfg.steps, start,
                   title or f"{cfg.model} {cfg.mode} x{ctx.world_size}")


def first_timed_step(t: Trainer, start: int) -> int:
    """The first step of the throughput window: after --timing-warmup steps, and for a graphed run after its
    capture step whatever --timing-warmup says."""
    warmup = t.cfg.timing_warmup
    if t.graphed is not None:
        warmup = max(warmup, EAGER_STEPS[t.cfg.mode] + 1)
    return min(start + warmup, t.cfg.steps - 1)


def difference_to_rank0(t: Trainer) -> float:
    """The largest difference between this rank's parameters and rank 0's."""
    flat = flat_params(t.model.parameters())
    ref = flat.clone()
    dist.broadcast(ref, 0)
    return (flat - ref).abs().max().item()


def checkpoint_due(cfg: TrainConfig, done: int) -> bool:
    """A checkpoint after ``done`` steps: every --checkpoint-every steps and at the end."""
    every = cfg.checkpoint.every
    return bool(cfg.checkpoint.dir) and ((every and done % every == 0) or done == cfg.steps)


def save_checkpoint(ctx: RankContext, t: Trainer, done: int) -> None:
    """The checkpoint after ``done`` steps: a layout's shards, or each rank's file (the model on rank 0)."""
    if t.exchange.sharded:
        checkpoint.save_sharded(t.cfg.checkpoint.dir, done, t.model, t.exchange.optimizer, ctx.rank, ctx.barrier)
        return
    state = {"model": t.model.state_dict() if ctx.rank == 0 else None, "exchange": t.exchange.state_dict(),
             "scaler": t.scaler.state_dict() if t.scaler is not None else None}
    checkpoint.save(t.cfg.checkpoint.dir, done, ctx.rank, ctx.world_size, state, ctx.barrier)


def summarize(ctx: RankContext, t: Trainer, start: int, steps: int, window: Window, run: TrainSteps,
              built: dict[str, int | None] | None = None) -> dict[str, Any]:
    """This rank's summary: throughput over the timed window and the model's size; rank 0's evaluation; for a
    layout its peak memory (the run's, and the build's and the steps' apart: ``built``, the build's) and each
    dimension's communication (measured by ``run``'s profiled and counted steps)."""
    cfg = t.cfg
    timed = cfg.steps - window.first_step if window.started else 0
    summary: dict[str, Any] = {
        "rank": ctx.rank, "steps": steps, "first_step": start, "max_param_diff": run.max_param_diff,
        "timed_steps": timed, "samples_per_s": cfg.global_batch * timed / window.seconds if window.seconds > 0 else None,
        "params": t.spec.params, "flops_per_sample": t.spec.flops_per_sample}
    if t.layout is not None:
        summary.update(layout=t.layout.describe(), **run_peak_memory(ctx.device, built or {}))
        summary["moe"] = moe_counters(t.exchange.parts, steps)
        summary["breakdown"] = asdict(run.profiled.result) if run.profiled.result else None
        counted_from = max(window.first_step, cfg.steps - COMM_STEPS)  # the flight recorder keeps the latest ops
        if counted_from in run.started_ns:
            summary["comm_by_dimension"] = comm_by_dimension(recorded_entries(), run.started_ns[counted_from],
                                                             cfg.steps - counted_from, t.layout)
    elif ctx.rank == 0 and cfg.eval_data:
        ctx.phase("evaluating")
        spec = t.spec
        summary.update(evaluate(t.model, open_data(cfg.eval_data, spec.input_kind, spec.input_shape, spec.num_classes),
                                spec.input_kind, t.device))
    return summary


def run_peak_memory(device: torch.device, built: dict[str, int | None]) -> dict[str, int | None]:
    """The run's peaks (the larger of the build's and the steps'), each apart (``build_`` and ``step_`` keys),
    and on a GPU the device memory in use at the end (the context and NCCL's buffers beside the allocator's
    segments: `end_outside_allocator_bytes`)."""
    steps = peak_memory(device)
    out = dict(steps)
    for key in ("peak_allocated_bytes", "peak_reserved_bytes"):
        values = [v for v in (built.get(key), steps[key]) if v is not None]
        out[key] = max(values) if values else None
        out[f"build_{key}"], out[f"step_{key}"] = built.get(key), steps[key]
    out["end_device_used_bytes"] = out["end_outside_allocator_bytes"] = None
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        out["end_device_used_bytes"] = total - free
        out["end_outside_allocator_bytes"] = total - free - torch.cuda.memory_reserved(device)
    return out


def peak_memory(device: torch.device) -> dict[str, int | None]:
    """This rank's peak memory: the allocator's on a GPU; on a CPU the process's peak resident memory."""
    if device.type == "cuda":
        return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(device), "peak_rss_bytes": None}
    import resource  # CPU workers have no allocator statistics (Linux: ru_maxrss in KiB)
    return {"peak_allocated_bytes": None, "peak_reserved_bytes": None,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
