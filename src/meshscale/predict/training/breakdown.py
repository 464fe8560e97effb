"""The step model's kernels on one rank grouped by category (matrix products by shape class, attention, norms,
element-wise ops, rotary, embedding and loss, the optimizer, copies and casts), each category's predicted GPU
time and kernel count: what a profiler's per-category table is held against (benchmarks/predict_kernels_gpu.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from meshscale.predict.training.kernels import Kernel, Rates, kernel_seconds, launches_of
from meshscale.predict.training.step import TrainingJob, step_kernels

CATEGORIES = ("matmul: attention projections", "matmul: MLP", "matmul: head", "matmul: other", "attention",
              "conv", "batch norm", "norm", "elementwise/activation", "rotary", "embedding/loss", "optimizer",
              "copies/casts", "FSDP copies", "communication", "other")

_MLP = ("w1 (gate)", "w3 (up)", "w2 (down)", "fc out", "fc ")
_PROJECTIONS = ("wq", "wk", "wv", "qkv", "attention out")


@dataclass(frozen=True)
class CategoryTime:
    """One category's predicted GPU seconds and kernel launches per step."""

    category: str
    seconds: float
    kernels: int


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
    if name.startswith("DDP") or "cast" in name or "to fp32" in name or "transpose" in name or "joined" in name:
        return "copies/casts"
    return "elementwise/activation"


def step_kernel_list(job: TrainingJob) -> list[Kernel]:
    """Every kernel one rank runs in one step (counts multiplied out: micro-batches, layers of its stage)."""
    k = step_kernels(job)
    per_layer = k.layer.forward + k.layer.backward + k.layer.recompute
    every = ([replace(x, count=x.count * k.stage_layers * k.micro_batches) for x in per_layer]
             + [replace(x, count=x.count * k.micro_batches) for x in k.ends.forward + k.ends.backward]
             + list(k.per_step))
    return [x for x in every if x.kind != "host"]     # host work alone runs nothing


def launches(kernel: Kernel) -> int:
    """Kernels the GPU runs for one of the model's kernels, x its count."""
    return launches_of(kernel) * kernel.count


def predicted_categories(job: TrainingJob, r: Rates) -> list[CategoryTime]:
    """The step's predicted GPU time and launches per category (categories with no kernel left out)."""
    seconds: dict[str, float] = {}
    counts: dict[str, int] = {}
    for k in step_kernel_list(job):
        c = category_of(k, job.model is not None)
        seconds[c] = seconds.get(c, 0.0) + kernel_seconds(k, r)
        counts[c] = counts.get(c, 0) + launches(k)
    return [CategoryTime(c, seconds[c], counts[c]) for c in CATEGORIES if c in seconds]
