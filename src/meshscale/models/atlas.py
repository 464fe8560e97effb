"""The kernel atlas: what the kernels a training step is made of took on one GPU, measured (`meshscale bench
kernels`), shipped as data and read by the step model in place of fixed efficiencies.

One atlas is one GPU, one date, one software stack (torch, CUDA, cuDNN versions, the driver). It holds:
- ``gemm``: matrix products (torch.matmul as nn.Linear runs them: the forward x W^T, the input gradient dY W,
  the weight gradient dY^T X) over a grid of M x N x K shapes per dtype, as achieved FLOP/s;
- ``attention``: scaled_dot_product_attention forward and backward (causal) by backend, head dimension,
  sequence length and grouped-query ratio, as achieved FLOP/s (causal FLOPs: half the square);
- ``stream``: an element-wise copy's time at sizes from kilobytes to a gigabyte (bytes read + written), the
  curve every memory-bound kernel of the step model follows, and ``memory_ops``: what the step's own
  memory-bound kernels (RMSNorm, SiLU, the gate product, rotary, the loss, AdamW) reach against that curve;
- ``kernel_floor_s``: one tiny kernel's time on the GPU inside a CUDA graph (launch and tail, no host), and
  ``eager_kernel_floor_s`` the same kernel launched one by one by eager PyTorch from a full queue;
- ``host_s_per_op`` / ``dtensor_host_s_per_op`` / ``conv_host_s_per_op``: eager PyTorch's host time to issue
  one op (with autograd recording), over a tiny Llama block's forward and backward, what the same block's ops
  on DTensors add (tensor parallel on a one-rank mesh, a warm sharding-propagation cache), and over a tiny ResNet
  bottleneck's; ``host_samples`` the same figures from each machine the atlas was measured on;
- ``blocks``: one Llama block's forward and backward (meshscale's train block, each rotary formulation, eager
  and torch.compile'd, bf16 and float8) with the GPU time of its kernels other than matrix products and
  attention: what the kernels an engine generates around them take (train/blocks.py).

Torch-free: predict reads it, bench writes it. Every figure is a measurement; nothing here is fitted."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from math import log
from pathlib import Path

ATLAS_DIR = Path(__file__).with_name("atlas")
# memory-bound categories the atlas measures, by the step model's category names (predict's `category_of`)
MEMORY_CATEGORIES = ("elementwise/activation", "norm", "rotary", "embedding/loss", "optimizer")


@dataclass(frozen=True)
class GemmPoint:
    m: int
    n: int
    k: int
    layout: str          # "nt" (forward: x W^T), "nn" (input gradient), "tn" (weight gradient)
    dtype: str           # bf16, fp16, fp32 (true fp32), tf32
    flops_per_s: float


@dataclass(frozen=True)
class AttentionPoint:
    backend: str         # cudnn or flash (what SDPA ran when forced to it)
    head_dim: int
    seq_len: int
    kv_ratio: int        # query heads per key/value head (1: multi-head; 4, 8: grouped-query)
    backward: bool
    flops_per_s: float   # causal FLOPs (forward 2 x 2 x b x h x s^2 x d / 2; backward 2.5 times that) per second


@dataclass(frozen=True)
class BlockPoint:
    """One Llama block (d_model, heads, kv_heads, ffn_dim; batch x seq_len tokens) run forward and backward:
    GPU seconds of its element-wise kernels (everything but matrix products and attention), how many there were,
    and the matrix products' and attention's seconds beside them."""
    style: str           # rotary: pairs (meshscale's engine) | complex (torchtitan's)
    precision: str       # bf16 | fp8-tensorwise (torchao's float8 linears)
    compiled: bool       # torch.compile'd (inductor's generated kernels) or eager
    d_model: int
    heads: int
    kv_heads: int
    ffn_dim: int
    batch: int
    seq_len: int
    elementwise_s: float
    elementwise_kernels: int
    matmul_s: float
    attention_s: float


@dataclass(frozen=True)
class KernelAtlas:
    """One GPU's measured kernels (see the module docstring); ``gpu`` is its name as NVML and the catalog spell
    it, ``dense_flops`` its datasheet dense tensor-core peak in bf16 (what fractions are taken against)."""

    gpu: str
    date: str
    versions: dict
    sm_count: int
    dense_bf16_flops: float
    memory_bandwidth_bytes_per_s: float
    gemm: tuple[GemmPoint, ...]
    attention: tuple[AttentionPoint, ...]
    stream: tuple[tuple[float, float], ...]          # (bytes moved, seconds) of one element-wise copy
    memory_ops: dict = field(default_factory=dict)   # category -> measured time / stream-curve time at its bytes
    kernel_floor_s: float = 0.0                      # in a CUDA graph
    eager_kernel_floor_s: float = 0.0                # launched one by one from a full queue
    host_s_per_op: float = 0.0
    dtensor_host_s_per_op: float = 0.0
    command: str = ""
    conv_host_s_per_op: float = 0.0                  # ... of a ResNet bottleneck's ops (cuDNN's convolutions)
    # the host figures of every machine this GPU's atlas was measured on (host work varies from one host, or
    # one VM runtime, to the next): the step model takes their median
    host_samples: tuple[dict, ...] = ()
    blocks: tuple[BlockPoint, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    # ---- what the step model asks -------------------------------------------------------------------------
    def stream_seconds(self, nbytes: float) -> float:
        """An element-wise kernel moving ``nbytes``: the measured copy curve, linear between its points in
        log-log, at the measured rate beyond its largest point and never below its smallest time."""
        points = sorted(self.stream)
        if nbytes <= points[0][0]:
            return points[0][1]
        for (b0, t0), (b1, t1) in zip(points, points[1:]):
            if nbytes <= b1:
                w = log(nbytes / b0) / log(b1 / b0)
                return t0 * (t1 / t0) ** w
        b, t = points[-1]
        return t * nbytes / b

    @property
    def stream_fraction(self) -> float:
        """The largest copy's bandwidth over the datasheet's."""
        b, t = max(self.stream)
        return b / t / self.memory_bandwidth_bytes_per_s

    def gemm_points(self, dtype: str) -> list[GemmPoint]:
        return [p for p in self.gemm if p.dtype == dtype]

    def attention_points(self, backend: str, backward: bool) -> list[AttentionPoint]:
        return [p for p in self.attention if p.backend == backend and p.backward == backward]


def from_dict(data: dict) -> KernelAtlas:
    fields = dict(data)
    fields["gemm"] = tuple(GemmPoint(**p) for p in data["gemm"])
    fields["attention"] = tuple(AttentionPoint(**p) for p in data["attention"])
    fields["stream"] = tuple(tuple(map(float, p)) for p in data["stream"])
    fields["host_samples"] = tuple(dict(s) for s in data.get("host_samples", ()))
    fields["blocks"] = tuple(BlockPoint(**p) for p in data.get("blocks", ()))
    return KernelAtlas(**fields)


def load_atlas(path: str | Path) -> KernelAtlas:
    from meshscale.errors import MeshscaleError
    from meshscale.validation import load_structured

    data = load_structured(Path(path), "kernel atlas")
    try:
        return from_dict(data)
    except (TypeError, KeyError, ValueError) as exc:
        raise MeshscaleError(f"{path}: not a kernel atlas ({exc}); write it with `meshscale bench kernels`") from None


@lru_cache(maxsize=None)
def shipped_atlases() -> tuple[KernelAtlas, ...]:
    """The atlases meshscale ships (models/atlas/*.json), measured on the lent GPUs."""
    return tuple(load_atlas(p) for p in sorted(ATLAS_DIR.glob("*.json")))
