"""The gradient tensors of a model (elements each, in parameter order): a framework that all-reduces tensor by
tensor pays one collective's latency per tensor, so their number and sizes matter, not only their sum."""
from __future__ import annotations


def resnet50_tensors(num_classes: int = 1000) -> list[int]:
    """ResNet-50 (He et al. 2016, torchvision's layout): 53 convolutions without bias, a scale and a shift per
    batch norm, the classifier's weight and bias: 161 tensors, 25,557,032 elements for 1000 classes."""
    out = [64 * 3 * 7 * 7, 64, 64]
    inp = 64
    for blocks, width in ((3, 64), (4, 128), (6, 256), (3, 512)):
        for block in range(blocks):
            out += [inp * width, width, width, width * width * 9, width, width, width * 4 * width, 4 * width, 4 * width]
            if block == 0:  # the projection shortcut
                out += [inp * 4 * width, 4 * width, 4 * width]
            inp = 4 * width
    return out + [inp * num_classes, num_classes]


def gradient_tensors(model: str, params: int) -> list[int]:
    """Elements per gradient tensor of ``model``: ResNet-50 from its layout, another registry model from its
    parameters (built on the meta device, no memory), else one tensor of ``params``."""
    if model == "resnet50":
        return resnet50_tensors()
    try:
        import torch

        from meshscale.train.models import get_model
        with torch.device("meta"):
            sizes = [p.numel() for p in get_model(model).build().parameters() if p.requires_grad]
        return sizes or [params]
    except Exception:  # a model that cannot be built here (a missing package): its size is still known
        return [params]
