"""The step model's kernels on one rank grouped by category (matrix products by shape class, attention, norms,
element-wise ops, rotary, embedding and loss, the optimizer, copies and casts), each category's predicted GPU
time and kernel count: what a profiler's per-category table is held against (benchmarks/predict_kernels_gpu.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from meshscale.predict.training.kernels import Kernel, Rates, category_of, kernel_seconds, launches_of
from meshscale.predict.training.step import TrainingJob, step_kernels
from meshscale.results import KERNEL_CATEGORIES as CATEGORIES


@dataclass(frozen=True)
class CategoryTime:
    """One category's predicted GPU seconds and kernel launches per step."""

    category: str
    seconds: float
    kernels: int


def step_kernel_list(job: TrainingJob) -> list[Kernel]:
    """Every kernel one rank runs in one step (counts multiplied out: micro-batches, layers of its stage)."""
    return [x for x in step_kernels(job).every() if x.kind != "host"]     # host work alone runs nothing


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
