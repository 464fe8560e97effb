"""One rank of a transformer trained under a parallel layout: build (mesh, model, engines, optimizer,
pipeline schedule), resume from a distributed checkpoint, run the steps, summarize.

A step's loss is the mean over the whole global batch on every rank (context-parallel ranks each hold a slice
of the tokens, the last pipeline stage holds it alone), so it compares with a one-rank run of the same batch."""
from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.profiler import record_function

from meshscale.execute import RankContext
from meshscale.models.layout import ParallelLayout
from meshscale.models.transformer import TransformerConfig
from meshscale.train import checkpoint
from meshscale.train.build import learning_rate, optimizer_factory, resolve
from meshscale.train.config import TrainConfig
from meshscale.train.data import Batches
from meshscale.train.graphed import set_lr
from meshscale.train.loop import open_log, run_steps
from meshscale.models.registry import ModelSpec
from meshscale.train.parallel.breakdown import DATA_LABEL, StepProfile
from meshscale.train.parallel.comm import comm_by_dimension, recorded_entries
from meshscale.train.parallel.apply import parallelize, stage_count, stage_ids
from meshscale.train.parallel.mesh import LayoutMesh, layout_mesh
from meshscale.train.timing import Clock, TimedStep, Window
from meshscale.train.transformer import Transformer


COMM_STEPS = 5  # steps the per-dimension communication is counted over (the last timed ones)


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, in fp32 whatever the logits' dtype."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


@dataclass
class LayoutTrainer:
    cfg: TrainConfig
    spec: ModelSpec
    model_cfg: TransformerConfig
    layout: ParallelLayout
    mesh: LayoutMesh
    parts: list[nn.Module]          # this rank's pipeline stage(s), or the whole model
    optimizer: torch.optim.Optimizer
    schedule: Any                   # a torch.distributed.pipelining schedule, or None
    batches: Batches
    positions: torch.Tensor | None  # context parallelism: the sequence positions this rank holds
    clock: Clock
    device: torch.device
    loss_group: Any = None          # the whole world, for the loss's average only

    @property
    def first_stage(self) -> bool:
        return self.mesh.coordinate("pp") == 0 or self.layout.pp == 1

    @property
    def last_stage(self) -> bool:
        return self.layout.pp == 1 or stage_count(self.layout) - 1 in stage_ids(self.layout, self.mesh.coordinate("pp"))

    def state_module(self) -> nn.Module:
        """The module whose state is checkpointed: the model, or this rank's stages side by side."""
        return self.parts[0] if len(self.parts) == 1 else nn.ModuleList(self.parts)


def build_layout(cfg: TrainConfig, device: torch.device) -> LayoutTrainer:
    """Every rank builds the whole model from the same seed, then keeps and parallelizes its part."""
    spec, data = resolve(cfg)
    model_cfg: TransformerConfig = spec.transformer
    layout = cfg.layout.parallel_layout()
    mesh = layout_mesh(layout, device)
    torch.manual_seed(cfg.seed)
    with torch.device(device):
        model = Transformer(model_cfg, spec.input_shape[0])
    parts = parallelize(model, mesh, spec.input_shape[0], cfg.layout.checkpointing,
                        bf16=cfg.speed.precision == "bf16")
    del model
    params = [p for part in parts for p in part.parameters()]
    optimizer = optimizer_factory(cfg, spec)(params)
    positions = parts[0].positions if layout.cp > 1 else None
    schedule = _schedule(layout, mesh, parts, device) if layout.pp > 1 else None
    batches = Batches(data, cfg.batch_per_rank, mesh.data_rank, layout.data_parallel, cfg.seed, device)
    # a group of its own takes torch's default timeout, not the run's: give it --timeout-s
    loss_group = (dist.new_group(timeout=timedelta(seconds=cfg.timeout_s), group_desc="meshscale_loss")
                  if layout.world_size > 1 else None)
    return LayoutTrainer(cfg, spec, model_cfg, layout, mesh, parts, optimizer, schedule, batches, positions,
                         Clock(device), device, loss_group)


def _schedule(layout: ParallelLayout, mesh: LayoutMesh, parts: list[nn.Module], device):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
    group = mesh["pp"].get_group()
    ids = stage_ids(layout, mesh.coordinate("pp"))
    stages = [PipelineStage(part, s, stage_count(layout), device, group=group) for part, s in zip(parts, ids)]
    if layout.pp_schedule == "interleaved-1f1b":
        return ScheduleInterleaved1F1B(stages, layout.micro_batches, loss_fn=token_loss)
    cls = ScheduleGPipe if layout.pp_schedule == "gpipe" else Schedule1F1B
    return cls(stages[0], layout.micro_batches, loss_fn=token_loss)


