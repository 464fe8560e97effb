"""What one rank trains with: the model (adapted to the data), the data's batches, the optimizer and its
learning-rate recipe, the gradient exchange around the model, and the precision and capture settings."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.nn as nn

from meshscale.errors import MeshscaleError
from meshscale.train.config import TrainConfig
from meshscale.train.data import Batches, Dataset, open_data
from meshscale.train.exchange import Exchange, make_exchange
from meshscale.train.graphed import EAGER_STEPS, GraphedStep, tensor_lr
from meshscale.models.registry import ModelSpec, get_model, image_spec
from meshscale.train.builders import build_model
from meshscale.train.step import train_step
from meshscale.train.timing import Clock


def resolve(cfg: TrainConfig) -> tuple[ModelSpec, Dataset]:
    """The model (adapted to the data's image shape and classes) and the training data."""
    spec = get_model(cfg.model, cfg.layout.seq_len)
    shape = spec.input_shape
    if cfg.image_size and spec.input_kind == "image":
        shape = (shape[0], cfg.image_size, cfg.image_size)
    data = open_data(cfg.data, spec.input_kind, shape, spec.num_classes)
    if spec.input_kind == "image" and (data.sample_shape != spec.input_shape or data.num_classes != spec.num_classes):
        spec = image_spec(spec, *data.sample_shape, data.num_classes)
    return spec, data


def optimizer_factory(cfg: TrainConfig, spec: ModelSpec, graph_device: torch.device | None = None):
    """A function params -> optimizer (the PS owners build theirs over their shard). With ``graph_device``
    the optimizer can be captured in a CUDA graph: learning rate in device memory, fused SGD / capturable AdamW."""
    opt = cfg.optimizer
    name = opt.name or spec.optimizer
    lr = tensor_lr(graph_device) if graph_device is not None else 0.0
    graph = {} if graph_device is None else {"fused": True} if name == "sgd" else {"capturable": True}
    if name == "sgd":
        return lambda params: torch.optim.SGD(params, lr=lr, momentum=opt.momentum, weight_decay=opt.weight_decay, **graph)
    if name == "adamw":
        return lambda params: torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=opt.weight_decay, **graph)
    raise MeshscaleError(f"unknown optimizer {name!r}; choose sgd or adamw")


def learning_rate(cfg: TrainConfig, spec: ModelSpec, step: int) -> float:
    """Linear scaling with the global batch and a linear warm-up (Goyal et al. 2017)."""
    opt = cfg.optimizer
    default = spec.base_lr if (opt.name or spec.optimizer) == spec.optimizer else (0.1 if opt.name == "sgd" else 3e-4)
    base = opt.base_lr if opt.base_lr is not None else default
    lr = base * cfg.global_batch / opt.ref_batch
    if opt.warmup_steps:
        lr *= min(1.0, (step + 1) / opt.warmup_steps)
    return lr


@dataclass
class Trainer:
    """Everything a rank's steps use. ``compiled`` is ``model`` after torch.compile (or ``model`` itself);
    ``exchange.model`` wraps it. ``graphed`` is set when the whole step is replayed from a CUDA graph."""

    cfg: TrainConfig
    spec: ModelSpec
    device: torch.device
    model: nn.Module
    compiled: nn.Module
    exchange: Exchange
    batches: Batches
    clock: Clock
    scaler: torch.amp.GradScaler | None
    autocast: Callable[[], contextlib.AbstractContextManager]
    graphed: GraphedStep | None = None


def build(cfg: TrainConfig, device: torch.device, rank: int, world: int) -> Trainer:
    """Identical initial weights on every rank, wrapped in the exchange of ``cfg.mode``."""
    _set_kernel_choice(cfg, device)
    spec, data = resolve(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(spec).to(device)
    if cfg.speed.channels_last and spec.input_kind == "image":
        model = model.to(memory_format=torch.channels_last)
    graph_mode = cfg.speed.cuda_graph and device.type == "cuda"
    # compile the bare model, then wrap it: the exchanges' hooks see ordinary parameters and checkpoints keep the
    # model's own keys. (DDP + compile scales poorly either way on 2 H200, 1.00-1.10x; allreduce + compile 1.64x.)
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
    trainer = Trainer(cfg, spec, device, model, compiled, exchange,
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
