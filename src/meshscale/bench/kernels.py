"""`meshscale bench kernels`: measure the kernel atlas (`meshscale.models.atlas`) on this GPU: the matrix
products, attention, memory-bound kernels and host costs the step model prices. Each figure is the median of
repeated, synchronized runs after warm-up, timed with CUDA events (GPU time) or the host's clock (host time)."""
from __future__ import annotations

import datetime
import statistics
import time
from typing import Callable

from meshscale.models.atlas import AttentionPoint, GemmPoint, KernelAtlas

# the grid of matrix products: M (tokens of a micro-batch on a rank), N and K (model widths over tp)
GEMM_M = (512, 2048, 8192, 32768)
GEMM_NK = (256, 1024, 4096, 16384)
GEMM_FP32_M, GEMM_FP32_NK = (2048, 8192), (1024, 4096)   # true fp32 and TF32: far slower, a smaller grid
MAX_GEMM_FLOPS = 2 * 32768 * 16384 * 8192                # skip the largest corner (seconds each in fp32)
ATTENTION_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
ATTENTION_HEAD_DIMS = (64, 128)
ATTENTION_KV_RATIOS = (1, 4)
ATTENTION_TOKENS = 32768        # batch x sequence per measurement: the batch shrinks as the sequence grows
ATTENTION_HEADS = 32
STREAM_BYTES = tuple(1 << s for s in range(12, 31, 2))   # 4 KiB .. 1 GiB moved
HOST_OPS = 2000


_LEAD: list = []


def _lead() -> None:
    """A long matrix product queued before a timed run: while the GPU runs it the host queues the run, so the
    GPU then runs the run's kernels back to back (their own time, not the host's pace of issuing them)."""
    import torch

    if not _LEAD:
        _LEAD.append(torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16))
    _LEAD[0] @ _LEAD[0]


def _gpu_seconds(fn: Callable[[], object], reps: int = 10, trials: int = 3) -> float:
    """Median over ``trials`` of the mean GPU time of ``reps`` back-to-back calls, after two warm-up calls."""
    import torch

    fn(); fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _lead()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / reps)
    return statistics.median(times)


def _reps_for(seconds_guess: float) -> int:
    return max(3, min(100, int(0.02 / max(seconds_guess, 1e-7))))


def measure_gemms(device) -> list[GemmPoint]:
    import torch

    out = []
    grids = [("bf16", GEMM_M, GEMM_NK)]
    if device.type == "cuda":
        grids += [("fp32", GEMM_FP32_M, GEMM_FP32_NK), ("tf32", GEMM_FP32_M, GEMM_FP32_NK)]
    for dtype, ms, nks in grids:
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        element = torch.bfloat16 if dtype == "bf16" else torch.float32
        for m in ms:
            for n in nks:
                for k in nks:
                    if 2 * m * n * k > MAX_GEMM_FLOPS:
                        continue
                    out += _gemm_layouts(m, n, k, dtype, element, device)
    torch.backends.cuda.matmul.allow_tf32 = False
    return out


def _gemm_layouts(m: int, n: int, k: int, dtype: str, element, device) -> list[GemmPoint]:
    """The three products of a linear layer of K -> N on M tokens, as autograd runs them."""
    import torch

    x, w, dy = (torch.randn(a, b, device=device, dtype=element) for a, b in ((m, k), (n, k), (m, n)))
    products = {"nt": lambda: x @ w.t(), "nn": lambda: dy @ w, "tn": lambda: dy.t() @ x}
    shapes = {"nt": (m, n, k), "nn": (m, k, n), "tn": (n, k, m)}
    found = []
    for layout, fn in products.items():
        a, b, c = shapes[layout]
        guess = 2 * a * b * c / 4e14
        t = _gpu_seconds(fn, reps=_reps_for(guess))
        found.append(GemmPoint(a, b, c, layout, dtype, 2.0 * a * b * c / t))
    return found


FP8_M, FP8_NK = (2048, 8192, 32768), (1024, 4096, 16384)


