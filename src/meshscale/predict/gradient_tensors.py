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


def transformer_gradients(model, ep: int = 1) -> list[GradientTensor]:
    """A transformer's gradient tensors in parameter order (the embedding, the layers, the final norm, an untied
    head) with their readiness in backward FLOPs, counted by the matrices each pass multiplies by (6N per token;
    attention's own FLOPs left out): backward runs the head first, then the layers from the last down, the
    embedding last; a head tied to the embedding is complete with it, at the end. A mixture of experts' layers
    hold the rank's experts (experts / ``ep``)."""
    from meshscale.predict.training.workload import end_tensor_numels, layer_tensor_numels

    layer = layer_tensor_numels(model, ep)
    head_flops = model.vocab_size * model.d_model   # computed whether tied or not
    layer_flops = float(model.layer_params())
    total = head_flops + model.layers * layer_flops
    ends = end_tensor_numels(model)
    embedding, middle = ends[:1 + (model.style == "gpt2")], ends[1 + (model.style == "gpt2"):]
    head = [middle.pop()] if model.head_params() else []
    out = [GradientTensor(n, 1.0) for n in embedding]
    for i in range(model.layers):   # layer i is complete once the layers above it and it are done
        share = (head_flops + (model.layers - i) * layer_flops) / total
        out += [GradientTensor(n, share) for n in layer]
    out += [GradientTensor(n, head_flops / total) for n in middle + head]
    return out
