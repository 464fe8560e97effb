"""GPU time per kernel category of `train`'s own step, measured under torch.profiler: what a profile's layer
timings are (`train --profile-batches` on a GPU) and what the step model's categories are held against
(benchmarks/predict_kernels_gpu.py).

A kernel's category comes from the ops that launched it (innermost first), the Python frames around them (the
module: RMSNorm, Embedding, the rotary function), its forward op when autograd launched it in backward, and the
annotations FSDP2 and the optimizers record. On a CPU the leaf ops stand for kernels.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from meshscale.results import KERNEL_CATEGORIES

if TYPE_CHECKING:   # torch is imported where a step runs: predictions read CATEGORIES without it
    import torch

CATEGORIES = KERNEL_CATEGORIES
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")
COPY_OPS = ("aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::cat", "aten::to",
            "aten::_foreach_copy_")


@dataclass(frozen=True)
class StepShapes:
    """What tells a transformer's matrix products apart: the head's vocabulary, the MLP's hidden width."""

    transformer: bool
    vocab: int = 0
    ffn: int = 0


@dataclass
class Measured:
    """Seconds and kernels per category over the traced steps, and the seconds of each kernel name."""

    seconds: dict = field(default_factory=lambda: defaultdict(float))
    counts: dict = field(default_factory=lambda: defaultdict(int))
    names: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))


def sync(device: torch.device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def trace(step: Callable[[int], object], first: int, steps: int, device: torch.device,
          detailed: bool) -> list[dict]:
    """The complete events of ``steps`` steps from ``first`` under torch.profiler (``detailed``: with shapes
    and Python stacks, which categorizing needs)."""
    from torch.profiler import ProfilerActivity, profile

    from meshscale.train.timing import quiet_profiler
    quiet_profiler()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=detailed, with_stack=detailed) as prof:
        for i in range(first, first + steps):
            step(i)
        sync(device)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def _host_chains(events: list[dict]) -> dict[int, list[int]]:
    """For each host event (index), the indices of the host events enclosing it on its thread, innermost first."""
    by_thread = defaultdict(list)
    for i, e in enumerate(events):
        if e.get("cat") in ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver"):
            by_thread[(e.get("pid"), e.get("tid"))].append(i)
    chains: dict[int, list[int]] = {}
    for idx in by_thread.values():
        idx.sort(key=lambda i: (events[i]["ts"], -events[i]["dur"]))
        stack: list[int] = []
        for i in idx:
            ts = events[i]["ts"]
            # the thread's events nest: an event encloses this one if it ends no earlier
            while stack and events[stack[-1]]["ts"] + events[stack[-1]]["dur"] < ts + events[i]["dur"] - 1e-3:
                stack.pop()
            chains[i] = stack[::-1]
            stack.append(i)
    return chains


def _dims(e: dict) -> set[int]:
    dims = set()
    for shape in (e.get("args") or {}).get("Input Dims") or []:
        if isinstance(shape, list):
            dims.update(d for d in shape if isinstance(d, int))
    return dims


def _by_ops(names: list[str], ops: list[dict], kernel: str, shapes: StepShapes) -> str | None:
    """A category from the ops that launched a kernel (innermost first) and the kernel's name."""
    k = kernel.lower()
    joined = " ".join(names).lower()
    if "scaled_dot_product" in joined or "flash" in joined or "efficient_attention" in joined or "flash" in k \
            or "fmha" in k:
        return "attention"
    if "convolution" in joined or "cudnn_conv" in joined:
        return "conv"
    if "batch_norm" in joined:
        return "batch norm"
    mm = next((o for n, o in zip(names, ops) if n in MATMUL_OPS), None)
    if mm is not None or "gemm" in k or "nvjet" in k:
        if not shapes.transformer:
            return "matmul: other"
        dims = _dims(mm) if mm is not None else set()
        if shapes.vocab in dims:
            return "matmul: head"
        if shapes.ffn in dims:
            return "matmul: MLP"
        return "matmul: attention projections" if dims else "matmul: other"
    if "layer_norm" in joined or "rms_norm" in joined:
        return "norm"
    if any(w in joined for w in ("embedding", "log_softmax", "nll_loss", "cross_entropy")):
        return "embedding/loss"
    return None


def _by_module(python: list[str]) -> str | None:
    """A category from the Python frames around a forward op (innermost first)."""
    for p in python:
        if "apply_rotary" in p:
            return "rotary"
        if p.startswith("nn.Module: "):
            module = p[len("nn.Module: "):].split("_")[0]
            if module in ("RMSNorm", "LayerNorm"):
                return "norm"
            if module == "Embedding":
                return "embedding/loss"
            if module in ("BatchNorm2d",):
                return "batch norm"
        if "loss_fn" in p or "token_loss" in p:
            return "embedding/loss"
    return None


