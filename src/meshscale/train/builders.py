"""The module of a registry model (`models/registry.py`), built by its family: torchvision's ResNets, the small
CNN, the one transformer (`train/transformer.py`, Llama or GPT-2 style)."""
from __future__ import annotations

from typing import Callable

import torch.nn as nn

from meshscale.errors import MeshscaleError
from meshscale.models.registry import CNN_WIDTHS, ModelSpec


def _resnet(spec: ModelSpec) -> nn.Module:
    try:
        import torchvision
    except Exception as exc:  # on a CPU-only torch the CUDA torchvision fails at import (operator nms)
        raise MeshscaleError(f"model {spec.name} needs a working torchvision ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:120]}); install the torchvision matching your torch, "
                             "or use small-cnn / gpt-tiny") from None
    if spec.input_shape[0] != 3:
        raise MeshscaleError(f"model {spec.name} takes 3-channel images, got {spec.input_shape[0]}; use small-cnn")
    return getattr(torchvision.models, spec.name)(num_classes=spec.num_classes)


def _small_cnn(spec: ModelSpec) -> nn.Module:
    """conv-relu x2, 2x2 max-pool, conv-relu, global average pool, linear: any image size. No batch norm on
    purpose: per-sample layers make N ranks on B/N samples compute exactly what 1 rank computes on B samples,
    which the equivalence tests rely on."""
    a, b, c = CNN_WIDTHS
    return nn.Sequential(
        nn.Conv2d(spec.input_shape[0], a, 3, padding=1), nn.ReLU(),
        nn.Conv2d(a, b, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(b, c, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, spec.num_classes))


def _transformer(spec: ModelSpec) -> nn.Module:
    from meshscale.train.transformer import Transformer
    return Transformer(spec.transformer, spec.input_shape[0])


BUILDERS: dict[str, Callable[[ModelSpec], nn.Module]] = {
    "resnet": _resnet, "cnn": _small_cnn, "transformer": _transformer}


def build_model(spec: ModelSpec) -> nn.Module:
    """A freshly initialised module of ``spec`` (the caller seeds torch for reproducible weights)."""
    return BUILDERS[spec.family](spec)
