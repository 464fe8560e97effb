"""The step model's kernels against the real thing: one training step of the very GPT `meshscale train` builds
(train/gpt.py), traced op by op with a TorchDispatchMode on small CPU tensors; FLOPs and bytes read + written per
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
from meshscale.train.gpt import GPT, GPTConfig  # noqa: E402

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
    model = GPT(GPTConfig(LAYERS, HEADS, D, VOCAB, SEQ))
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


def _analytic(params: int, optimizer: bool = True):
    cfg = config_from_fields("traced", {"layers": LAYERS, "d_model": D, "heads": HEADS, "ffn_dim": 4 * D,
                                        "vocab_size": VOCAB, "max_seq_len": SEQ, "style": "gpt2"}, "test")
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
