"""A small CNN that trains in seconds on a CPU and accepts any image size (8x8 digits, 32x32, 224x224).

No batch norm on purpose: per-sample layers make N ranks on B/N samples compute exactly what 1 rank computes
on B samples, which the equivalence tests rely on."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.nn as nn

WIDTHS = (32, 64, 64)


def small_cnn(in_channels: int = 3, num_classes: int = 10) -> nn.Module:
    """conv-relu x2, 2x2 max-pool, conv-relu, global average pool, linear."""
    import torch.nn as nn  # here: the registry reads this module's sizes without torch
    a, b, c = WIDTHS
    return nn.Sequential(
        nn.Conv2d(in_channels, a, 3, padding=1), nn.ReLU(),
        nn.Conv2d(a, b, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(b, c, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_classes))


def small_cnn_params(in_channels: int = 3, num_classes: int = 10) -> int:
    """Number of parameters of `small_cnn` (weights and biases)."""
    a, b, c = WIDTHS
    return (in_channels * a * 9 + a) + (a * b * 9 + b) + (b * c * 9 + c) + (c * num_classes + num_classes)


def small_cnn_flops(in_channels: int, height: int, width: int, num_classes: int = 10) -> float:
    """Forward + backward FLOPs per sample: 3 x (2 x multiply-accumulates of the convolutions and the head)."""
    a, b, c = WIDTHS
    hw, hw2 = height * width, (height // 2) * (width // 2)
    macs = hw * a * in_channels * 9 + hw * b * a * 9 + hw2 * c * b * 9 + c * num_classes
    return 3.0 * 2.0 * macs
