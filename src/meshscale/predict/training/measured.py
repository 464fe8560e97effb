"""The step model's kernels priced from the kernel atlas (`meshscale.models.atlas`) where one was measured on a GPU
of the same family: matrix products, attention, memory-bound kernels, the launch floor and the host's cost per op.

A matrix product's share of the peak keeps the analytic model's shape (tile and wave quantization, the tiles'
main-loop share, `kernels.gemm_share`) and takes from the atlas what that shape leaves out: at each measured
M x N x K the ratio of the measured share to the analytic one, interpolated in log2 of M, N and K between the
grid's points (the grid's edge beyond them). So a shape between the measured ones keeps its own quantization,
and the library's real ceiling, tile choice and epilogue come from measurement. Attention takes the measured
FLOP/s of the kernel SDPA runs (or the one named) for the head dimension (the nearest measured) and the sequence
(log-interpolated), averaged over the grouped-query ratios measured (they differ by a few percent). Memory-bound
kernels follow the measured copy curve at their bytes (the launch and tail of small copies included), times
their category's measured ratio to that curve (a norm or the loss is slower than a copy of its bytes).

A GPU of the atlas's family but another SKU takes the measured shares of its own datasheet peak and bandwidth
(the fractions carry over within a generation); other families keep the analytic model."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from functools import lru_cache
from math import log2
from typing import Callable

from meshscale.models.atlas import BlockPoint, KernelAtlas, MEMORY_CATEGORIES, shipped_atlases
from meshscale.predict.training.hardware import GpuSpec

# a generation no atlas measured takes the nearest older one's measured shares of its own peaks (as the attention
# fractions of kernels.py take Hopper's for Blackwell); older generations keep the analytic model
FAMILY_FALLBACK = {"blackwell": "hopper"}
# precision -> the atlas's GEMM dtype (fp8 by torchao's recipe: one scale per tensor, or per row)
DTYPES = {"bf16": "bf16", "fp16": "bf16", "fp32": "fp32", "tf32": "tf32", "fp8-tensorwise": "fp8-tensorwise",
          "fp8-rowwise": "fp8-rowwise"}
LAYOUTS = {"dgrad": "nn", "wgrad": "tn"}   # a product's name suffix -> the layout measured (else "nt")


@dataclass(frozen=True)
class MeasuredKernels:
    """One atlas as it prices kernels on one GPU in one precision."""

    atlas: KernelAtlas
    dtype: str
    atlas_peak_flops: float          # the atlas GPU's datasheet peak for ``dtype``
    bandwidth_ratio: float           # the atlas GPU's datasheet bandwidth over this GPU's
    # the compiled blocks' ratio per (shape, precision), found once (kept on the instance: tests make many)
    block_ratios: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    @property
    def stream_fraction(self) -> float:
        return self.atlas.stream_fraction

    @property
    def eager_floor_s(self) -> float:
        return self.atlas.eager_kernel_floor_s or self.atlas.kernel_floor_s

    def gemm_share(self, m: int, n: int, k: int, layout: str, analytic: Callable[[int, int, int], float],
                   own: float | None = None, analytic_key: tuple | None = None) -> float:
        """Share of this GPU's datasheet peak an M x N x K product of ``layout`` reaches (see the module): its own
        analytic share (``own``, default ``analytic(m, n, k)``) times the measured / analytic ratio around it.
        ``analytic_key`` names the analytic model's GPU and precision: the ratio is kept per shape under it (a
        search prices the same shapes thousands of times)."""
        key = (id(self), m, n, k, layout, analytic_key) if analytic_key is not None else None
        if key is None or key not in _RATIOS:
            ratio = self._log_ratio(m, n, k, layout, analytic)
            if key is None:
                own = analytic(m, n, k) if own is None else own
                return own * 2 ** ratio
            _RATIOS[key] = ratio
        own = analytic(m, n, k) if own is None else own
        return own * 2 ** _RATIOS[key]

    def _grid(self, layout: str) -> tuple[dict, list]:
        """The measured shares of ``layout`` (all of the dtype's where it has none) and the grid's axes."""
        key = (id(self), layout)
        if key not in _GRIDS:
            points = {(p.m, p.n, p.k): p.flops_per_s / self.atlas_peak_flops
                      for p in self.atlas.gemm_points(self.dtype) if p.layout == layout}
            if not points:
                points = {(p.m, p.n, p.k): p.flops_per_s / self.atlas_peak_flops
                          for p in self.atlas.gemm_points(self.dtype)}
            _GRIDS[key] = points, [sorted({key[i] for key in points}) for i in range(3)]
        return _GRIDS[key]

    def _log_ratio(self, m: int, n: int, k: int, layout: str, analytic: Callable[[int, int, int], float]) -> float:
        """log2 of measured / analytic around M x N x K, interpolated in log2 of each (0 with no neighbour)."""
        points, axes = self._grid(layout)
        weights = [_bracket(axis, value) for axis, value in zip(axes, (m, n, k))]
        total = ratio = 0.0
        for (m0, wm) in weights[0]:
            for (n0, wn) in weights[1]:
                for (k0, wk) in weights[2]:
                    w = wm * wn * wk
                    if w and (m0, n0, k0) in points:
                        total += w
                        ratio += w * log2(points[(m0, n0, k0)] / max(analytic(m0, n0, k0), 1e-9))
        return ratio / total if total else 0.0

    def attention_fraction(self, head_dim: int, seq_len: int, backward: bool, kernel: str) -> float | None:
        """The measured share of the dense bf16 peak of ``kernel``'s causal attention (None: not measured)."""
        points = self.atlas.attention_points(kernel, backward)
        if not points or not seq_len or not head_dim:
            return None
        dims = sorted({p.head_dim for p in points})
        dim = min(dims, key=lambda d: (abs(log2(d / head_dim)), -d))
        rates: dict[int, list[float]] = {}
        for p in points:
            if p.head_dim == dim:
                rates.setdefault(p.seq_len, []).append(p.flops_per_s)
        seqs = sorted(rates)
        value = sum(w * log2(statistics.fmean(rates[s])) for s, w in _bracket(seqs, seq_len) if w)
        return 2 ** value / self.atlas.dense_bf16_flops

    def block_ratio(self, shape, precision: str) -> float | None:
        """What the element-wise kernels of a torch.compile'd block like ``shape`` (`kernels.BlockShape`) take
        against their bytes at the copy's rate: the atlas's compiled blocks (train/blocks.py) of its rotary formulation in ``precision``
        (else another fp8 recipe's, else bf16's), of its kind of attention (grouped-query or not) where measured,
        the nearest in width (log of d_model and of the MLP's ratio to it; ties averaged): each block's measured
        element-wise seconds over the step model's bytes for the same block (`step.compiled_block_bytes`) at the
        atlas's copy rate; None where the atlas has none."""
        if not BLOCK_BYTES:   # nothing counts the model's bytes yet: not kept, asked again later
            return None
        key = (shape, precision)
        if key not in self.block_ratios:
            self.block_ratios[key] = _block_ratio(self.atlas, shape, precision)
        return self.block_ratios[key]

    def memory_seconds(self, nbytes: float, category: str, bandwidth_bytes_per_s: float,
                       backward: bool = False) -> float:
        """A memory-bound kernel of ``nbytes`` in ``category`` at ``bandwidth_bytes_per_s`` (the measured copy's
        rate, moved to this GPU's datasheet): its bytes at that rate times its category's measured ratio to the
        copy (a backward kernel: its category's backward ratio, where measured). The launch and tail are the
        step model's floor; the copy curve's middle sizes ran partly from L2
        (the same buffers again and again), which a step's fresh tensors do not."""
        # no kernel moves its bytes faster than the copy of them (a ratio measured below 1 is the copy's noise)
        ratio = max(1.0, self.atlas.memory_ops.get(category, 1.0)) if category in MEMORY_CATEGORIES else 1.0
        if backward and f"{category} backward" in self.atlas.memory_ops:   # its backward measured on its own
            ratio = max(1.0, self.atlas.memory_ops[f"{category} backward"])
        return nbytes / bandwidth_bytes_per_s * ratio


# per-process caches: the grid of an atlas's products by layout, and the measured / analytic ratio per shape
# (MeasuredKernels are made once per GPU and precision and kept, so their ids stay theirs)
_GRIDS: dict = {}
_RATIOS: dict = {}


# what the step model counts for an atlas block (`step.compiled_block_bytes`): the model's kernels are built above
# this module, which prices them, so step.py hands its count down when it loads; until then (nothing has built a
# step) no compiled block is read
BLOCK_BYTES: list[Callable[[BlockPoint], float]] = []


def outside_block(name: str) -> bool:
    """A layer's memory op that runs outside its block's graph: FSDP2's copies and its cast of the gradients
    to fp32 for the reduce-scatter, DDP's buckets."""
    return name.startswith(("FSDP", "DDP")) or "gradients to fp32" in name


def _block_ratio(atlas: KernelAtlas, shape, precision: str) -> float | None:
    count = BLOCK_BYTES[-1]
    stream_bytes_per_s = atlas.memory_bandwidth_bytes_per_s * atlas.stream_fraction
    compiled = [p for p in atlas.blocks if p.compiled and p.style == shape.style]
    for want in (precision, "fp8-" if precision.startswith("fp8-") else precision, "bf16"):
        points = [p for p in compiled if p.precision.startswith(want)]
        if points:
            break
    else:
        return None
    grouped = shape.kv_heads < shape.heads
    points = [p for p in points if (p.kv_heads < p.heads) == grouped] or points

    def distance(p: BlockPoint) -> float:
        return abs(log2(p.d_model / shape.d_model)) + \
            abs(log2(p.ffn_dim / p.d_model * shape.d_model / shape.ffn_dim))
    nearest = min(distance(p) for p in points)
    logs = [log2(p.elementwise_s * stream_bytes_per_s / count(p)) for p in points if distance(p) <= nearest + 1e-9]
    return 2 ** statistics.fmean(logs)


def _bracket(axis: list[int], value: float) -> list[tuple[int, float]]:
    """The two grid points around ``value`` on ``axis`` and their weights, linear in log2 (the edge beyond)."""
    if value <= axis[0]:
        return [(axis[0], 1.0)]
    if value >= axis[-1]:
        return [(axis[-1], 1.0)]
    hi = next(i for i, a in enumerate(axis) if a >= value)
    lo = hi - 1
    w = log2(value / axis[lo]) / log2(axis[hi] / axis[lo])
    return [(axis[lo], 1.0 - w), (axis[hi], w)]


def _family(name: str) -> str:
    return GpuSpec(name, 1, 0.0, 0.0, 0.0, None, None, None).family


@lru_cache(maxsize=None)
def measured_kernels(gpu: GpuSpec, precision: str) -> MeasuredKernels | None:
    """The atlas that prices ``gpu`` in ``precision``: its own GPU's, else the nearest in bandwidth of its
    family's; None where none of its family was measured or the atlas has no products of that dtype."""
    dtype = DTYPES.get(precision)
    family = gpu.family if any(_family(a.gpu) == gpu.family for a in shipped_atlases()) else \
        FAMILY_FALLBACK.get(gpu.family, gpu.family)
    same = [a for a in shipped_atlases() if _family(a.gpu) == family and family != "unknown"]
    if not same or dtype is None or not gpu.memory_bandwidth_bytes_per_s:
        return None
    atlas = next((a for a in same if a.gpu == gpu.model), None) or \
        min(same, key=lambda a: abs(log2(a.memory_bandwidth_bytes_per_s / gpu.memory_bandwidth_bytes_per_s)))
    if not atlas.gemm_points(dtype):
        return None
    from meshscale.topology.nvml_discovery import model_facts

    facts = model_facts(atlas.gpu)[0]
    peak = {"bf16": atlas.dense_bf16_flops, "fp32": facts.get("fp32_flops"), "tf32": facts.get("tf32_flops"),
            "fp8-tensorwise": facts.get("fp8_flops"), "fp8-rowwise": facts.get("fp8_flops")}[dtype]
    if not peak:
        return None
    return MeasuredKernels(atlas, dtype, float(peak), atlas.memory_bandwidth_bytes_per_s / gpu.memory_bandwidth_bytes_per_s)


@dataclass(frozen=True)
class HostCosts:
    """Eager PyTorch's host time per op: a transformer's ops, what DTensor's dispatch makes of one, a CNN's."""

    per_op_s: float
    dtensor_per_op_s: float
    conv_per_op_s: float


@lru_cache(maxsize=None)
def host_costs() -> HostCosts | None:
    """The median over every machine the shipped atlases were measured on (host work, whatever the GPU); None
    where none is shipped."""
    samples = [s for a in shipped_atlases() for s in a.host_samples] or \
        [{"host_s_per_op": a.host_s_per_op, "dtensor_host_s_per_op": a.dtensor_host_s_per_op,
          "conv_host_s_per_op": a.conv_host_s_per_op} for a in shipped_atlases()]
    samples = [s for s in samples if s.get("host_s_per_op") and s.get("dtensor_host_s_per_op")]
    if not samples:
        return None
    median = lambda key: statistics.median(s[key] for s in samples if s.get(key))  # noqa: E731
    conv = [s for s in samples if s.get("conv_host_s_per_op")]
    return HostCosts(median("host_s_per_op"), median("dtensor_host_s_per_op"),
                     median("conv_host_s_per_op") if conv else median("host_s_per_op"))


def layout_of(name: str) -> str:
    """The measured layout a step-model product stands for, by its name."""
    return next((layout for suffix, layout in LAYOUTS.items() if name.endswith(suffix)), "nt")


def compute_source(gpu: GpuSpec, precision: str) -> str:
    """What the compute of a prediction without a profile comes from, in words: the datasheet's roofline, and
    the kernel atlas where one of the GPU's family was measured (fp8: its bf16 kernels, around the fp8 GEMMs)."""
    measured = measured_kernels(gpu, "bf16" if precision == "fp8" else precision)
    if measured is None:
        return f"datasheet roofline ({gpu.model})"
    atlas = measured.atlas
    on = "" if atlas.gpu == gpu.model else f", measured on {atlas.gpu}"
    return f"datasheet + kernel atlas ({gpu.model}{on}, {atlas.date})"
