"""Compute time of one training step on one GPU as a function of the per-GPU batch.

A profile is a few measured (batch, step time) points, from `meshscale train --profile-batches` (a Result of
kind "train" with meta.profile true), or a line built from the model's FLOPs and the GPU's rate at a stated
efficiency. Between points it interpolates linearly; outside it extends the line through the two nearest
points, so the fixed per-step cost that makes small batches inefficient is kept.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from meshscale.errors import MeshscaleError
from meshscale.results import Result


@dataclass
class ComputeProfile:
    """Step time (forward + backward + optimizer) of one GPU per per-GPU batch size."""

    batches: list[int]
    step_time_s: list[float]
    gpu_model: str = ""
    gpu_flops: float | None = None   # the profiled GPU's rate (FP32 FLOP/s), to rescale to another GPU
    source: str = ""
    notes: list[str] = field(default_factory=list)

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
        return ComputeProfile(self.batches, [x * factor for x in self.step_time_s], self.gpu_model, self.gpu_flops,
                              self.source, self.notes + [note])


def linear_profile(per_sample_s: float, fixed_s: float, batches=(1, 8, 64, 256), **kw) -> ComputeProfile:
    """A profile t(b) = fixed_s + b x per_sample_s, sampled at ``batches``."""
    return ComputeProfile(list(batches), [fixed_s + b * per_sample_s for b in batches], **kw)


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
    if result.kind != "train" or not result.meta.get("profile"):
        raise MeshscaleError(f"--profile wants a single-GPU profile (kind 'train' with meta.profile true), got kind "
                             f"{result.kind!r}; make one with `meshscale train --profile-batches ...`")
    times: dict[int, list[float]] = {}
    for row in result.rows:
        if "batch_per_rank" in row and row.get("step_time_s"):
            times.setdefault(int(row["batch_per_rank"]), []).append(float(row["step_time_s"]))
    if not times:
        raise MeshscaleError("the profile has no rows with batch_per_rank and step_time_s")
    gpus = result.machine.get("gpus") or []
    model = gpus[0] if gpus else result.meta.get("device", "")
    return ComputeProfile(list(times), [float(np.median(v)) for v in times.values()], str(model), gpu_flops,
                          source=f"measured profile ({result.meta.get('model', '?')} on {model or 'this machine'})")
