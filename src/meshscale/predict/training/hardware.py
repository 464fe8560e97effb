"""A GPU's datasheet rates for the precision a run trains in, from the system's catalog entry (or the table of
known GPU models, topology/gpu_models.yaml: one row per SKU as sold): dense tensor-core FLOP/s per dtype, HBM
bandwidth, SM count, memory capacity, and its power: the board's TDP and, where a SKU ships capped below it, its
power limit.

A power limit below the TDP lowers the clock the SMs sustain under tensor-core work. Dynamic power is
P = a C V^2 f, and across the voltage-frequency curve the voltage rises with the clock (V ~ f), so the power a
clock draws grows as f^3 and the clock a power allows as P^(1/3) (Hennessy & Patterson, "Computer Architecture:
A Quantitative Approach", 6th ed., section 1.5, "Trends in Power and Energy"). The measured GEMM ceilings the
kernels are priced with (kernels.GEMM_CEILING) ran at the TDP, where dense matrix products are power-bound, so
under a limit L < TDP the tensor cores and the SMs' issue run (L / TDP)^(1/3) as fast (`power_clock_ratio`);
the static power's share is left out, which makes the drop smaller than the cubic law on the whole board would
(a cap never speeds a step). HBM's clock is its own: memory-bound kernels keep the datasheet bandwidth.

Precisions: bf16 and fp16 on their tensor cores; fp32 as PyTorch runs it by default, matmuls in true FP32
(torch.backends.cuda.matmul.allow_tf32 False, torch.get_float32_matmul_precision() "highest") and convolutions in
TF32 (torch.backends.cudnn.allow_tf32 True); tf32: fp32 tensors with matmuls on the TF32 tensor cores
(allow_tf32 True, or torch.set_float32_matmul_precision("high")), as frameworks set it for fp32 training."""
from __future__ import annotations

from dataclasses import dataclass

from meshscale.errors import MeshscaleError

STEP_PRECISIONS = ("bf16", "fp16", "fp32", "fp8", "tf32")  # what the step model prices
FULL_WIDTH = ("fp32", "tf32")   # precisions whose tensors are fp32 (4 bytes), whatever runs their matmuls


def storage_precision(precision: str) -> str:
    """The precision a job's tensors are stored in: fp32 for tf32 (only its matmuls differ)."""
    return "fp32" if precision in FULL_WIDTH else precision


@dataclass(frozen=True)
class GpuSpec:
    """What the roofline needs of one GPU."""

    model: str
    sm_count: int
    memory_bandwidth_bytes_per_s: float
    memory_bytes: float
    fp32_flops: float
    tf32_flops: float | None
    bf16_flops: float | None
    fp16_flops: float | None
    fp8_flops: float | None = None   # dense fp8 tensor-core peak (Hopper, Ada and later)
    tdp_w: float | None = None            # the board's thermal design power (datasheet)
    power_limit_w: float | None = None    # the limit it runs under, where below the TDP (a SKU's default cap)

    @property
    def power_clock_ratio(self) -> float:
        """The tensor cores' sustained clock under the power limit over theirs at the TDP: (limit / TDP)^(1/3)
        below the TDP, else 1 (see the module's docstring)."""
        if not self.tdp_w or not self.power_limit_w or self.power_limit_w >= self.tdp_w:
            return 1.0
        return (self.power_limit_w / self.tdp_w) ** (1 / 3)

    @property
    def family(self) -> str:
        """Architecture generation, from the model name (what the attention kernel's measured efficiency and
        the catalog's rows go by)."""
        name = self.model.upper()
        for key, family in (("B200", "blackwell"), ("B300", "blackwell"), ("H100", "hopper"), ("H200", "hopper"),
                            ("GH200", "hopper"), ("A100", "ampere"), ("A10", "ampere"), ("L40", "ada"),
                            ("V100", "volta"), ("T4", "turing"), ("P100", "pascal")):
            if key in name:
                return family
        return "unknown"

    @property
    def fp32_lanes_per_sm(self) -> int:
        """FP32 cores per SM (the architecture whitepapers): 64 on GA100 (A100, A800, A30), Volta, Turing and
        Pascal's GP100; 128 on GA10x (A10, A40), Ada, Hopper and Blackwell."""
        name = self.model.upper()
        if self.family in ("volta", "turing", "pascal") or any(k in name for k in ("A100", "A800", "A30")):
            return 64
        return 128

    @property
    def clock_hz(self) -> float:
        """The boost clock the datasheet's FP32 rate is quoted at: that rate is one fused multiply-add (two FLOPs)
        per FP32 core per clock (H100 SXM: 67 TFLOP/s over 132 SMs x 128 cores x 2 = 1.98 GHz)."""
        return self.fp32_flops / (2.0 * self.sm_count * self.fp32_lanes_per_sm)

    def matmul_flops(self, precision: str, conv: bool = False) -> float:
        """Dense peak for a matrix multiplication in ``precision``. fp32: PyTorch runs matmuls in true fp32
        (torch.backends.cuda.matmul.allow_tf32 defaults to False) but lets cuDNN use TF32 for convolutions
        (torch.backends.cudnn.allow_tf32 defaults to True), where the GPU has TF32; tf32: both on TF32."""
        if precision == "fp32":
            return (self.tf32_flops or self.fp32_flops) if conv else self.fp32_flops
        if precision == "fp8":
            require_fp8(self)
            return float(self.fp8_flops)
        if precision == "tf32":
            if not self.tf32_flops:
                raise MeshscaleError(f"--precision tf32: the {self.model} has no TF32 tensor cores (Ampere and later "
                                     "do); use fp32")
            return float(self.tf32_flops)
        rate = self.bf16_flops if precision == "bf16" else self.fp16_flops
        if not rate:
            raise MeshscaleError(f"--precision {precision}: the {self.model} has no {precision} rate in the catalog "
                                 "(no tensor cores for it); use fp32" + (" or fp16" if self.fp16_flops else ""))
        return float(rate)


