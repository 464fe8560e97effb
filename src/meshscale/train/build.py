"""Building a rank's `Trainer` (train/trainer.py): for a data-parallel mode, the model (adapted to the data), the
data's batches, the optimizer and the gradient exchange around the model, with the precision and capture
settings; for a transformer, the parallel layout's (train/parallel/engine.py)."""
from __future__ import annotations

import contextlib
import os
from functools import partial
from typing import Callable

import torch

from meshscale.train.builders import build_model
from meshscale.train.config import TrainConfig
from meshscale.train.data import Batches
from meshscale.train.exchange import make_exchange
from meshscale.train.graphed import EAGER_STEPS, GraphedStep
from meshscale.train.parallel.engine import build_layout
from meshscale.train.recipe import optimizer_factory, resolve
from meshscale.train.step import train_step
from meshscale.train.timing import Clock
from meshscale.train.trainer import Trainer


def _compile_in_process() -> None:
    """CPU workers compile in their own process: inductor's default starts a pool of compile workers, one per core,
    in every rank, on the cores the ranks already share (2 ranks on 2 cores: 4 pools' start-up besides the
    compiling). A TORCHINDUCTOR_COMPILE_THREADS the user set stands."""
    import os

    import torch._inductor.config as inductor
    if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
        inductor.compile_threads = 1


def build(cfg: TrainConfig, device: torch.device, rank: int, world: int) -> Trainer:
    """This rank's trainer: a transformer preset under its parallel layout, any other model data-parallel in
    ``cfg.mode``. Identical initial weights on every rank."""
    _set_kernel_choice(cfg, device)
    if cfg.is_transformer:
        return build_layout(cfg, device)
    spec, data = resolve(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(spec).to(device)
    if cfg.speed.channels_last and spec.input_kind == "image":
        model = model.to(memory_format=torch.channels_last)
    graph_mode = cfg.speed.cuda_graph and device.type == "cuda"
    # compile the bare model, then wrap it: the exchanges' hooks see ordinary parameters and checkpoints keep the
    # model's own keys. (DDP + compile scales poorly either way on 2 H200, 1.00-1.10x; allreduce + compile 1.64x.)
    if cfg.speed.compile and device.type == "cpu":
        _compile_in_process()
    compiled = torch.compile(model, mode=None if cfg.speed.compile == "default" else cfg.speed.compile) \
        if cfg.speed.compile else model
    clock = Clock(device)
    # whole-step capture wants the exchange (DDP) built on a side stream (torch.cuda.graphs docs)
    side = torch.cuda.Stream(device) if graph_mode else None
    if side is not None:
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        # a captured step records no timing events inside it: the exchange then gets a host clock and no timing hook
        exchange = make_exchange(cfg.mode, compiled, optimizer_factory(cfg, spec, device if graph_mode else None),
                                 Clock(torch.device("cpu")) if graph_mode else clock, rank, world, device,
                                 ddp=cfg.ddp, allreduce=cfg.allreduce, ps=cfg.ps, timing=cfg.timing and not graph_mode)
    if side is not None:
        torch.cuda.current_stream().wait_stream(side)
    trainer = Trainer(cfg, spec, device, model, exchange,
                      # servers fetch (and ignore) a worker's batches: every rank walks the same steps
                      Batches(data, cfg.batch_per_rank, rank % cfg.workers, cfg.workers, cfg.seed, device,
                              cfg.speed.channels_last),
                      clock, torch.amp.GradScaler(device.type) if cfg.speed.precision == "fp16" else None,
                      _autocast(cfg, device, graph_mode))
    if graph_mode:
        trainer.graphed = GraphedStep(partial(train_step, trainer), EAGER_STEPS[cfg.mode], side)
    return trainer


def _set_kernel_choice(cfg: TrainConfig, device: torch.device) -> None:
    """Deterministic kernels (exact resume), else let cuDNN pick the fastest."""
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    elif device.type == "cuda":
        torch.backends.cudnn.benchmark = True


def _autocast(cfg: TrainConfig, device: torch.device, graph_mode: bool) -> Callable[[], contextlib.AbstractContextManager]:
    """The forward's precision context; capture needs autocast without its weight-cast cache (torch.cuda.graphs docs)."""
    if cfg.speed.precision not in ("bf16", "fp16"):
        return contextlib.nullcontext
    dtype = torch.bfloat16 if cfg.speed.precision == "bf16" else torch.float16
    return partial(torch.autocast, device.type, dtype=dtype, cache_enabled=not graph_mode)
