"""Compute time of one training step on one GPU as a function of the per-GPU batch.

A profile is a few measured (batch, step time) points, from `meshscale train --profile-batches` (a Result of
kind "train" with meta.profile true), a documented one (`documented_profile`), or a line built from the model's
FLOPs and the GPU's rate at a stated efficiency. Between points it interpolates linearly; outside it extends the line through the two nearest
points, so the fixed per-step cost that makes small batches inefficient is kept.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from meshscale.errors import MeshscaleError
from meshscale.predict.gradient_tensors import GradientTensor
from meshscale.results import Result


@dataclass(frozen=True)
class MeasuredCategories:
    """GPU seconds per step of each kernel category, measured at one batch (`train --profile-batches` on a GPU:
    its largest batch), and the sum of every kernel's time per step."""

    batch_per_rank: int
    seconds_per_step: tuple[tuple[str, float], ...]
    kernel_s_per_step: float


@dataclass
class ComputeProfile:
    """Step time (forward + backward + optimizer) of one GPU per per-GPU batch size."""

    batches: list[int]
    step_time_s: list[float]
    gpu_model: str = ""
    gpu_flops: float | None = None   # the profiled GPU's peak rate (FP32 FLOP/s), to rescale to another GPU
    source: str = ""
    notes: list[str] = field(default_factory=list)
    gpu_base_flops: float | None = None  # its FP32 rate at the base clock, where known (`sustained_ratio`)
    gradients: tuple[GradientTensor, ...] | None = None  # when backward completed each gradient, as measured
    kernel_categories: MeasuredCategories | None = None  # the GPU's kernel time per category, where measured
    precision: str | None = None     # what it trained in, where the result says

    def __post_init__(self) -> None:
        if not self.batches or len(self.batches) != len(self.step_time_s):
            raise MeshscaleError("a compute profile needs at least one (batch, step time) point")
        order = np.argsort(self.batches)
        self.batches = [int(self.batches[i]) for i in order]
        self.step_time_s = [float(self.step_time_s[i]) for i in order]
        if len(set(self.batches)) != len(self.batches) or min(self.step_time_s) <= 0:
            raise MeshscaleError("profile points must have distinct batches and positive step times")

    def step_time(self, batch: float) -> float:
        """Seconds per step at per-GPU ``batch`` (interpolated; a line beyond the measured range)."""
        b, t = self.batches, self.step_time_s
        if len(b) == 1:  # one point: no fixed cost known, time proportional to the batch
            return t[0] * batch / b[0]
        if b[0] <= batch <= b[-1]:
            return float(np.interp(batch, b, t))
        i = 0 if batch < b[0] else len(b) - 2
        slope = (t[i + 1] - t[i]) / (b[i + 1] - b[i])
        floor = 0.05 * t[0] * batch / b[0]  # never below a sliver of proportional time (a noisy slope)
        return max(t[i] + slope * (batch - b[i]), floor)

    def scaled(self, factor: float, note: str) -> "ComputeProfile":
        """The same profile with every time multiplied by ``factor`` (another GPU, a calibration)."""
        return replace(self, step_time_s=[x * factor for x in self.step_time_s], notes=self.notes + [note])


def sustained_ratio(profile: ComputeProfile, gpu_attrs: dict) -> tuple[float, str] | None:
    """How much slower a GPU of catalog ``gpu_attrs`` runs ``profile``'s steps than the profiled GPU, and which
    rate says so; None when either rate is unknown. A training step keeps the GPU at full load, where GPU Boost
    raises the clock only as far as the power cap allows; what the datasheet guarantees there is the base clock.
    So the FP32 rates at the base clocks are compared when both GPUs have one (P100 SXM2 1328 MHz at 300 W,
    P100 PCIe 1126 MHz at 250 W: 1.18, against 1.14 at the boost clocks), else the peak rates."""
    base, peak = gpu_attrs.get("fp32_flops_base"), gpu_attrs.get("fp32_flops")
    if profile.gpu_base_flops and base:
        return profile.gpu_base_flops / float(base), "FP32 at base clock"
    if profile.gpu_flops and peak:
        return profile.gpu_flops / float(peak), "FP32 peak"
    return None


def linear_profile(per_sample_s: float, fixed_s: float, batches=(1, 8, 64, 256), **kw) -> ComputeProfile:
    """A profile t(b) = fixed_s + b x per_sample_s, sampled at ``batches``."""
    return ComputeProfile(list(batches), [fixed_s + b * per_sample_s for b in batches], **kw)


