"""The step model's kernels against the real thing: one training step of the very GPT `meshscale train` builds
(train/transformer.py, GPT-2 style), traced op by op with a TorchDispatchMode on small CPU tensors; FLOPs and bytes read + written per
aten op summed and compared with what predict/training/workload.py counts from the configuration alone."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from meshscale.models.transformer import config_from_fields  # noqa: E402
from meshscale.predict.training.workload import (optimizer_kernels, transformer_ends,  # noqa: E402
                                                 transformer_layer)
from meshscale.train.transformer import Transformer  # noqa: E402

LAYERS, HEADS, D, VOCAB, SEQ, BATCH = 2, 4, 64, 512, 64, 4
GEMMS = {"mm", "addmm", "bmm", "baddbmm"}


class Traffic(TorchDispatchMode):
    """Bytes read and written by each aten op that launches a kernel (views move nothing), and their count."""

    def __init__(self):
        super().__init__()
        self.bytes = {}
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "is_view", False) or func.__name__.split(".")[0] in ("detach", "t", "view", "_unsafe_view"):
            return out
        self.ops += 1
        seen, total = set(), 0
        for t in tree_flatten((args, kwargs or {}, out))[0]:
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
        name = func.__name__.split(".")[0]
        self.bytes[name] = self.bytes.get(name, 0) + total
        return out


def _traced_step(optimizer: bool = True):
    torch.manual_seed(0)
    model = Transformer(_config(), SEQ)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    x = torch.randint(0, VOCAB, (BATCH, SEQ))
    y = torch.randint(0, VOCAB, (BATCH, SEQ))
    traffic, flops = Traffic(), FlopCounterMode(display=False)
    with traffic, flops:
        loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())   # train/step.py's loss
        loss.backward()
        if optimizer:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return traffic, flops.get_total_flops(), sum(p.numel() for p in model.parameters())


def _config():
    return config_from_fields("traced", {"layers": LAYERS, "d_model": D, "heads": HEADS, "ffn_dim": 4 * D,
                                         "vocab_size": VOCAB, "max_seq_len": SEQ, "style": "gpt2"}, "test")


def _analytic(params: int, optimizer: bool = True):
    cfg = _config()
    tokens = BATCH * SEQ
    layer = transformer_layer(cfg, tokens, SEQ, precision="fp32")
    ends = transformer_ends(cfg, tokens, precision="fp32")
    kernels = [*layer.forward, *layer.backward] * LAYERS + [*ends.forward, *ends.backward]
    return cfg, kernels + (optimizer_kernels(params, "adamw") if optimizer else [])


def test_gemm_flops_match_the_traced_step_exactly():
    traffic, traced_flops, params = _traced_step()
    cfg, kernels = _analytic(params)
    assert params == cfg.params()
    analytic = sum(k.flops * k.count for k in kernels if k.kind == "matmul")
    # the CPU attention kernel is one aten op the FLOP counter does not decompose: the traced FLOPs are the GEMMs'
    assert traced_flops == pytest.approx(analytic, rel=1e-6)


def test_bytes_moved_match_the_traced_step_within_fifteen_percent():
    traffic, _, params = _traced_step()
    _, kernels = _analytic(params)
    analytic = sum(k.bytes * k.count for k in kernels)
    traced = sum(traffic.bytes.values())
    # a traced op counts each operand once, as the model does; they part where CPU kernels differ from CUDA's
    # (no fused attention backward, separate bias additions)
    assert analytic == pytest.approx(traced, rel=0.15), sorted(traffic.bytes.items(), key=lambda kv: -kv[1])[:12]


def test_kernel_launching_ops_of_forward_and_backward_match_the_traced_step():
    # the optimizer is left out: on CPU its foreach ops run per tensor, on CUDA as a few multi-tensor launches
    traffic, _, params = _traced_step(optimizer=False)
    _, kernels = _analytic(params, optimizer=False)
    assert sum(k.ops * k.count for k in kernels) == pytest.approx(traffic.ops, rel=0.15)


# ---- a ResNet-50 built by hand (torchvision's v1.5 bottlenecks; torchvision itself is not importable here) --------
def _resnet50(classes: int):
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, c_in, width, stride):
            super().__init__()
            out = width * 4
            self.conv1, self.bn1 = nn.Conv2d(c_in, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out)
            self.relu = nn.ReLU(inplace=True)
            self.down = None
            if stride != 1 or c_in != out:
                self.down = nn.Sequential(nn.Conv2d(c_in, out, 1, stride, bias=False), nn.BatchNorm2d(out))

        def forward(self, x):
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            y += x if self.down is None else self.down(x)
            return self.relu(y)

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    c_in = 64
    for stage, count in enumerate((3, 4, 6, 3)):
        for b in range(count):
            layers.append(Bottleneck(c_in, 64 * 2 ** stage, 2 if stage > 0 and b == 0 else 1))
            c_in = 64 * 2 ** stage * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, classes)]
    return nn.Sequential(*layers)


def test_resnet50_convolution_flops_bytes_and_ops_match_a_traced_step():
    from meshscale.models.images import resnet_params, resnet_tensors
    from meshscale.predict.training.workload import resnet_step

    image, batch, classes = 64, 2, 10
    torch.manual_seed(0)
    model = _resnet50(classes)
    assert sum(p.numel() for p in model.parameters()) == resnet_params(50, classes)
    assert len(list(model.parameters())) == resnet_tensors(50)      # what DDP copies into its buckets and back
    x, y = torch.randn(batch, 3, image, image), torch.randint(0, classes, (batch,))
    traffic, flops = Traffic(), FlopCounterMode(display=False)
    with traffic, flops:
        F.cross_entropy(model(x).float(), y).backward()
    kernels = resnet_step(50, batch, image=image, classes=classes, precision="fp32", autocast=False)
    analytic = sum(k.flops * k.count for k in kernels.forward + kernels.backward)
    assert flops.get_total_flops() == pytest.approx(analytic, rel=1e-6)
    # CPU batch norm and pooling kernels pass over their tensors differently from cuDNN's
    analytic_bytes = sum(k.bytes * k.count for k in kernels.forward + kernels.backward)
    assert analytic_bytes == pytest.approx(sum(traffic.bytes.values()), rel=0.15), \
        sorted(traffic.bytes.items(), key=lambda kv: -kv[1])[:12]
    assert sum(k.ops * k.count for k in kernels.forward + kernels.backward) == pytest.approx(traffic.ops, rel=0.15)


@pytest.mark.parametrize("dtype,e", [(torch.bfloat16, 2), (torch.float32, 4)])
def test_rotary_as_the_engine_computes_it_moves_the_bytes_the_model_counts(dtype, e):
    # train/transformer.apply_rotary on q-shaped activations, forward and backward, traced op by op
    from meshscale.models.transformer import preset
    from meshscale.predict.training.workload import rotary_op
    from meshscale.train.transformer import apply_rotary, rotary_tables

    cfg = preset("llama-tiny")
    cos, sin = rotary_tables(cfg, SEQ)
    q = torch.randn(BATCH, SEQ, cfg.heads, cfg.head_dim, dtype=dtype, requires_grad=True)
    elements = q.numel()
    traffic = Traffic()
    with traffic:
        out = apply_rotary(q, cos, sin)
        grad = torch.ones_like(out)
    forward = sum(traffic.bytes.values()) - 2 * elements * e          # less the ones_like of the gradient
    with Traffic() as backward:
        out.backward(grad)
    model = rotary_op("pairs", e, elements)
    tables = 2 * cos.numel() * 4 * 4                                 # cos and sin read by each of 4 products
    assert forward - tables == pytest.approx(model.bytes, rel=0.15)
    assert sum(backward.bytes.values()) == pytest.approx(model.backward_bytes, rel=0.15)