def forward_backward(t: LayoutTrainer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """This rank's loss (the batch's, or zero on a pipeline stage without the head) and the gradients."""
    if t.schedule is None:
        loss = token_loss(t.parts[0](x), y)
        loss.backward()
        return loss.detach()
    losses: list[torch.Tensor] = []
    args = (x,) if t.first_stage else ()
    kwargs = {"target": y, "losses": losses} if t.last_stage else {}
    t.schedule.step(*args, **kwargs)
    return torch.stack(losses).mean().detach() if losses else torch.zeros((), device=t.device)


def global_loss(t: LayoutTrainer, loss: torch.Tensor) -> torch.Tensor:
    """The mean loss over the global batch: the last stage's, averaged over the ranks that hold other tokens
    (tp ranks hold the same value, so their average is the average over data and context ranks). On a group of
    its own, so that the per-dimension communication leaves it out."""
    if t.layout.world_size == 1:
        return loss
    loss = loss.float().clone()
    dist.all_reduce(loss, group=t.loss_group)
    # the sum over the world: the last stage's losses, each counted once per tp rank; other stages add zero
    return loss / (t.layout.world_size // t.layout.pp)


def layout_step(t: LayoutTrainer, step: int, lr: float) -> tuple[dict[str, Any], torch.Tensor, TimedStep | None]:
    """One step: its row, its global loss tensor and, when timing, its marks (read once the next step is queued)."""
    set_lr(t.optimizer, lr)
    timing = t.cfg.timing
    t0 = t.clock.mark() if timing else None   # untimed: no marks (the host does what a plain loop does)
    with record_function(DATA_LABEL):
        x, y = t.batches.get(step)
        if t.positions is not None:
            x, y = x[:, t.positions], y[:, t.positions]
    t_data = t.clock.mark() if timing else None
    t.optimizer.zero_grad(set_to_none=True)
    loss = forward_backward(t, x, y)
    t.optimizer.step()
    timed = TimedStep(t.clock, t0, t_data, t.clock.mark(), per_step={
        "samples": t.cfg.global_batch, "tokens": t.cfg.global_batch * t.spec.input_shape[0]}) if timing else None
    return {"step": step, "lr": lr}, global_loss(t, loss), timed


# ---- checkpoints: torch.distributed.checkpoint, each rank writing its shards -----------------------------------
def save_checkpoint(ctx: RankContext, t: LayoutTrainer, done: int) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_state, optim_state = get_state_dict(t.state_module(), t.optimizer)
    directory = Path(t.cfg.checkpoint.dir)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(directory / f"step-{done:08d}"))
    ctx.barrier()
    if ctx.rank == 0:
        checkpoint.publish(directory, done)


def load_checkpoint(t: LayoutTrainer) -> int:
    """Load the latest checkpoint into the model and optimizer (resharded to this layout's shards); its step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    directory = Path(t.cfg.checkpoint.dir)
    step = checkpoint.latest_step(directory)
    if step is None:
        from meshscale.errors import MeshscaleError
        raise MeshscaleError(f"no checkpoint in {directory} to resume from; run without --resume first")
    model_state, optim_state = get_state_dict(t.state_module(), t.optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(directory / f"step-{step:08d}"))
    set_state_dict(t.state_module(), t.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return step


# ---- the rank's run --------------------------------------------------------------------------------------------
def layout_worker(ctx: RankContext, cfg: TrainConfig) -> dict[str, Any]:
    """One rank of a layout run (started by `meshscale.execute.launch`). Rank 0 returns the per-step rows."""
    ctx.phase(f"building {cfg.model} ({cfg.layout.parallel_layout().describe()})")
    # FSDP2 warns once per rank that the root module returns a view (the logits reshaped for the loss); nothing
    # here changes that view in place, so the warning says nothing about this run
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    t = build_layout(cfg, ctx.device)
    start = load_checkpoint(t) if cfg.checkpoint.resume and cfg.checkpoint.dir else 0
    log = open_log(ctx, cfg, start, f"{cfg.model} {t.layout.describe()}")
    window = Window(t.clock, min(start + cfg.timing_warmup, cfg.steps - 1))
    # the communication counted over the last timed steps (the flight recorder keeps the latest operations)
    counted_from = max(window.first_step, cfg.steps - COMM_STEPS)
    started_ns: dict[int, int] = {}
    # the last warm-up steps (never this run's first) under the profiler: the throughput window stays unprofiled
    profiled = StepProfile(range(max(start + 1, window.first_step - cfg.comm_breakdown_steps), window.first_step)
                           if cfg.timing else range(0), t.clock, t.layout)

    def step_fn(step: int):
        started_ns[step] = time.time_ns()
        with profiled.step(step):
            return layout_step(t, step, learning_rate(cfg, t.spec, step))
    run_steps(ctx, cfg, start, log, window, step_fn, lambda done: save_checkpoint(ctx, t, done), t.layout.describe())
    out = {"summary": summarize(ctx, t, start, len(log.rows), window), "rows": log.rows if ctx.rank == 0 else []}
    out["summary"]["breakdown"] = asdict(profiled.result) if profiled.result else None
    if counted_from in started_ns:
        out["summary"]["comm_by_dimension"] = comm_by_dimension(recorded_entries(), started_ns[counted_from],
                                                                cfg.steps - counted_from, t.layout)
    del t
    return out


def summarize(ctx: RankContext, t: LayoutTrainer, start: int, steps: int, window: Window) -> dict[str, Any]:
    """This rank's summary: throughput over the timed window, its peak memory (GPUs) and the model's size."""
    cfg = t.cfg
    timed = cfg.steps - window.first_step if window.started else 0
    rate = cfg.global_batch * timed / window.seconds if window.seconds > 0 else None
    summary: dict[str, Any] = {
        "rank": ctx.rank, "steps": steps, "first_step": start, "max_param_diff": 0.0, "timed_steps": timed,
        "samples_per_s": rate, "params": t.spec.params, "flops_per_sample": t.spec.flops_per_sample,
        "layout": t.layout.describe(), "peak_allocated_bytes": None, "peak_reserved_bytes": None,
        "peak_rss_bytes": None}
    if ctx.device.type == "cuda":
        summary["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(ctx.device)
        summary["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(ctx.device)
    else:  # CPU workers have no allocator statistics: the process's peak resident memory (Linux: KiB)
        import resource
        summary["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return summary
