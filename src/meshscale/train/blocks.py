"""The kernels around a transformer block's matrix products and attention, measured as the engines generate
them (`meshscale bench kernels` writes them in the atlas, ``blocks``).

A fused element-wise chain's cost is not its bytes at the copy's rate: what torch.compile's generated kernels
reach depends on the layouts around them (rotary's pairs, the heads' transposes before attention, grouped-query
expansion, float8's scale reductions), which no isolated op shows. So one Llama block (train's own: RMSNorm,
q/k/v/o, rotary, causal SDPA, SwiGLU, residuals) runs forward and backward, eager and compiled, in bf16 and with
torchao's float8 linears, with each rotary formulation the step model names: ``pairs`` (meshscale's engine,
train/transformer.apply_rotary, grouped-query heads by repeat_interleave) and ``complex`` (torchtitan's Llama 3:
one complex product with the table, grouped-query heads by expand and reshape). torch.profiler times every GPU
kernel; what is not a matrix product or attention is the block's element-wise time, which the step model holds
against the bytes it counts for the same block (`predict.training.step.compiled_block_bytes`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from meshscale.models.atlas import BlockPoint

# (d_model, heads, kv_heads, ffn_dim, batch, seq): llama3-8b's layer (grouped-query, 4 query heads per key/value
# head), llama2-7b's (multi-head), llama-1b's (grouped-query, narrow) and llama3-70b's (grouped-query 8:1, wide)
BLOCK_SHAPES = ((4096, 32, 8, 14336, 1, 8192), (4096, 32, 32, 11008, 2, 4096), (2048, 32, 8, 8192, 2, 8192),
                (8192, 64, 8, 28672, 1, 4096))
STYLES = ("pairs", "complex")
ATTENTION_MARKS = ("flash", "fmha", "sdpa", "cudnn", "attention")
MATMUL_MARKS = ("gemm", "nvjet", "cutlass", "xmma", "cublas", "splitk")


def kernel_class(name: str) -> str:
    """matmul | attention | elementwise, by a GPU kernel's name: inductor's generated kernels (``triton_...``) are
    element-wise whatever ops they fused (their names list them, ``_scaled_mm`` included); cuDNN's attention
    kernels and helpers, FlashAttention's and SDPA's are attention; cuBLAS's (nvjet, sm90 xmma, split-K) and
    CUTLASS's are matrix products."""
    low = name.lower()
    if low.startswith("triton"):
        return "elementwise"
    if any(m in low for m in ATTENTION_MARKS):
        return "attention"
    if any(m in low for m in MATMUL_MARKS):
        return "matmul"
    return "elementwise"


def complex_attention_forward(self, x, cos, sin, positions):
    """torchtitan's Llama 3 attention (models/llama3/model.py: apply_rotary_emb, repeat_kv), on train's
    projections: rotary as one complex product with the table, grouped-query heads expanded and reshaped
    (the forward of `complex_attention`'s class)."""
    import torch
    import torch.nn.functional as F

    b, s, _ = x.shape
    q = self.wq(x).view(b, s, -1, self.head_dim)
    k = self.wk(x).view(b, s, -1, self.head_dim)
    v = self.wv(x).view(b, s, -1, self.head_dim)
    table = torch.complex(cos, sin)[None, :, None, :]

    def rotate(t):
        turned = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2)) * table
        return torch.view_as_real(turned).flatten(3).type_as(t)

    q, k = rotate(q), rotate(k)
    rep = q.shape[2] // k.shape[2]
    if rep > 1:
        k, v = (t[:, :, :, None, :].expand(b, s, t.shape[2], rep, self.head_dim).reshape(b, s, -1, self.head_dim)
                for t in (k, v))
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return self.wo(y.transpose(1, 2).reshape(b, s, -1))


def complex_attention(attention) -> None:
    """Turn train's Attention into torchtitan's formulation (`complex_attention_forward`), same weights."""
    attention.__class__ = type("ComplexAttention", (type(attention),), {"forward": complex_attention_forward})


@dataclass
class _Case:
    style: str
    precision: str
    compiled: bool
    shape: tuple[int, ...]


def _block(case: _Case, device):
    """Train's block at ``case``'s shape in bf16 (the complex style's attention swapped in), its inputs, and one
    forward and backward."""
    import torch

    from meshscale.models.transformer import TransformerConfig
    from meshscale.train.transformer import Block, rotary_tables

    d, heads, kv, ffn, batch, seq = case.shape
    cfg = TransformerConfig("atlas block", 1, d, heads, kv, ffn, 32000, seq, rope_theta=500000.0)
    block = Block(cfg).to(device=device, dtype=torch.bfloat16)
    if case.style == "complex":
        complex_attention(block.attention)
    if case.precision == "fp8-tensorwise":
        from meshscale.train.fp8 import convert_to_fp8
        convert_to_fp8(block, "tensorwise")
    run = torch.compile(block) if case.compiled else block
    cos, sin = (t.to(device) for t in rotary_tables(cfg, seq))
    positions = torch.arange(seq, device=device)
    x = torch.randn(batch, seq, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn_like(x)

    def step(_: int = 0) -> None:
        run(x, cos, sin, positions).backward(grad)
    return step


def measure_block(case: _Case, device, steps: int = 3) -> BlockPoint:
    """One case's kernel seconds per forward and backward, by class, from ``steps`` traced steps after warm-up."""
    import torch

    from meshscale.train.kernel_categories import trace

    step = _block(case, device)
    for _ in range(3):
        step()
    torch.cuda.synchronize(device)
    seconds = {"matmul": 0.0, "attention": 0.0, "elementwise": 0.0}
    kernels = 0
    for e in trace(step, 0, steps, device, detailed=False):
        if e.get("cat") != "kernel":
            continue
        cls = kernel_class(str(e.get("name", "")))
        seconds[cls] += float(e["dur"]) * 1e-6 / steps
        kernels += cls == "elementwise"
    d, heads, kv, ffn, batch, seq = case.shape
    return BlockPoint(case.style, case.precision, case.compiled, d, heads, kv, ffn, batch, seq,
                      seconds["elementwise"], kernels // steps, seconds["matmul"], seconds["attention"])


def measure_blocks(device, progress: Callable[[str], None] = lambda _: None) -> list[BlockPoint]:
    """Every shape x rotary style x (eager, compiled) in bf16, and compiled with torchao's float8 linears where
    torchao is installed and the GPU has fp8 tensor cores."""
    import torch

    precisions = ["bf16"]
    try:
        import torchao.float8  # noqa: F401
        if torch.cuda.get_device_capability(device) >= (8, 9):
            precisions.append("fp8-tensorwise")
    except ImportError:
        progress("blocks: torchao not installed, no float8 blocks")
    out = []
    for shape in BLOCK_SHAPES:
        for style in STYLES:
            for precision in precisions:
                for compiled in ((False, True) if precision == "bf16" else (True,)):
                    out.append(measure_block(_Case(style, precision, compiled, shape), device))
                    torch._dynamo.reset()
                    torch.cuda.empty_cache()
    return out
