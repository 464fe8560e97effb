"""What a run trains on and how it learns, before any module exists: the model (adapted to the data), the data,
the optimizer and the learning-rate recipe. Shared by the data-parallel modes and the layouts."""
from __future__ import annotations

import torch

from meshscale.errors import MeshscaleError
from meshscale.models.registry import ModelSpec, get_model, image_spec
from meshscale.train.config import TrainConfig
from meshscale.train.data import Dataset, open_data
from meshscale.train.graphed import tensor_lr


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