def require_fp8(gpu: GpuSpec) -> None:
    """Refuse, in one line, fp8 on a GPU (or device) without fp8 tensor cores (before Hopper and Ada)."""
    if not gpu.fp8_flops:
        raise MeshscaleError(f"--precision fp8: the {gpu.model} has no fp8 tensor cores (fp8 GEMMs need Hopper, Ada or "
                             "later); use bf16")


def gpu_spec(attrs: dict) -> GpuSpec:
    """A `GpuSpec` from a catalog GPU's attributes (model, sm_count, bandwidth, per-dtype FLOP/s, memory)."""
    from meshscale.topology.nvml_discovery import model_facts

    model = str(attrs.get("model", "unknown"))
    facts = {**model_facts(model)[0], **attrs}
    need = ("sm_count", "memory_bandwidth_bytes_per_s", "fp32_flops")
    missing = [k for k in need if not facts.get(k)]
    if missing:
        raise MeshscaleError(f"GPU {model}: the catalog has no {missing[0]}; add it to the system file")
    memory = facts.get("memory_bytes") or facts.get("memory_gib", 0) * (1 << 30)
    if not memory:
        raise MeshscaleError(f"GPU {model}: the catalog has no memory_bytes; add it to the system file")

    def rate(key: str) -> float | None:
        return float(facts[key]) if facts.get(key) else None
    return GpuSpec(model, int(facts["sm_count"]), float(facts["memory_bandwidth_bytes_per_s"]), float(memory),
                   float(facts["fp32_flops"]), rate("tf32_flops"), rate("bf16_flops"), rate("fp16_flops"),
                   rate("fp8_flops"), rate("tdp_w"), rate("power_limit_w"))


def known_gpus() -> list[str]:
    """The SKUs of the table of known GPU models, by name."""
    from meshscale.topology.nvml_discovery import gpu_models
    return [str(row["name"]) for row in gpu_models()[0]]


def sku_spec(name: str) -> GpuSpec:
    """The `GpuSpec` of a GPU named as NVML names it or as the table does ('H100 SXM', 'NVIDIA A100-SXM4-40GB'),
    or a one-line error listing the known SKUs (no default row: a price on an assumed GPU is not asked for)."""
    from meshscale.topology.nvml_discovery import model_facts

    if not model_facts(name)[1]:
        raise MeshscaleError(f"--gpu {name}: unknown GPU; known: {', '.join(known_gpus())}")
    return gpu_spec({"model": name})


def system_gpu(system: str) -> tuple[GpuSpec, int]:
    """The GPU of a catalog system (or file) and its GPUs per node."""
    from meshscale.topology import load_system
    from meshscale.topology.schema import require_devices

    topo = require_devices(load_system(system))
    devices = topo.devices()
    return gpu_spec(topo.nodes[devices[0]].attrs), len(devices)


def device_spec(attrs: dict) -> GpuSpec:
    """The `GpuSpec` of a device: a GPU's datasheet (`gpu_spec`), or, for a device without one (a CPU worker, a
    GPU the catalog lacks figures for), a spec with no rates (``sm_count`` 0): only a measured profile can time
    a step there."""
    try:
        return gpu_spec(attrs)
    except MeshscaleError:
        return GpuSpec(str(attrs.get("model") or attrs.get("name") or "device without a datasheet"), 0, 0.0,
                       float(attrs.get("memory_bytes") or 0.0), 0.0, None, None, None)