# ResNet-50 on one Tesla P100 SXM2 in FP32. The rate at batch 64 is the DGX-1 whitepaper's one-GPU bar
# (figures 5 and 6, CNTK: about 200 img/s). How the step time falls with the batch is taken from TensorFlow's
# published benchmarks on the same GPU (tensorflow.org/performance/benchmarks, DGX-1, ResNet-50, synthetic data,
# 2017): 219 img/s at batch 64 and 195 at batch 32, a line t(b) = fixed + b x per-image whose fixed part (36 ms:
# launches, per-layer work that does not shrink with the batch, the update) is what makes small batches slow.
P100_RESNET50_IMAGES_PER_S = 200.0
P100_TENSORFLOW_RESNET50_IMAGES_PER_S = {64: 219.0, 32: 195.0}
P100_FP32_FLOPS = 10.6e12
P100_FP32_FLOPS_BASE = 3584 * 2 * 1.328e9  # 3584 FP32 cores x 2 (FMA) at the SXM2's 1328 MHz base clock


def p100_resnet50_profile() -> ComputeProfile:
    """The documented single-P100 ResNet-50 profile: 200 img/s at batch 64, TensorFlow's fixed step cost."""
    (b1, r1), (b2, r2) = sorted(P100_TENSORFLOW_RESNET50_IMAGES_PER_S.items())
    fixed_s = b1 / r1 - b1 * (b2 / r2 - b1 / r1) / (b2 - b1)
    per_sample_s = (64 / P100_RESNET50_IMAGES_PER_S - fixed_s) / 64
    return linear_profile(per_sample_s, fixed_s, gpu_model="Tesla P100-SXM2-16GB", gpu_flops=P100_FP32_FLOPS,
                          gpu_base_flops=P100_FP32_FLOPS_BASE,
                          source="documented P100 ResNet-50 profile (DGX-1 whitepaper 1-GPU rate, TensorFlow "
                                 "benchmarks' batch dependence)",
                          notes=[f"compute: documented P100 ResNet-50, {P100_RESNET50_IMAGES_PER_S:.0f} img/s at batch 64, "
                                 f"{fixed_s * 1e3:.1f} ms fixed + {per_sample_s * 1e3:.2f} ms per image"])


def documented_profile(model: str, gpu_model: str) -> ComputeProfile | None:
    """A published profile of ``model`` on a GPU of ``gpu_model``'s family (rescaled later by `sustained_ratio`)."""
    if model == "resnet50" and "P100" in gpu_model:
        return p100_resnet50_profile()
    return None


def flops_profile(flops_per_sample: float, gpu_flops: float, efficiency: float = 0.4, fixed_s: float = 0.005,
                  gpu_model: str = "") -> ComputeProfile:
    """A profile from the model's FLOPs per sample (forward + backward) and the GPU's peak rate, achieving
    ``efficiency`` of peak, plus ``fixed_s`` per step (launches, optimizer). Both are stated assumptions."""
    if not flops_per_sample or flops_per_sample <= 0:
        raise MeshscaleError("the model has no FLOPs per sample; give a measured --profile instead")
    if not gpu_flops or gpu_flops <= 0:
        raise MeshscaleError("the system's GPUs have no fp32_flops figure; give a measured --profile instead")
    if not 0 < efficiency <= 1:
        raise MeshscaleError(f"compute efficiency {efficiency} must be in (0, 1]")
    return linear_profile(flops_per_sample / (gpu_flops * efficiency), fixed_s, gpu_model=gpu_model,
                          gpu_flops=gpu_flops, source=f"FLOPs at {efficiency:.0%} of {gpu_flops / 1e12:.1f} TFLOP/s",
                          notes=[f"compute from FLOPs: {efficiency:.0%} of peak, {fixed_s * 1e3:.1f} ms fixed per step"])


