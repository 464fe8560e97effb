"""The gradient tensors of a model, in parameter order: their sizes (a framework that all-reduces tensor by tensor
pays one collective's latency per tensor, so their number and sizes matter, not only their sum) and when backward
completes each of them (an overlapping framework can start a bucket only when all its gradients are complete).

When a gradient is complete is counted in backward FLOPs: the share of the backward pass's FLOPs done when the
tensor's gradient is accumulated, i.e. the backward of every layer from the output down to the tensor's own.
A tensor used twice (a tied embedding and output head) is complete only after its last use's backward, at the
very end when the embedding comes first in the forward pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class GradientTensor:
    """One parameter's gradient: ``elements`` values, complete when ``ready_share`` of backward's FLOPs are done
    (None: not known; the model's structure is unknown and readiness falls back to its share of the bytes)."""

    elements: int
    ready_share: float | None = None


def _resnet50_layers(num_classes: int) -> list[tuple[list[int], float, bool]]:
    """ResNet-50's layers in forward order (torchvision's layout, 224 x 224): (their parameter tensors' elements,
    forward multiply-adds, whether backward computes the layer's input gradient)."""
    layers = [([64 * 3 * 7 * 7], 64 * 3 * 7 * 7 * 112 * 112, False), ([64, 64], 0, True)]  # the image needs no gradient
    inp, side = 64, 56
    for blocks, width, stride in ((3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)):
        for block in range(blocks):
            out_side = side // stride if block == 0 else side
            for weight, pixels, channels in ((inp * width, side * side, width),
                                             (width * width * 9, out_side * out_side, width),
                                             (width * 4 * width, out_side * out_side, 4 * width)):
                layers += [([weight], weight * pixels, True), ([channels] * 2, 0, True)]  # the conv, its norm
            if block == 0:  # the projection shortcut, computed after the main path
                layers += [([inp * 4 * width], inp * 4 * width * out_side * out_side, True), ([4 * width] * 2, 0, True)]
            inp, side = 4 * width, out_side
    return layers + [([inp * num_classes, num_classes], inp * num_classes, True)]


def resnet50_tensors(num_classes: int = 1000) -> list[int]:
    """ResNet-50 (He et al. 2016, torchvision's layout): 53 convolutions without bias, a scale and a shift per
    batch norm, the classifier's weight and bias: 161 tensors, 25,557,032 elements for 1000 classes."""
    return [n for tensors, _, _ in _resnet50_layers(num_classes) for n in tensors]


def resnet50_gradients(num_classes: int = 1000) -> list[GradientTensor]:
    """ResNet-50's gradient tensors with their readiness: backward runs the layers in reverse forward order (the
    projection shortcut, computed last in its block, first); a convolution's or the classifier's backward is
    twice its forward (input and weight gradients; only the weight gradient for the first convolution), a batch
    norm's costs no matmul FLOPs."""
    layers = _resnet50_layers(num_classes)
    backward_flops = [2 * macs * (2 if needs_input else 1) for _, macs, needs_input in layers]
    total, done, ready = sum(backward_flops), 0.0, []
    for (tensors, _, _), flops in zip(reversed(layers), reversed(backward_flops)):
        done += flops
        ready.append([GradientTensor(n, done / total) for n in tensors])
    return [t for layer in reversed(ready) for t in layer]


@lru_cache(maxsize=16)
def traced_gradients(model: str) -> tuple[GradientTensor, ...]:
    """A registry model's gradient tensors and their readiness, traced: the model built on the meta device (no
    memory, no compute) runs forward and backward on one sample under torch's FLOP counter, and each parameter's
    post-accumulate hook records the backward FLOPs counted when its gradient is complete."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from meshscale.models.registry import get_model
    from meshscale.train.builders import build_model
    spec = get_model(model)
    with torch.device("meta"):
        module = build_model(spec)
        sample = torch.zeros((1, *spec.input_shape), dtype=torch.long if spec.input_kind == "tokens" else torch.float)
    params = [p for p in module.parameters() if p.requires_grad]
    counter = FlopCounterMode(display=False)
    done_flops: dict[int, int] = {}
    for p in params:
        p.register_post_accumulate_grad_hook(lambda p: done_flops.__setitem__(id(p), counter.get_total_flops()))
    with counter:
        out = module(sample)
        forward_flops = counter.get_total_flops()
        out.float().sum().backward()
    backward_flops = counter.get_total_flops() - forward_flops
    if backward_flops <= 0 or len(done_flops) != len(params):
        raise ValueError(f"{model}: backward FLOPs could not be traced")
    return tuple(GradientTensor(p.numel(), (done_flops[id(p)] - forward_flops) / backward_flops) for p in params)


def gradient_tensors(model: str, params: int) -> list[GradientTensor]:
    """The gradient tensors of ``model``: ResNet-50 from its layout, another registry model traced on the meta
    device, else (a model that cannot be built here, e.g. a missing package) one tensor of ``params`` whose
    readiness is not known."""
    if model == "resnet50":
        return resnet50_gradients()
    try:
        return list(traced_gradients(model)) or [GradientTensor(params)]
    except Exception:  # its size is still known
        return [GradientTensor(params)]
