"""The shapes of train's image models, as torchvision and train/builders.py build them: a ResNet's stem and
residual blocks, the small CNN's three convolutions; their parameter tensors in order and their sizes. The
registry's parameter and FLOP counts and the step model's kernels both read them here."""
from __future__ import annotations

from dataclasses import dataclass

CNN_WIDTHS = (32, 64, 64)   # the small CNN's three convolutions
RESNET_BLOCKS = {18: ("basic", (2, 2, 2, 2)), 34: ("basic", (3, 4, 6, 3)), 50: ("bottleneck", (3, 4, 6, 3)),
                 101: ("bottleneck", (3, 4, 23, 3)), 152: ("bottleneck", (3, 8, 36, 3))}


@dataclass(frozen=True)
class Conv:
    c_in: int
    c_out: int
    kernel: int
    stride: int
    out_hw: int     # output height (= width)


def resnet_blocks(depth: int, image: int = 224) -> tuple[list[list[Conv]], int]:
    """A torchvision ResNet at ``image`` pixels as its stem and residual blocks (each a list of convolutions,
    the projection shortcut last where there is one), and the channels into the classifier."""
    if depth not in RESNET_BLOCKS:
        raise ValueError(depth)
    style, counts = RESNET_BLOCKS[depth]
    hw = image // 2
    blocks = [[Conv(3, 64, 7, 2, hw)]]
    hw //= 2                              # max pool
    c_in, expansion = 64, 4 if style == "bottleneck" else 1
    for stage, count in enumerate(counts):
        width = 64 * 2 ** stage
        for b in range(count):
            stride = 2 if stage > 0 and b == 0 else 1
            out = hw // stride
            if style == "bottleneck":
                block = [Conv(c_in, width, 1, 1, hw), Conv(width, width, 3, stride, out),
                         Conv(width, width * expansion, 1, 1, out)]
            else:
                block = [Conv(c_in, width, 3, stride, out), Conv(width, width, 3, 1, out)]
            if b == 0 and (stride != 1 or c_in != width * expansion):
                block.append(Conv(c_in, width * expansion, 1, stride, out))    # the projection shortcut
            blocks.append(block)
            c_in, hw = width * expansion, out
    return blocks, c_in


def resnet_tensor_numels(depth: int, classes: int = 1000) -> list[int]:
    """The sizes of the parameter tensors in torchvision's order: each convolution's weight, its batch norm's
    weight and bias, the classifier's weight and bias."""
    blocks, features = resnet_blocks(depth)
    numels = [n for block in blocks for c in block for n in (c.c_in * c.c_out * c.kernel ** 2, c.c_out, c.c_out)]
    return numels + [features * classes, classes]


def resnet_tensors(depth: int) -> int:
    """Parameter tensors: each convolution's weight, each batch norm's weight and bias, the classifier's two."""
    return len(resnet_tensor_numels(depth))


def resnet_params(depth: int, classes: int = 1000) -> int:
    """Parameters: convolution weights, two per batch-norm channel, the classifier (torchvision's count)."""
    blocks, features = resnet_blocks(depth)
    return (sum(c.c_in * c.c_out * c.kernel ** 2 + 2 * c.c_out for block in blocks for c in block)
            + features * classes + classes)


def resnet_macs(depth: int, image: int = 224, classes: int = 1000) -> float:
    """Forward multiply-adds per image: every convolution over its output pixels, the classifier."""
    blocks, features = resnet_blocks(depth, image)
    return float(sum(c.c_in * c.c_out * c.kernel ** 2 * c.out_hw ** 2 for block in blocks for c in block)
                 + features * classes)


SMALL_CNN_IMAGE, SMALL_CNN_CLASSES = 32, 10


def small_cnn_layers(image: int = SMALL_CNN_IMAGE, channels: int = 3) -> list[tuple[int, int, int]]:
    """The small CNN's 3x3 convolutions (padding 1): (input channels, output channels, output side)."""
    a, b, c = CNN_WIDTHS
    return [(channels, a, image), (a, b, image), (b, c, image // 2)]


def small_cnn_tensor_numels(classes: int = SMALL_CNN_CLASSES, channels: int = 3) -> list[int]:
    """Its parameter tensors in order: each convolution's weight and bias, the linear's weight and bias."""
    numels = [n for c_in, c_out, _ in small_cnn_layers(channels=channels) for n in (c_in * c_out * 9, c_out)]
    return numels + [CNN_WIDTHS[-1] * classes, classes]