def categorize(events: list[dict], shapes: StepShapes, device: torch.device) -> Measured:
    """Each kernel (CPU: each leaf op) of a detailed trace in a category."""
    chains = _host_chains(events)
    launch = {}
    for i, e in enumerate(events):
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in (e.get("args") or {}):
            launch[e["args"]["correlation"]] = i
    forward_category: dict[int, str] = {}

    def chain_info(chain: list[int]):
        ops = [events[j] for j in chain if events[j].get("cat") == "cpu_op"]
        python = [events[j]["name"] for j in chain if events[j].get("cat") == "python_function"]
        notes = [events[j]["name"] for j in chain if events[j].get("cat") == "user_annotation"]
        return ops, python, notes

    def forward_of(ops: list[dict]) -> str | None:
        """Backward: the category of the forward op whose autograd node launched this."""
        for o in ops:
            if "Backward" in o["name"] or o["name"].startswith("autograd::engine::evaluate_function"):
                seq = (o.get("args") or {}).get("Sequence number")
                if seq in forward_category:
                    return forward_category[seq]
        return None

    def classify(chain: list[int], kernel: str) -> str:
        ops, python, notes = chain_info(chain)
        names = [o["name"] for o in ops]
        if "nccl" in kernel.lower():
            return "communication"
        if any(n.startswith("Optimizer.") for n in notes + names):
            return "optimizer"
        if any(n.startswith("FSDP::") for n in notes + names):
            return "FSDP copies"
        backward = forward_of(ops)
        # the model counts rotary's casts in rotary, autocast's casts (inside linear, conv) as copies
        if backward == "rotary" or any("apply_rotary" in p for p in python):
            return "rotary"
        if names and names[0] in COPY_OPS or kernel.lower().startswith(("memcpy", "memset")):
            return "copies/casts"
        return _by_ops(names, ops, kernel, shapes) or backward or _by_module(python) or \
            ("elementwise/activation" if names else "other")

    # forward ops first, so that a backward node can take its forward op's category
    for i, e in enumerate(events):
        seq = (e.get("args") or {}).get("Sequence number")
        if e.get("cat") == "cpu_op" and seq is not None and "Backward" not in e["name"] \
                and not e["name"].startswith("autograd::"):
            forward_category.setdefault(seq, classify([i] + chains.get(i, []), ""))
    measured = Measured()
    if device.type == "cuda":
        kernels = [(e, launch.get((e.get("args") or {}).get("correlation")))
                   for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        items = [(e, [j] + chains.get(j, []) if j is not None else []) for e, j in kernels]
    else:   # CPU: the leaf ops stand for kernels
        parents = {p for c in chains.values() for p in c[:1]}
        items = [(e, [i] + chains.get(i, [])) for i, e in enumerate(events)
                 if e.get("cat") == "cpu_op" and i not in parents]
    for e, chain in items:
        c = classify(chain, e["name"] if device.type == "cuda" else "")
        measured.seconds[c] += e["dur"] * 1e-6
        measured.counts[c] += 1
        measured.names[c][e["name"][:80]] += e["dur"] * 1e-6
    return measured


def busy_seconds(events: list[dict], device: torch.device) -> tuple[float, float, int]:
    """(sum of kernel time, time the GPU ran anything (union of intervals), kernels) of a trace."""
    kinds = ("kernel", "gpu_memcpy", "gpu_memset") if device.type == "cuda" else ()
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in kinds)
    total = sum(b - a for a, b in spans)
    union, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            union += b - max(a, end)
            end = b
    return total * 1e-6, union * 1e-6, len(spans)


def step_function(cfg, device: torch.device) -> Callable[[int], object]:
    """`train`'s own step for ``cfg`` (one rank of an initialized process group), as a function of the step."""
    from meshscale.train.build import build
    from meshscale.train.recipe import learning_rate
    from meshscale.train.step import run_step
    t = build(cfg, device, 0, 1)
    return lambda i: run_step(t, i, learning_rate(cfg, t.spec, i))


def shapes_of(cfg) -> StepShapes:
    """The head's and the MLP's widths of ``cfg``'s model when it takes tokens, or none (an image model)."""
    from meshscale.train.recipe import resolve
    spec, _ = resolve(cfg)
    if spec.input_kind != "tokens":
        return StepShapes(False)
    return StepShapes(True, spec.num_classes, spec.transformer.ffn_dim)


def kernel_categories(cfg, device: torch.device, warm: int = 3, steps: int = 2) -> dict:
    """Measured seconds per step of each kernel category of ``cfg``'s step on ``device`` (after ``warm`` steps,
    over ``steps`` traced ones; a CPU's leaf ops stand for kernels), and the sum of every kernel's time per
    step (none on a CPU). Runs on a rank of an initialized process group, as `train` does."""
    step = step_function(cfg, device)
    for i in range(warm):
        step(i)
    sync(device)
    events = trace(step, warm, steps, device, detailed=True)
    measured = categorize(events, shapes_of(cfg), device)
    kernel_s, _, _ = busy_seconds(events, device)
    return {"seconds_per_step": {c: measured.seconds[c] / steps for c in CATEGORIES if measured.seconds.get(c)},
            "kernel_s_per_step": kernel_s / steps, "batch_per_rank": cfg.batch_per_rank}
