"""The kernels of a training step and their time on one GPU: a roofline on the datasheet figures, with the
achievable fractions GPU libraries document; on a GPU whose family has a measured kernel atlas
(`meshscale.models.atlas`, `measured.py`), the atlas's measurements in place of the stated allowances below
(GEMM_CEILING, HBM_FRACTION, KERNEL_FLOOR_S, the attention fractions, the host's cost per op).

- A matrix multiplication (or a convolution as the implicit GEMM cuDNN runs) of M x K by K x N is split into
  output tiles of TILE x TILE, one thread block each, run in waves of one tile per SM: a partly filled last tile
  and a partly filled last wave waste their share of the machine (tile and wave quantization, NVIDIA Deep
  Learning Performance Guide, "Matrix Multiplication Background"); too few tiles are split along K. What full
  waves reach is the measured large-GEMM ceiling of the generation, GEMM_CEILING: the maximum achievable matmul
  FLOPS over shapes (BF16, PyTorch matmul: A100 SXM 267.9 of 312 TFLOP/s, H100 SXM 792.1 of 989, GH200 821.0 of
  989; Stas Bekman's Machine Learning Engineering Open Book, "Maximum Achievable Matmul FLOPS comparison table").
  Its operands cross HBM at least once, so a thin product is bandwidth-bound instead. Each output tile also
  pays, beyond its main loop over K, the load of its first K-block and the store of its finished tile at the SM's
  share of the HBM bandwidth (the pipeline's fill and the epilogue, which the tile's own main loop cannot hide):
  a short K (GPT-2 small's 768) leaves a GEMM well below the ceiling, a long one (8192) close to it
  (`tile_efficiency`).
- A grouped GEMM (a mixture of experts' experts, `torch._grouped_mm`: one launch over every local expert) is
  ``groups`` products of m x k by k x n, each expert's own tokens: its tiles are quantized per expert (a few
  tokens per expert leave most of each 128-row tile empty) and its tile edges priced at the expert's own shape,
  while the waves fill the SMs with the tiles of all the experts together.
- fp8 GEMMs (torchao's float8 linears; `Kernel.fp8`) run at the datasheet's fp8 tensor-core peak times the
  measured large-GEMM ceiling of fp8 (GEMM_CEILING_FP8, the same table's float8_e4m3fn rows: H100 SXM 70.9%, B200
  SXM 76.3%), their operands one byte each; everything else stays at the bf16 rates.
- Causal attention is FlashAttention's: forward 4 x tokens x (context / 2) x head_dim FLOPs per head, backward
  2.5 times that (five matrix products against two, FlashAttention-2 paper, section 3.1.2), at the fraction of
  peak its papers measure for the generation, and on Hopper for the head dimension and sequence length
  (`attention_fraction`), for the kernel PyTorch's SDPA picks there (cuDNN's on Hopper) or the one the job names;
  the older FlashAttention written in Triton runs slower by the ratios the FlashAttention-2 paper measures
  (`TRITON_ATTENTION_SLOWDOWN`).
- Everything else (norms, activations, rotary, residual adds, the loss, the optimizer) is memory-bound: its
  bytes at HBM_FRACTION of the datasheet bandwidth (a stated allowance: streaming kernels do not reach the
  datasheet figure; not a figure measured here). A kernel whose per-element arithmetic is known from its source
  (batch norm's channels-last kernels) also carries its instructions: every one takes an issue slot (four warp
  schedulers per SM, one warp instruction each per clock: 128 thread-instructions per clock per SM), and the
  reciprocals and type conversions among them run on the SM's 16-lane unit for those (CUDA C++ Programming
  Guide, "Arithmetic Instructions": 16 results per clock per SM for 32-bit reciprocal and for type conversions,
  compute capability 5.x to 9.0), at the clock the datasheet's FP32 rate implies; such a kernel takes the
  longer of its bytes and its instructions (a streaming loop overlaps the two across its warps).
- No kernel takes less than KERNEL_FLOOR_S (the GPU's own launch and tail, a few microseconds; "CUDA Graph Best
  Practice for PyTorch", NVIDIA, "CUDA Graph Basics"). The host's cost of issuing each aten op from eager PyTorch
  is priced separately, per pass, in the step model (`HOST_SECONDS_PER_OP`); an op on DTensors (tensor-parallel
  layers, FSDP2's parameters in the optimizer) goes through DTensor's dispatch (sharding propagation, a cache hit
  in a steady step; redistribution; the local op; the result wrapped) and costs DTENSOR_HOST_SECONDS_PER_OP.
  Kernels of kind "host" are such host work with no kernel of their own (DTensor's redistributions, the views a
  recompute replays): the GPU spends nothing on them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import ceil, log2

from meshscale.predict.training.hardware import GpuSpec

TILE = 128                 # cuBLAS/CUTLASS output tile edge on Ampere/Hopper for large problems
# measured large-GEMM fraction of the dense tensor-core peak per generation (MAMF table; see the docstring)
GEMM_CEILING = {"ampere": 267.9 / 312, "hopper": 792.1 / 989}
GEMM_CEILING_OTHER = 792.1 / 989   # generations the table has no row for: the lower of the two measured
# the same table's fp8 (float8_e4m3fn) rows, by the generation's GPU the bf16 row is taken from: H100 SXM 1402.6 of
# 1979 TFLOP/s, B200 SXM 3432.5 of 4500 (ml-engineering's table as of 2026-08, torch 2.7); others the lower
GEMM_CEILING_FP8 = {"hopper": 1402.6 / 1979, "blackwell": 3432.5 / 4500}
GEMM_CEILING_FP8_OTHER = 1402.6 / 1979
HBM_FRACTION = 0.85        # streaming kernels' share of the datasheet HBM bandwidth (stated allowance)
KERNEL_FLOOR_S = 5e-6      # a kernel's launch and tail on the GPU (stated allowance)
ISSUE_LANES_PER_SM = 128   # 4 warp schedulers x 1 warp instruction (32 threads) per clock (the whitepapers' SM)
XU_LANES_PER_SM = 16       # reciprocal / conversion results per clock per SM (CUDA C++ Programming Guide)
TILE_K = 64                # the K-block a tile loads per pipeline stage (CUTLASS's 128x128x64 tiles)
ALIGN_BYTES = 16           # the asynchronous tile copies' alignment (TMA strides, cp.async.cg of 16 bytes)
# eager PyTorch: host time to issue one aten op through the dispatcher (autograd, autocast, the launch): a stated
# allowance, inside the 5-20 us per op "CUDA Graph Best Practice for PyTorch" (NVIDIA) describes for CPU-bound
# steps; a CUDA-graphed step replays without it.
HOST_SECONDS_PER_OP = 10e-6
# eager PyTorch: host time of one aten op on DTensors with a sharding-propagation cache hit: the 90 us PyTorch's
# own test sets as its expected dispatch time (test/distributed/tensor/test_dtensor_dispatch_overhead.py,
# `expected_dispatch_time`: an add of two 512 x 512 CUDA DTensors on 4 ranks); a cache miss (an op's first call
# on a shape, `expected_propagate_time` 880 us more) happens once, not every step.
DTENSOR_HOST_SECONDS_PER_OP = 90e-6
# FlashAttention's measured fraction of the dense peak in training (forward + backward):
# Ampere: FlashAttention-2 reaches 50-73% on A100 (paper abstract; the low end for forward + backward);
# Blackwell: taken as Hopper's until a published figure for PyTorch's kernel there exists.
ATTENTION_FRACTION = {"ampere": 0.50, "ada": 0.50, "hopper": 0.35, "blackwell": 0.35}
ATTENTION_FRACTION_OTHER = 0.30   # memory-efficient attention on older GPUs (no FlashAttention-2 there)
# Hopper, by head dimension and sequence length: TFLOP/s on an H100 SXM5 at 512, 1k, 2k, 4k, 8k, 16k tokens of
# FlashAttention-2 and of cuDNN's attention (FlashAttention-3 paper, Shah et al. 2024: figure 5, the bars of the
# forward pass with the causal mask at head dimensions 64, 128 and 256; figure 6, the backward pass at head
# dimension 128, taken for every head dimension), over the 989 TFLOP/s dense peak; short sequences and small
# heads fill the SMs less.
ATTENTION_SEQ_POINTS = (512, 1024, 2048, 4096, 8192, 16384)
HOPPER_ATTENTION_TFLOPS = {
    "flash": {64: (180, 229, 262, 284, 295, 299), 128: (191, 260, 298, 319, 333, 335),
              256: (208, 251, 278, 293, 297, 298)},
    "cudnn": {64: (225, 288, 334, 363, 379, 388), 128: (315, 410, 484, 518, 529, 539),
              256: (308, 391, 450, 483, 497, 509)}}
HOPPER_ATTENTION_BACKWARD_TFLOPS = {"flash": (214, 260, 291, 310, 318, 322), "cudnn": (305, 408, 465, 499, 518, 516)}
# The backward figure is measured without the causal mask (figure 6 has no causal panels; figure 5 has both).
# A causal kernel does half the FLOPs in the same grid: the blocks on the diagonal are computed whole and masked,
# the thread blocks of early queries finish early and leave SMs idle, which the shorter sequences feel most. The
# forward pass measures that cost at head dimension 128 (figure 5: each kernel's causal bars against its bars
# without the mask); the backward runs the same causal loop over the same blocks, so it pays the same share
# (`attention_fraction(..., backward=True)`).
HOPPER_ATTENTION_NONCAUSAL_TFLOPS_128 = {"flash": (309, 350, 362, 368, 370, 370),
                                         "cudnn": (497, 574, 617, 609, 600, 595)}
HOPPER_DENSE_TFLOPS = 989.0
# The attention kernel a job runs:
# - "sdpa" (the default): what PyTorch's scaled_dot_product_attention picks on the GPU. With cuDNN 9 on compute
#   capability 9.0 and later PyTorch puts cuDNN's attention first (aten/src/ATen/native/transformers/cuda/
#   sdp_utils.cpp, `check_prefer_cudnn_attention`; torch 2.11 chose it on an H200 for every shape tried), else
#   FlashAttention-2 first;
# - "flash": FlashAttention-2; "cudnn": cuDNN's; on GPUs the FlashAttention-3 paper has no bars for, cuDNN's is
#   priced as FlashAttention-2's (no published figure there);
# - "triton": the FlashAttention written in Triton in 2022 that MPT's llm-foundry trained with (its benchmark
#   script's default `attn_impl`). FlashAttention-2 is "around 1.3-1.5x faster than FlashAttention in Triton in
#   the forward pass and around 2x faster in the backward pass" (FlashAttention-2 paper, section 4.1, A100): the
#   Triton kernel's forward (a recompute's too) runs at the FlashAttention-2 rate / 1.4, the middle of that
#   range, its backward at / 2.
ATTENTION_KERNELS = ("sdpa", "flash", "cudnn", "triton")
TRITON_ATTENTION_SLOWDOWN = {"forward": 1.4, "backward": 2.0}


def sdpa_kernel(family: str) -> str:
    """The attention kernel PyTorch's SDPA runs on a GPU family today (cuDNN's first on compute capability 9.0
    and 10.0 since PyTorch 2.9, pytorch/pytorch#162073; from 2.5.1 to 2.8 cuDNN's was opt-in, #138522, and SDPA
    ran FlashAttention-2 there: a run of those versions says `attention: flash`)."""
    return "cudnn" if family in ("hopper", "blackwell") else "flash"


def _at_length(row: tuple, seq_len: int) -> float:
    """``row`` (one value per ATTENTION_SEQ_POINTS) at ``seq_len``: linear in log2 of the length between the
    measured points, the end points beyond them."""
    points = ATTENTION_SEQ_POINTS
    s = min(max(seq_len, points[0]), points[-1])
    i = max(j for j in range(len(points)) if points[j] <= s)
    if i == len(points) - 1:
        return float(row[i])
    return row[i] + (row[i + 1] - row[i]) * log2(s / points[i])


def attention_fraction(family: str, head_dim: int, seq_len: int, backward: bool = False,
                       kernel: str = "flash", causal: bool = True) -> float:
    """The attention kernel's share of the dense peak on ``family`` for ``head_dim`` and ``seq_len``, causal or
    not (a context-parallel round against another rank's keys has no mask): FlashAttention-2's (``kernel``
    "flash", and the Triton kernel's base) or cuDNN's ("cudnn"). Without the mask the forward is the figure's
    bars without it at head dimension 128, moved to another head dimension as the causal bars move."""
    if family not in ("hopper", "blackwell") or not head_dim or not seq_len:
        return ATTENTION_FRACTION.get(family, ATTENTION_FRACTION_OTHER)
    bars = "cudnn" if kernel == "cudnn" else "flash"
    causal_share = _at_length(HOPPER_ATTENTION_TFLOPS[bars][128], seq_len) / \
        _at_length(HOPPER_ATTENTION_NONCAUSAL_TFLOPS_128[bars], seq_len)
    if backward:
        share = causal_share if causal else 1.0
        return _at_length(HOPPER_ATTENTION_BACKWARD_TFLOPS[bars], seq_len) * share / HOPPER_DENSE_TFLOPS
    dims = sorted(HOPPER_ATTENTION_TFLOPS[bars])
    row = HOPPER_ATTENTION_TFLOPS[bars][next((h for h in dims if head_dim <= h), dims[-1])]
    return _at_length(row, seq_len) / (1.0 if causal else causal_share) / HOPPER_DENSE_TFLOPS


KINDS = ("matmul", "conv", "attention", "memory", "host")
GQA_EXPANSION = "grouped-query expansion"   # the memory op of grouped-query heads expanded (workload.gqa_expansion)


@dataclass(frozen=True)
class Instructions:
    """Thread-level instructions a kernel issues: all of them (``issued``, each an issue slot), and ``xu`` of them
    on the reciprocal and conversion unit."""

    issued: float = 0.0
    xu: float = 0.0

    def times(self, n: float) -> "Instructions":
        return Instructions(self.issued * n, self.xu * n)


NO_INSTRUCTIONS = Instructions()


@dataclass(frozen=True)
class BlockShape:
    """A transformer block as the atlas's compiled blocks are told apart: its rotary formulation ("pairs",
    "complex") and its widths."""

    style: str
    heads: int
    kv_heads: int
    d_model: int
    ffn_dim: int


@dataclass(frozen=True)
class Kernel:
    """One kernel of one pass: its FLOPs, the HBM bytes it must move, and (matrix products) its GEMM shape."""

    name: str
    kind: str                       # matmul | conv | attention | memory | host (host work only, no kernel)
    flops: float = 0.0
    bytes: float = 0.0
    m: int = 0
    n: int = 0
    k: int = 0
    count: int = 1                  # identical kernels (e.g. per layer)
    ops: int = 1                    # aten ops the host issues for it (views and the kernel itself)
    dtensor_ops: int = 0            # ... of which on DTensors (DTENSOR_HOST_SECONDS_PER_OP each)
    backward_bytes: float | None = None   # memory ops: their backward's traffic (None: the default multiple; 0: none)
    launches: int = 0               # kernels the GPU runs for it where they are not one per op (0: as launches_of)
    instructions: Instructions = NO_INSTRUCTIONS             # memory ops: their arithmetic, where priced
    backward_instructions: Instructions = NO_INSTRUCTIONS    # ... and their backward's
    groups: int = 1                 # a grouped GEMM: this many m x k by k x n products in one launch
    fp8: bool = False               # a GEMM of fp8 operands (torchao's float8 linears)
    # element-wise ops a fusing framework (torch.compile, Transformer Engine) runs inside a fused kernel: the
    # traffic left when the op's inputs come from and its outputs go to registers of the fused kernel except at
    # its boundary (0: the op vanishes into its neighbours); None: not fused (it keeps its own kernel)
    fused_bytes: float | None = None
    fused_backward_bytes: float | None = None
    causal: bool = True             # attention: under the causal mask (False: every block computed)
    # a recomputed kernel that its checkpointing policy saves instead where the attention kernel is one of these
    # (costs nothing then): torchtitan's save list names some of SDPA's kernels only
    saved_with: tuple[str, ...] = ()
    # a memory op inside a torch.compile'd block (that block's rotary formulation and shape): its time follows
    # the atlas's measured compiled blocks (`MeasuredKernels.block_ratio`); None: not in a compiled block
    compiled_block: "BlockShape | None" = None


def gemm(name: str, m: float, n: float, k: float, element_bytes: int, kind: str = "matmul") -> Kernel:
    """An M x K by K x N product: 2MNK FLOPs, its three operands once through HBM."""
    m, n, k = max(1, int(m)), max(1, int(n)), max(1, int(k))
    return Kernel(name, kind, 2.0 * m * n * k, float(element_bytes) * (m * k + k * n + m * n), m, n, k)


def grouped_gemm(name: str, m: float, n: float, k: float, element_bytes: int, groups: int) -> Kernel:
    """``groups`` products of M x K by K x N in one launch (an expert's M tokens each): 2MNK FLOPs and the three
    operands of each once through HBM."""
    one = gemm(name, m, n, k, element_bytes)
    return replace(one, flops=one.flops * groups, bytes=one.bytes * groups, groups=max(1, int(groups)))


def fp8_gemm_bytes(m: int, n: int, k: int) -> float:
    """An fp8 GEMM's traffic: its two fp8 operands (one byte each), its bf16 output."""
    return float(m * k + k * n) + 2.0 * m * n


def gemm_backward(fwd: Kernel) -> list[Kernel]:
    """The two products of a GEMM's backward: the input gradient (M x N by N x K) and the weight gradient
    (K x M by M x N); a grouped GEMM's per group, fp8 if its forward is."""
    e = fwd.bytes / fwd.groups / (fwd.m * fwd.k + fwd.k * fwd.n + fwd.m * fwd.n)

    def product(name: str, m: int, n: int, k: int) -> Kernel:
        one = gemm(name, m, n, k, e, fwd.kind)
        nbytes = fp8_gemm_bytes(m, n, k) if fwd.fp8 else one.bytes
        return replace(one, flops=one.flops * fwd.groups, bytes=nbytes * fwd.groups, groups=fwd.groups,
                       fp8=fwd.fp8, count=fwd.count)
    wgrad = product(fwd.name + " wgrad", fwd.k, fwd.n, fwd.m)
    # a convolution's backward is one aten op (convolution_backward) launching both products
    return [product(fwd.name + " dgrad", fwd.m, fwd.k, fwd.n),
            replace(wgrad, ops=0) if fwd.kind == "conv" else wgrad]


def memory_op(name: str, nbytes: float, backward_bytes: float | None = None, ops: int = 1,
              launches: int = 0, instructions: Instructions = NO_INSTRUCTIONS,
              backward_instructions: Instructions = NO_INSTRUCTIONS, dtensor_ops: int = 0,
              fused: tuple[float, float] | None = None) -> Kernel:
    """A memory-bound op; ``fused``: its (forward, backward) traffic inside a fused kernel (`Kernel.fused_bytes`)."""
    return Kernel(name, "memory", 0.0, float(nbytes), ops=ops, backward_bytes=backward_bytes, launches=launches,
                  instructions=instructions, backward_instructions=backward_instructions, dtensor_ops=dtensor_ops,
                  fused_bytes=None if fused is None else float(fused[0]),
                  fused_backward_bytes=None if fused is None else float(fused[1]))


def quantization(m: int, n: int, k: int, sm_count: int, groups: int = 1) -> float:
    """Useful share of the machine for an M x N output over K (``groups`` of them in one launch): tiles partly
    outside the matrix and a last wave that does not fill every SM do work nobody asked for. Too few tiles to
    fill the SMs are split along K (split-K / stream-K, as cuBLAS and CUTLASS do for small outputs), in chunks of
    at least one tile of K."""
    tiles_m, tiles_n = ceil(m / TILE), ceil(n / TILE)
    tile = (m * n) / (tiles_m * tiles_n * TILE * TILE)
    tiles = tiles_m * tiles_n * groups
    units = tiles * max(1, min(sm_count // tiles, k // TILE))
    wave = units / (ceil(units / sm_count) * sm_count)
    return tile * wave


@dataclass(frozen=True)
class Rates:
    """What one kernel kind can reach on one GPU in one precision, and a calibration factor (1: datasheet)."""

    matmul_flops: float
    conv_flops: float
    attention_flops: float          # at the family's default fraction (no shape known)
    bandwidth_bytes_per_s: float
    sm_count: int
    factor: float = 1.0             # measured / datasheet-predicted time on the calibrating GPU
    element_bytes: int = 2          # the GEMMs' operand and output element
    family: str = ""
    dense_flops: float = 0.0
    issue_per_s: float = 0.0        # thread-instructions the SMs issue per second (0: not priced)
    xu_per_s: float = 0.0           # reciprocals and conversions per second
    attention_kernel: str = "flash"  # flash, cudnn or triton (rates() resolves "sdpa")
    calibrated: "CategoryCalibration | None" = None  # a profile's measured categories, moved to this GPU
    fp8_flops: float = 0.0          # what an fp8 GEMM reaches (--precision fp8; 0: none runs)
    fp8_dense_flops: float = 0.0    # ... the datasheet's fp8 peak (at the clock), where the atlas prices them
    measured_fp8: "MeasuredKernels | None" = None    # the atlas's fp8 products of the recipe, where measured
    measured: "MeasuredKernels | None" = None        # the kernel atlas of this GPU's family, where one was measured
    host_s_per_op: float = HOST_SECONDS_PER_OP       # eager PyTorch's host time per op (the atlas's, where shipped)
    dtensor_host_s_per_op: float = DTENSOR_HOST_SECONDS_PER_OP
    conv_host_s_per_op: float = HOST_SECONDS_PER_OP  # ... of a CNN's ops (cuDNN's convolutions, batch norms)
    kernel_floor_s: float = KERNEL_FLOOR_S
    block_precision: str = "bf16"   # the compiled blocks' precision that prices this step's (bf16, fp8-<recipe>)
    # each kernel's time at these rates, once found (`kernel_seconds`): a layout search prices the same layers'
    # kernels for every split of the data-parallel ranks. Not an argument: `replace` gives a new one
    seconds_memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)


_RATES: dict = {}   # (rates' arguments) -> (the atlases and host costs read, the Rates made of them)


def rates(gpu: GpuSpec, precision: str, factor: float = 1.0, attention_kernel: str = "sdpa",
          fp8_recipe: str = "tensorwise") -> Rates:
    """What each kernel kind reaches on ``gpu`` in ``precision``; ``attention_kernel`` "sdpa" is resolved to the
    kernel PyTorch's SDPA runs there. Under a power limit below the TDP the SMs' clock, and with it every rate
    the SMs set (tensor cores, instruction issue), is `GpuSpec.power_clock_ratio` of the datasheet's; the HBM
    bandwidth is not. The same arguments and data (the kernel atlases, the host's costs) give the same `Rates`,
    so that the kernels a layout search prices again are timed once (`Rates.seconds_memo`)."""
    from meshscale.predict.training.measured import host_costs, measured_kernels

    key = (gpu, precision, factor, attention_kernel, fp8_recipe)
    data = (measured_kernels(gpu, "bf16" if precision == "fp8" else precision),
            measured_kernels(gpu, f"fp8-{fp8_recipe}") if precision == "fp8" else None, host_costs())
    kept = _RATES.get(key)
    if kept is None or any(a is not b for a, b in zip(kept[0], data)):
        if len(_RATES) >= 64:
            _RATES.pop(next(iter(_RATES)))
        kept = _RATES[key] = data, _rates(gpu, precision, factor, attention_kernel, fp8_recipe)
    return kept[1]


def _rates(gpu: GpuSpec, precision: str, factor: float, attention_kernel: str, fp8_recipe: str) -> Rates:
    if attention_kernel == "sdpa":
        attention_kernel = sdpa_kernel(gpu.family)
    attention = ATTENTION_FRACTION.get(gpu.family, ATTENTION_FRACTION_OTHER)
    ceiling = GEMM_CEILING.get(gpu.family, GEMM_CEILING_OTHER)
    clock = gpu.power_clock_ratio
    sm_clocks = gpu.sm_count * gpu.clock_hz * clock
    fp8 = gpu.matmul_flops("fp8") * clock * GEMM_CEILING_FP8.get(gpu.family, GEMM_CEILING_FP8_OTHER) \
        if precision == "fp8" else 0.0
    precision = "bf16" if precision == "fp8" else precision   # all but the fp8 GEMMs: bf16
    dense = gpu.matmul_flops(precision) * clock
    found = Rates(dense * ceiling, gpu.matmul_flops(precision, conv=True) * clock * ceiling,
                  dense * attention, gpu.memory_bandwidth_bytes_per_s * HBM_FRACTION,
                  gpu.sm_count, factor, 4 if precision in ("fp32", "tf32") else 2, gpu.family, dense,
                  sm_clocks * ISSUE_LANES_PER_SM, sm_clocks * XU_LANES_PER_SM, attention_kernel, fp8_flops=fp8,
                  block_precision=f"fp8-{fp8_recipe}" if fp8 else "bf16")
    from meshscale.predict.training.measured import host_costs, measured_kernels

    measured = measured_kernels(gpu, precision)
    measured_fp8 = measured_kernels(gpu, f"fp8-{fp8_recipe}") if fp8 else None
    if measured_fp8 is not None:   # fp8 products from the atlas: their measured shares of the fp8 peak
        found = replace(found, measured_fp8=measured_fp8, fp8_dense_flops=gpu.matmul_flops("fp8") * clock)
    if measured is not None:
        found = replace(found, measured=measured, bandwidth_bytes_per_s=gpu.memory_bandwidth_bytes_per_s *
                        measured.stream_fraction, kernel_floor_s=measured.eager_floor_s)
    host = host_costs()
    if host is not None:
        found = replace(found, host_s_per_op=host.per_op_s, dtensor_host_s_per_op=host.dtensor_per_op_s,
                        conv_host_s_per_op=host.conv_per_op_s)
    return found


def instruction_seconds(instructions: Instructions, r: Rates) -> float:
    """Time to issue ``instructions``: the busier of the issue slots and the reciprocal/conversion unit."""
    if not r.issue_per_s:
        return 0.0
    return max(instructions.issued / r.issue_per_s, instructions.xu / r.xu_per_s)


def aligned(m: int, n: int, k: int, element_bytes: int) -> bool:
    """Whether every row of a GEMM's operands and output starts on a 16-byte boundary: the asynchronous copies
    a tensor-core GEMM stages its tiles with take 16-byte aligned addresses (Hopper's TMA: global strides a
    multiple of 16 bytes; Ampere's cp.async of 16 bytes: 16-byte aligned; CUDA C++ Programming Guide), and the
    rows of a row-major matrix are as wide as its inner dimension. GPT-2's 50,257-token vocabulary is not."""
    return all(d * element_bytes % ALIGN_BYTES == 0 for d in (m, n, k))


def tile_efficiency(m: int, n: int, k: int, peak_flops: float, r: Rates, staged: bool = True,
                    element_bytes: int = 0) -> float:
    """Share of a tile's time spent in its main loop: 2 x TILE^2 x K FLOPs at the SM's share of ``peak_flops``,
    against that plus the first K-block's load (its two operand slices) and the finished tile's store (at most
    TILE x TILE, less where the matrix is thinner) at the SM's share of the bandwidth. Without asynchronous
    copies (``staged`` False: rows not 16-byte aligned) no K-block's load overlaps the tensor cores: every one
    is paid."""
    tm, tn = min(m, TILE), min(n, TILE)
    main_s = 2.0 * TILE * TILE * k / (peak_flops / r.sm_count)
    loaded_k = min(k, TILE_K) if staged else k
    edge_bytes = (element_bytes or r.element_bytes) * ((tm + tn) * loaded_k + tm * tn)
    return main_s / (main_s + edge_bytes / (r.bandwidth_bytes_per_s / r.sm_count))


def attention_rate(kernel: Kernel, r: Rates) -> float:
    """The FLOP/s an attention kernel reaches: its kernel's documented rate for its head dimension, length and
    pass (it carries its sequence length as m, its head dimension as k, and n = 1 if backward)."""
    backward = kernel.n == 1
    base = "flash" if r.attention_kernel == "triton" else r.attention_kernel   # triton: FlashAttention-2 slowed
    measured = r.measured.attention_fraction(kernel.k, kernel.m, backward, base) \
        if r.measured is not None and r.dense_flops else None
    if measured is not None:
        # the atlas measured the causal kernel: a round without the mask keeps what the published bars say
        # the mask costs at that length (kernels.attention_fraction's causal share)
        if not kernel.causal:
            measured *= attention_fraction(r.family, kernel.k, kernel.m, backward, r.attention_kernel, False) / \
                attention_fraction(r.family, kernel.k, kernel.m, backward, r.attention_kernel, True)
        rate = r.dense_flops * measured
    else:
        rate = r.dense_flops * attention_fraction(r.family, kernel.k, kernel.m, backward, r.attention_kernel,
                                                  kernel.causal) if r.dense_flops else r.attention_flops
    if r.attention_kernel == "triton":
        rate /= TRITON_ATTENTION_SLOWDOWN["backward" if backward else "forward"]
    return rate


def kernel_seconds(kernel: Kernel, r: Rates) -> float:
    """One kernel's time (x its count): the slower of its compute and its memory traffic, never below the
    launch floor; scaled by the calibration factor, or moved from a profile's category (`CategoryCalibration`).
    Host work runs no kernel. Found once per kernel at these rates (`Rates.seconds_memo`)."""
    found = r.seconds_memo.get(kernel)
    if found is None:
        found = r.seconds_memo[kernel] = _kernel_seconds(kernel, r)
    return found


def _kernel_seconds(kernel: Kernel, r: Rates) -> float:
    if kernel.kind == "host" or r.attention_kernel in kernel.saved_with:
        return 0.0
    if r.calibrated is not None:
        return r.calibrated.seconds(kernel, r) * r.factor
    memory_s = kernel.bytes / r.bandwidth_bytes_per_s
    if kernel.kind in ("matmul", "conv"):
        peak, e = gemm_peak(kernel, r)
        share = gemm_share(kernel, peak, r, e)
        if kernel.kind == "matmul" and kernel.fp8 and r.fp8_flops:
            if r.measured_fp8 is not None:
                share = measured_gemm_share(kernel, peak, r, share, r.measured_fp8, r.fp8_dense_flops)
        elif kernel.kind == "matmul" and r.measured is not None:
            share = measured_gemm_share(kernel, peak, r, share)
        compute_s = kernel.flops / (peak * share)
    elif kernel.kind == "attention":
        compute_s = kernel.flops / attention_rate(kernel, r)
    else:
        compute_s = instruction_seconds(kernel.instructions, r)
        block = r.measured.block_ratio(kernel.compiled_block, r.block_precision) \
            if r.measured is not None and kernel.compiled_block is not None else None
        if block is not None:        # generated inside a compiled block: what the atlas's compiled blocks reach
            memory_s = kernel.bytes / r.bandwidth_bytes_per_s * block
        elif r.measured is not None:   # the measured copy curve at these bytes, times the category's own measured ratio
            memory_s = r.measured.memory_seconds(kernel.bytes, category_of(kernel, True), r.bandwidth_bytes_per_s,
                                                 kernel.name.endswith(" backward"))
    return kernel.count * max(compute_s, memory_s, r.kernel_floor_s * launches_of(kernel)) * r.factor


def measured_gemm_share(kernel: Kernel, peak: float, r: Rates, own: float, measured: "MeasuredKernels | None" = None,
                        dense_flops: float = 0.0) -> float:
    """A matrix product's share of ``peak`` (the datasheet's times the generation's ceiling) from the atlas: its
    own analytic share ``own`` (a grouped product's tiles quantized per group) times what the atlas measured
    beyond the analytic model around its shape (`MeasuredKernels.gemm_share`)."""
    from meshscale.predict.training.measured import layout_of

    layout = layout_of(kernel.name)
    m, n, k = (kernel.n, kernel.m, kernel.k) if layout == "tn" else (kernel.m, kernel.n, kernel.k)
    measured, dense = measured or r.measured, dense_flops or r.dense_flops
    e = 1 if kernel.fp8 else 0
    analytic = lambda a, b, c: gemm_share(Kernel("", "matmul", m=a, n=b, k=c), peak, r, e)  # noqa: E731
    key = (peak, r.sm_count, r.bandwidth_bytes_per_s, e or r.element_bytes)
    return measured.gemm_share(m, n, k, layout, analytic, own, key) * dense / peak


def gemm_share(kernel: Kernel, peak: float, r: Rates, element_bytes: int = 0) -> float:
    """The analytic share of ``peak`` a matrix product reaches: tile and wave quantization (per group of a
    grouped product) times the tiles' main-loop share (the generation's measured ceiling is in ``peak``)."""
    e = element_bytes or r.element_bytes
    # cuDNN pads a convolution's channels to the vector width itself (the stem's 3 to 4 or 8; NVIDIA,
    # "Convolutional Layers User's Guide", channels in and out); cuBLAS takes the rows as they are
    staged = kernel.kind == "conv" or aligned(kernel.m, kernel.n, kernel.k, e)
    return quantization(kernel.m, kernel.n, kernel.k, r.sm_count, kernel.groups) * \
        tile_efficiency(kernel.m, kernel.n, kernel.k, peak, r, staged, e)


def gemm_peak(kernel: Kernel, r: Rates) -> tuple[float, int]:
    """The achievable FLOP/s of a GEMM or convolution and its operands' element size: fp8's (one byte) for an fp8
    GEMM on a GPU that runs them, else the precision's."""
    if kernel.fp8 and r.fp8_flops:
        return r.fp8_flops, 1
    return (r.conv_flops if kernel.kind == "conv" else r.matmul_flops), r.element_bytes


def roofline_seconds(kernel: Kernel, r: Rates) -> float:
    """What the roofline's two resources explain of a kernel (x its count): its FLOPs at the tensor cores'
    achievable rate over the tiles it fills (matrix products, attention) or its bytes at the HBM's, whichever
    is longer. The rest of a kernel's time (a tile's loads not overlapped, instruction issue, latency, the
    launch and tail) is the SMs' own."""
    if kernel.kind == "host" or r.attention_kernel in kernel.saved_with:
        return 0.0
    memory_s = kernel.bytes / r.bandwidth_bytes_per_s
    compute_s = 0.0
    if kernel.kind in ("matmul", "conv"):
        peak = gemm_peak(kernel, r)[0]
        compute_s = kernel.flops / (peak * quantization(kernel.m, kernel.n, kernel.k, r.sm_count, kernel.groups))
    elif kernel.kind == "attention":
        compute_s = kernel.flops / attention_rate(kernel, r)
    return kernel.count * max(compute_s, memory_s)


_MLP = ("w1 (gate)", "w3 (up)", "w2 (down)", "fc out", "fc ", "experts w", "shared w")
_PROJECTIONS = ("wq", "wk", "wv", "qkv", "attention out")


def category_of(kernel: Kernel, transformer: bool) -> str:
    """The category of one of the step model's kernels, by its kind and name."""
    name = kernel.name
    if kernel.kind == "attention":
        return "attention"
    if kernel.kind == "conv":
        return "conv"
    if kernel.kind == "matmul":
        if not transformer:
            return "matmul: other"
        if name.startswith("head"):
            return "matmul: head"
        if name.startswith(_MLP) or name == "fc":
            return "matmul: MLP"
        return "matmul: attention projections" if name.startswith(_PROJECTIONS) else "matmul: other"
    if name.startswith("bn"):
        return "batch norm"
    if "norm" in name:
        return "norm"
    if name.startswith("rotary"):
        return "rotary"
    if name.startswith(("embedding", "cross-entropy")):
        return "embedding/loss"
    if " step" in name or name.startswith("gradient accumulation"):
        return "optimizer"
    if name.startswith("FSDP"):
        return "FSDP copies"
    if name.startswith(("DDP", GQA_EXPANSION)) or any(w in name for w in ("permute", "cast", "to fp32", "transpose",
                                                                           "joined")):
        return "copies/casts"
    return "elementwise/activation"


@dataclass(frozen=True)
class CategoryCalibration:
    """A profile's measured kernel time per category on the GPU that ran it (``rates``: that GPU's, undisturbed
    by any calibration), as ``ratios``: measured / roofline time of the category's kernels there. Moving a
    kernel to the GPU being predicted: its roofline time there plus what the measured GPU spent beyond its
    roofline, moved by SM count x clock (the SMs' own time: issue, latency, loads a tile does not overlap);
    a category measured below its roofline (the model counts more traffic than the kernels make) keeps its
    ratio to the roofline. A category the profile did not measure is priced from the datasheet."""

    rates: Rates
    ratios: tuple[tuple[str, float], ...]
    transformer: bool = True

    def seconds(self, kernel: Kernel, r: Rates) -> float:
        plain = replace(r, calibrated=None, factor=1.0)
        q = dict(self.ratios).get(category_of(kernel, self.transformer))
        if q is None:
            return kernel_seconds(kernel, plain)
        roof = roofline_seconds(kernel, plain)
        if q < 1:
            return q * roof
        sm_ratio = self.rates.issue_per_s / r.issue_per_s if r.issue_per_s else 1.0
        return roof + (q - 1) * roofline_seconds(kernel, self.rates) * sm_ratio


def launches_of(kernel: Kernel) -> int:
    """Kernels the GPU runs for one of the model's kernels (once), each paying the launch floor: as many as it
    says, else a memory op one per aten op it issues, a matrix product or attention one."""
    if kernel.launches:
        return kernel.launches
    if kernel.kind == "host":
        return 0
    return max(1, kernel.ops) if kernel.kind == "memory" else 1


def total_seconds(kernels: list[Kernel], r: Rates) -> float:
    return sum(kernel_seconds(k, r) for k in kernels)


def bound_of(kernel: Kernel, r: Rates) -> str:
    """Which side of the roofline limits a kernel: compute, memory or launch."""
    memory_s = kernel.bytes / r.bandwidth_bytes_per_s
    t = kernel_seconds(kernel, replace(r, factor=1.0)) / kernel.count
    if t <= r.kernel_floor_s * launches_of(kernel):
        return "launch"
    return "memory" if memory_s >= t * (1 - 1e-9) else "compute"


def issue_seconds(kernel: Kernel, r: Rates | None = None) -> float:
    """What the host spends issuing one kernel's ops from eager PyTorch (x its count): plain ops through the
    dispatcher, ops on DTensors through DTensor's dispatch as well (``r``'s measured costs, else the stated
    allowances)."""
    if r is not None and r.attention_kernel in kernel.saved_with:
        return 0.0
    plain = kernel.ops - kernel.dtensor_ops
    per_op, per_dtensor_op = (r.host_s_per_op, r.dtensor_host_s_per_op) if r is not None else \
        (HOST_SECONDS_PER_OP, DTENSOR_HOST_SECONDS_PER_OP)
    return (per_op * plain + per_dtensor_op * kernel.dtensor_ops) * kernel.count


def host_seconds(kernels: list[Kernel], r: Rates | None = None) -> float:
    """What the host spends issuing ``kernels`` from eager PyTorch (x their counts)."""
    return sum(issue_seconds(k, r) for k in kernels)