def profile_from_result(result: Result, gpu_flops: float | None = None) -> ComputeProfile:
    """The profile in a `meshscale train --profile-batches` result (rows: batch_per_rank, step_time_s;
    several rows per batch are averaged)."""
    if result.kind == "scale":
        return run_profile(result, gpu_flops)
    if result.kind != "train" or not result.meta.get("profile"):
        raise MeshscaleError(f"--profile wants a single-GPU profile (kind 'train' with meta.profile true) or a scale run "
                             f"with a 1-worker row, got kind {result.kind!r}; make one with `meshscale train "
                             "--profile-batches ...`")
    times: dict[int, list[float]] = {}
    for row in result.rows:
        if "batch_per_rank" in row and row.get("step_time_s"):
            times.setdefault(int(row["batch_per_rank"]), []).append(float(row["step_time_s"]))
    if not times:
        raise MeshscaleError("the profile has no rows with batch_per_rank and step_time_s")
    model = _gpu_of(result)
    try:
        gradients = tuple(GradientTensor(int(e), float(share)) for e, share in result.meta.get("gradients") or ()) or None
    except (TypeError, ValueError):
        raise MeshscaleError("the profile's meta.gradients is not a list of [elements, ready share] pairs") from None
    return ComputeProfile(list(times), [float(np.median(v)) for v in times.values()], model, gpu_flops, gradients=gradients,
                          source=f"measured profile ({result.meta.get('model', '?')} on {model or 'this machine'})",
                          kernel_categories=_categories(result.meta.get("kernel_categories")),
                          precision=precision_of(result.meta))


def precision_of(meta: dict) -> str | None:
    """The precision a train or scale result trained in, where it says."""
    speed = (meta.get("config") or {}).get("speed") or {}
    found = meta.get("precision", speed.get("precision"))
    return str(found) if found else None


def _categories(raw) -> MeasuredCategories | None:
    """A profile's meta.kernel_categories (`train.kernel_categories.kernel_categories`), checked."""
    if raw is None:
        return None
    from meshscale.results import KERNEL_CATEGORIES as CATEGORIES
    try:
        seconds = {str(c): float(v) for c, v in raw["seconds_per_step"].items()}
        found = MeasuredCategories(int(raw["batch_per_rank"]), tuple(seconds.items()), float(raw["kernel_s_per_step"]))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise MeshscaleError("the profile's meta.kernel_categories wants batch_per_rank, kernel_s_per_step and "
                             "seconds_per_step {category: seconds}") from None
    unknown = sorted(set(seconds) - set(CATEGORIES))
    if unknown:
        raise MeshscaleError(f"the profile's meta.kernel_categories has an unknown category {unknown[0]!r} "
                             f"(known: {', '.join(CATEGORIES)})")
    if found.batch_per_rank < 1 or min(seconds.values(), default=0.0) < 0:
        raise MeshscaleError("the profile's meta.kernel_categories: batch_per_rank >= 1 and seconds >= 0")
    return found


def _step_time_s(row: dict) -> float | None:
    """A row's step time: as timed, or (a run with --no-timing) its global batch over its throughput."""
    if row.get("step_time_s"):
        return float(row["step_time_s"])
    rate, batch = row.get("throughput_samples_per_s"), row.get("global_batch") or row.get("batch_per_rank")
    return float(batch) / float(rate) if rate and batch else None


def _gpu_of(result: Result) -> str:
    """The GPU a result was measured on (its machine record), else its device."""
    gpus = result.machine.get("gpus") or []
    return str(gpus[0] if gpus else result.meta.get("device", ""))


def run_profile(scale: Result, gpu_flops: float | None = None) -> ComputeProfile:
    """The compute profile a scale run measured itself: the step time of its 1-worker rows (no exchange in
    them; without per-step timing, batch over throughput), else the compute and data time of its smallest world's row."""
    ones = {int(r["batch_per_rank"]): _step_time_s(r) for r in scale.rows if r.get("world_size") == 1 and _step_time_s(r)}
    if ones:
        return ComputeProfile(list(ones), list(ones.values()), _gpu_of(scale), gpu_flops,
                              source="calibrated from this run's 1-worker row", precision=precision_of(scale.meta))
    timed = [r for r in scale.rows if r.get("compute_s") and r.get("batch_per_rank")]
    if not timed:
        raise MeshscaleError("the scale run has no 1-worker row and no compute time to take the compute profile from; "
                             "include 1 in the world sizes")
    smallest = min(timed, key=lambda r: r["world_size"])
    return ComputeProfile([int(smallest["batch_per_rank"])], [smallest["compute_s"] + (smallest.get("data_s") or 0.0)],
                          _gpu_of(scale), gpu_flops, source=f"calibrated from this run's {smallest['world_size']}-worker row (its compute and "
                                 "data time)")