def measure_fp8_gemms(device) -> list[GemmPoint]:
    """fp8 products as torchao's float8 linears run them (`torch._scaled_mm`: e4m3 operands, bf16 out), with one
    scale per tensor (dtype ``fp8-tensorwise``) and one per row (``fp8-rowwise``); none on GPUs without fp8
    tensor cores (compute capability below 8.9)."""
    import torch

    if torch.cuda.get_device_capability(device) < (8, 9):
        return []
    out = []
    for m in FP8_M:
        for n in FP8_NK:
            for k in FP8_NK:
                a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
                b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()   # column-major, as _scaled_mm takes it
                one = torch.ones((), device=device)
                scales = {"fp8-tensorwise": (one, one),
                          "fp8-rowwise": (torch.ones(m, 1, device=device), torch.ones(1, n, device=device))}
                for dtype, (sa, sb) in scales.items():
                    fn = lambda sa=sa, sb=sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)  # noqa: E731
                    t = _gpu_seconds(fn, reps=_reps_for(2 * m * n * k / 8e14))
                    out.append(GemmPoint(m, n, k, "nt", dtype, 2.0 * m * n * k / t))
    return out


def measure_attention(device) -> list[AttentionPoint]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    out = []
    for name, backend in backends.items():
        for d in ATTENTION_HEAD_DIMS:
            for ratio in ATTENTION_KV_RATIOS:
                for s in ATTENTION_SEQ:
                    b = max(1, ATTENTION_TOKENS // s)
                    q = torch.randn(b, ATTENTION_HEADS, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
                    k, v = (torch.randn(b, ATTENTION_HEADS // ratio, s, d, device=device, dtype=torch.bfloat16,
                                        requires_grad=True) for _ in range(2))
                    flops = 4.0 * b * ATTENTION_HEADS * s * s * d / 2   # causal: half the square
                    try:
                        with sdpa_kernel(backend):
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=ratio > 1)
                            grad = torch.randn_like(o)
                            fwd = _gpu_seconds(lambda: F.scaled_dot_product_attention(
                                q, k, v, is_causal=True, enable_gqa=ratio > 1), reps=5)
                            both = _gpu_seconds(lambda: torch.autograd.grad(F.scaled_dot_product_attention(
                                q, k, v, is_causal=True, enable_gqa=ratio > 1), (q, k, v), grad), reps=5)
                    except RuntimeError:     # the backend does not take this shape here
                        continue
                    out.append(AttentionPoint(name, d, s, ratio, False, flops / fwd))
                    out.append(AttentionPoint(name, d, s, ratio, True, 2.5 * flops / max(both - fwd, 1e-9)))
    return out


def measure_stream(device) -> list[tuple[float, float]]:
    """An element-wise copy (read + write) at each size."""
    import torch

    out = []
    for nbytes in STREAM_BYTES:
        src = torch.empty(nbytes // 4, device=device, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        t = _gpu_seconds(lambda: dst.copy_(src), reps=_reps_for(nbytes / 3e12))
        out.append((float(nbytes), t))
    return out


def measure_memory_ops(device, stream: list[tuple[float, float]]) -> dict:
    """What the step's memory-bound kernels take against the copy curve at the bytes the step model counts
    for them (predict/training/workload.py: an op's inputs read and outputs written), forward; the loss's backward
    too ("embedding/loss backward": its kernels differ from the forward's)."""
    import torch
    import torch.nn.functional as F

    from meshscale.models.atlas import KernelAtlas

    curve = KernelAtlas("", "", {}, 0, 0.0, 0.0, (), (), tuple(stream))
    tokens, d, hidden, vocab = 16384, 4096, 14336, 32768
    bf = dict(device=device, dtype=torch.bfloat16)
    x, w = torch.randn(tokens, d, **bf), torch.ones(d, **bf)
    h1, h2 = torch.randn(tokens, hidden, **bf), torch.randn(tokens, hidden, **bf)
    logits = torch.randn(8192, vocab, **bf)
    target = torch.randint(0, vocab, (8192,), device=device)
    cos, sin = torch.randn(tokens, d // 2, **bf), torch.randn(tokens, d // 2, **bf)
    params = [torch.randn(1 << 22, device=device, requires_grad=True) for _ in range(16)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)

    def rotary():
        a, b = x[..., ::2], x[..., 1::2]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), -1)

    leaf = logits.detach().requires_grad_()

    def loss_backward():   # cross_entropy(logits.float())'s backward alone: fill, log_softmax's, the cast back
        return torch.autograd.grad(F.cross_entropy(leaf.float(), target), leaf)

    cases = {   # category: (the op, the bytes the step model counts for it)
        "norm": (lambda: F.rms_norm(x, (d,), w), 2 * 2 * tokens * d),
        "elementwise/activation": (lambda: F.silu(h1) * h2, 2 * 2 * tokens * hidden + 3 * 2 * tokens * hidden),
        "rotary": (rotary, (2 * 2 + 16) * tokens * d),
        "embedding/loss": (lambda: F.cross_entropy(logits.float(), target), 14.0 * 8192 * vocab),
        "optimizer": (opt.step, 80.0 * sum(p.numel() for p in params)),
    }
    found = {name: _gpu_seconds(fn, reps=5) / curve.stream_seconds(nbytes) for name, (fn, nbytes) in cases.items()}
    # the loss's backward (workload.LOSS_BACKWARD_BYTES, 22 B a logit): forward and backward less the forward
    both = _gpu_seconds(loss_backward, reps=5)
    forward = found["embedding/loss"] * curve.stream_seconds(14.0 * 8192 * vocab)
    found["embedding/loss backward"] = max(both - forward, 1e-9) / curve.stream_seconds(22.0 * 8192 * vocab)
    return found


def measure_kernel_floor(device) -> float:
    """One tiny kernel's GPU time in a CUDA graph of 200 of them (no host in the loop)."""
    import torch

    a = torch.zeros(1, device=device)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            a.add_(1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(200):
            a.add_(1)
    return _gpu_seconds(graph.replay, reps=5) / 200


def measure_eager_floor(device) -> float:
    """One tiny kernel's GPU time when eager PyTorch launches them back to back: the host queues 200 of them
    behind a long matrix product, so the GPU runs them from a full queue (the launch's own GPU-side cost)."""
    import torch

    a = torch.zeros(1, device=device)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _lead()
        start.record()
        for _ in range(200):
            a.add_(1)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / 200)
    return statistics.median(times)


def _host_seconds(fn: Callable[[], object], device, calls: int = HOST_OPS) -> float:
    """Host time per call of ``fn``, issued back to back (the GPU keeps up with tiny kernels, so the host's
    dispatch is what is timed), median of three rounds."""
    import torch

    for _ in range(20):
        fn()
    torch.cuda.synchronize(device)
    rounds = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize(device)
        rounds.append((time.perf_counter() - t0) / calls)
    return statistics.median(rounds)


def _tiny_block(device, d: int = 64, heads: int = 4, seq: int = 16):
    """A Llama block at a tiny width (norm, Q/K/V/O, rotary, causal SDPA, SwiGLU, residuals) with its input, so
    small that its GPU work is nothing and a forward and backward time only the host issuing its ops."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
            self.w1, self.w3 = nn.Linear(d, 4 * d, bias=False), nn.Linear(d, 4 * d, bias=False)
            self.w2 = nn.Linear(4 * d, d, bias=False)
            self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
            self.register_buffer("angles", torch.randn(seq, d // heads // 2))

        def forward(self, x):
            b, s = x.shape[:2]
            y = self.norm1(x)
            q, k, v = (w(y).view(b, s, -1, d // heads).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
            rot = torch.polar(torch.ones_like(self.angles), self.angles)
            q, k = (torch.view_as_real(torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2)) * rot)
                    .flatten(3).type_as(t) for t in (q, k))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
            x = x + self.wo(a)
            z = self.norm2(x)
            return x + self.w2(F.silu(self.w1(z)) * self.w3(z))

    return Block().to(device), torch.randn(1, seq, d, device=device, requires_grad=True)


def _tiny_bottleneck(device, channels: int = 16, image: int = 8):
    """A ResNet bottleneck at a tiny size (1x1, 3x3, 1x1 convolutions, each with batch norm and ReLU, and the
    residual), channels-last as train runs it, so small that only the host issuing its ops is timed."""
    import torch
    from torch import nn

    def unit(c_in, c_out, k):
        return [nn.Conv2d(c_in, c_out, k, padding=k // 2, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]

    body = nn.Sequential(*unit(channels, channels, 1), *unit(channels, channels, 3), *unit(channels, channels, 1))

    class Bottleneck(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = body

        def forward(self, x):
            return torch.relu(self.body(x) + x)

    block = Bottleneck().to(device).to(memory_format=torch.channels_last)
    x = torch.randn(2, channels, image, image, device=device).to(memory_format=torch.channels_last)
    return block, x.requires_grad_()


def _step_of(block, x) -> Callable[[], None]:
    def step():
        block.zero_grad(set_to_none=True)   # every call alike: gradients made, not accumulated
        x.grad = None
        block(x).sum().backward()
    return step


def _aten_ops(fn: Callable[[], object]) -> tuple[int, int]:
    """Aten ops ``fn`` dispatches (forward and backward), counted once by a dispatch mode: all of them, and those
    on DTensors (each counted once, at DTensor's level, as the step model counts them)."""
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    counts = [0, 0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counts[0] += 1
            counts[1] += any(isinstance(a, DTensor) for a in tree_leaves((args, kwargs or {})))
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return counts[0], counts[1]


def measure_conv_host(device) -> float:
    """Eager PyTorch's host time per op of a tiny ResNet bottleneck's forward and backward (cuDNN's convolutions
    and batch norms dispatch more host work per op than a transformer's ops)."""
    block, x = _tiny_bottleneck(device)
    ops, _ = _aten_ops(_step_of(block, x))
    return _host_seconds(_step_of(block, x), device, calls=200) / ops


def measure_host(device) -> tuple[float, float]:
    """Eager PyTorch's host time per op: a tiny Llama block's forward and backward (a step's op mix, its GPU work
    nothing) over the aten ops it dispatches; then the block tensor-parallel as train plans it (ColwiseParallel
    Q, K, V, w1, w3; RowwiseParallel wo, w2) on a one-rank mesh: what its ops on DTensors add, per such op."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    block, x = _tiny_block(device)
    ops, _ = _aten_ops(_step_of(block, x))
    plain = _host_seconds(_step_of(block, x), device, calls=200) / ops
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    try:
        mesh = init_device_mesh("cuda", (1,))
        block, x = _tiny_block(device)
        plan = {**{n: ColwiseParallel() for n in ("wq", "wk", "wv", "w1", "w3")},
                **{n: RowwiseParallel() for n in ("wo", "w2")}}
        parallelize_module(block, mesh, plan)
        ops, on_dtensors = _aten_ops(_step_of(block, x))
        total = _host_seconds(_step_of(block, x), device, calls=200)
    finally:
        if started:
            dist.destroy_process_group()
    return plain, (total - plain * (ops - on_dtensors)) / max(on_dtensors, 1)


def versions() -> dict:
    import platform

    import torch

    found = {"torch": torch.__version__, "cuda": torch.version.cuda or "", "python": platform.python_version()}
    if torch.backends.cudnn.is_available():
        found["cudnn"] = str(torch.backends.cudnn.version())
    try:
        import pynvml
        pynvml.nvmlInit()
        found["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:  # no NVML: the driver is left out, not guessed
        pass
    return found


def measure_atlas(dense_bf16_flops: float, memory_bandwidth_bytes_per_s: float, command: str = "",
                  progress: Callable[[str], None] = lambda _: None) -> KernelAtlas:
    """The whole atlas on this process's GPU (the GPU's datasheet peak and bandwidth given by the caller)."""
    import torch

    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    progress("memory-bound kernels")
    stream = measure_stream(device)
    memory_ops = measure_memory_ops(device, stream)
    progress("kernel floor and host costs")
    floor, eager_floor = measure_kernel_floor(device), measure_eager_floor(device)
    host, dtensor = measure_host(device)
    conv_host = measure_conv_host(device)
    progress("attention")
    attention = measure_attention(device)
    progress("matrix products")
    gemms = measure_gemms(device) + measure_fp8_gemms(device)
    return KernelAtlas(props.name, datetime.date.today().isoformat(), versions(), props.multi_processor_count,
                       dense_bf16_flops, memory_bandwidth_bytes_per_s, tuple(gemms), tuple(attention),
                       tuple(stream), memory_ops, floor, eager_floor, host, dtensor, command, conv_host,
                       ({"date": datetime.date.today().isoformat(), "host_s_per_op": host,
                         "dtensor_host_s_per_op": dtensor, "conv_host_s_per_op": conv_host},))
