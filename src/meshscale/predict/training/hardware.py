"""A GPU's datasheet rates for the precision a run trains in, from the system's catalog entry (or the table of
known GPU models): dense tensor-core FLOP/s per dtype, HBM bandwidth, SM count, memory capacity."""
from __future__ import annotations

from dataclasses import dataclass

from meshscale.errors import MeshscaleError

STEP_PRECISIONS = ("bf16", "fp16", "fp32", "fp8")  # what the step model prices


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
        (torch.backends.cudnn.allow_tf32 defaults to True), where the GPU has TF32."""
        if precision == "fp32":
            return (self.tf32_flops or self.fp32_flops) if conv else self.fp32_flops
        if precision == "fp8":
            require_fp8(self)
            return float(self.fp8_flops)
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
                   rate("fp8_flops"))


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
