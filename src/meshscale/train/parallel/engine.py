"""A transformer trained under a parallel layout: the device mesh, the model parallelized over it (FSDP2, tensor,
pipeline and context parallelism), its optimizer and pipeline schedule, as the one `Trainer` (train/trainer.py)
runs them: a `LayoutExchange` is the exchange of its step (train/step.py).

A step's loss is the mean over the whole global batch on every rank (context-parallel ranks each hold a slice
of the tokens, the last pipeline stage holds it alone), so it compares with a one-rank run of the same batch."""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from meshscale.models.layout import ParallelLayout
from meshscale.train.config import TrainConfig
from meshscale.train.data import Batches
from meshscale.train.exchange import Exchange
from meshscale.train.fp8 import convert_to_fp8
from meshscale.train.parallel.apply import materialize, parallelize, stage_count, stage_ids
from meshscale.train.parallel.mesh import LayoutMesh, layout_mesh
from meshscale.train.recipe import optimizer_factory, resolve
from meshscale.train.step import token_loss
from meshscale.train.timing import Clock
from meshscale.train.trainer import Trainer
from meshscale.train.transformer import Transformer


class LayoutExchange(Exchange):
    """The layout's engines as the step sees them: FSDP2 and tensor parallelism exchange inside forward and
    backward, a pipeline schedule runs both itself; the optimizer then updates this rank's shards."""

    timed_phases = False   # the communication runs inside forward and backward: the profiler splits it (StepProfile)
    sharded = True

    def __init__(self, parts: list[nn.Module], optimizer: torch.optim.Optimizer, clock: Clock,
                 layout: ParallelLayout, mesh: LayoutMesh, schedule: Any, loss_group: Any,
                 after_update: Callable[[nn.Module], None] | None = None):
        super().__init__(parts[0], optimizer, clock)
        self.parts, self.layout, self.mesh, self.schedule, self.loss_group = parts, layout, mesh, schedule, loss_group
        self.after_update = after_update
        self.first_stage = layout.pp == 1 or mesh.coordinate("pp") == 0
        self.last_stage = layout.pp == 1 or stage_count(layout) - 1 in stage_ids(layout, mesh.coordinate("pp"))

    def update(self, scaler: Any = None) -> None:
        """The optimizer step, then what the stages' modules need after it (fp8 tensorwise: the float8
        all-gather's scales, computed once for every weight)."""
        super().update(scaler)
        if self.after_update is not None:
            for part in self.parts:
                self.after_update(part)

    def reduce_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The mean loss over the global batch: the last stage's, averaged over the ranks that hold other tokens
        (tp ranks hold the same value, so their average is the average over data and context ranks). On a group
        of its own, so that the per-dimension communication leaves it out."""
        if self.layout.world_size == 1:
            return loss.detach()
        loss = loss.detach().float().clone()
        dist.all_reduce(loss, group=self.loss_group)
        # the sum over the world: the last stage's losses, each counted once per tp rank; other stages add zero
        return loss / (self.layout.world_size // self.layout.pp)


def build_layout(cfg: TrainConfig, device: torch.device) -> Trainer:
    """Every rank builds the model on the meta device (no memory), parallelizes it as torchtitan does, then
    materializes its own shards with the values a whole-model build from the seed has (`materialize`)."""
    spec, data = resolve(cfg)
    layout = cfg.layout.parallel_layout()
    mesh = layout_mesh(layout, device)
    torch.manual_seed(cfg.seed)   # torch's generators as before (the weights and the data draw from their own)
    with torch.device("meta"):
        model = Transformer(spec.transformer, spec.input_shape[0])
    after_update = convert_to_fp8(model, cfg.speed.fp8_recipe or "tensorwise", cfg.debug.fp8_emulate) \
        if cfg.speed.precision == "fp8" else None
    parts = parallelize(model, mesh, spec.input_shape[0], cfg.layout.checkpointing,
                        bf16=cfg.speed.precision in ("bf16", "fp8"), compile_mode=cfg.speed.compile, device=device)
    del model
    materialize(parts, device, cfg.seed)
    optimizer = optimizer_factory(cfg, spec)([p for part in parts for p in part.parameters()])
    schedule = _schedule(layout, mesh, parts, device) if layout.pp > 1 else None
    batches = Batches(data, cfg.batch_per_rank, mesh.data_rank, layout.data_parallel, cfg.seed, device,
                      positions=parts[0].positions if layout.cp > 1 else None)
    # a group of its own takes torch's default timeout, not the run's: give it --timeout-s
    loss_group = (dist.new_group(timeout=timedelta(seconds=cfg.timeout_s), group_desc="meshscale_loss")
                  if layout.world_size > 1 else None)
    clock = Clock(device)
    exchange = LayoutExchange(parts, optimizer, clock, layout, mesh, schedule, loss_group, after_update)
    # checkpointed: the model, or this rank's stages side by side
    state = parts[0] if len(parts) == 1 else nn.ModuleList(parts)
    return Trainer(cfg, spec, device, state, exchange, batches, clock)


def _schedule(layout: ParallelLayout, mesh: LayoutMesh, parts: list[nn.Module], device):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
    group = mesh["pp"].get_group()
    ids = stage_ids(layout, mesh.coordinate("pp"))
    stages = [PipelineStage(part, s, stage_count(layout), device, group=group) for part, s in zip(parts, ids)]
    if layout.pp_schedule == "interleaved-1f1b":
        return ScheduleInterleaved1F1B(stages, layout.micro_batches, loss_fn=token_loss)
    cls = ScheduleGPipe if layout.pp_schedule == "gpipe" else Schedule1F1B
    return cls(stages[0], layout.micro_batches, loss_fn=token_loss)
