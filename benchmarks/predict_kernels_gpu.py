"""Measured GPU time per kernel category of `meshscale train`'s own step, beside what the training step model
predicts for the same category from the datasheet (no profile), on this machine's one GPU.

Cases (each the step `train` runs, built by train's own functions):
  resnet50   ResNet-50 bf16 channels-last, batch 128 (train.build + train.step.run_step, DDP of one rank)
  gpt-small  GPT-small bf16 (autocast), batch 16 x 1024 tokens (same)
  llama-1b   llama-1b bf16 FSDP2 of one rank, full activation checkpointing, batch 2 x 2048
             (train.parallel.worker.build_layout + layout_step)
For each: WARM steps, TIMED steps timed with a device sync (wall per step), then PROFILED steps under
torch.profiler twice: plain (kernel times, counts, the GPU's busy time and idle gaps) and with Python stacks and
shapes (to put each kernel in a category: the op that launched it, its module, its forward op for backward).
Prints per category measured ms/step, predicted ms/step, their ratio, kernels per step measured and modelled;
then wall per step, the sum of kernel time, the GPU's busy time and its idle time (host-bound gaps).

  PYTHONPATH=src python benchmarks/predict_kernels_gpu.py --out $OUT/kernels-h100.json
  PYTHONPATH=src python benchmarks/predict_kernels_gpu.py --device cpu --tiny --out /tmp/k.json   (dry run)

The dry run uses small shapes (gpt-tiny, llama-tiny; the ResNet only where torchvision imports), CPU ops in
place of kernels, and predicts for the H100 of hgx-h100: it checks the machinery, not the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from meshscale.errors import MeshscaleError
from meshscale.models.layout import ParallelLayout
from meshscale.models.transformer import config_from_fields, load_model_config
from meshscale.predict.training.breakdown import CATEGORIES, predicted_categories
from meshscale.predict.training.comm import Placement
from meshscale.predict.training.hardware import GpuSpec, gpu_spec, system_gpu
from meshscale.predict.training.kernels import rates
from meshscale.predict.training.step import TrainingJob, predict_step
from meshscale.train.config import LayoutOptions, SpeedOptions, TrainConfig

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")
COPY_OPS = ("aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::cat", "aten::to",
            "aten::_foreach_copy_")


@dataclass
class Case:
    name: str
    cfg: TrainConfig
    job: TrainingJob
    layout: bool          # a transformer under a parallel layout (train/parallel), else train.build
    vocab: int = 0
    ffn: int = 0


@dataclass
class Measured:
    seconds: dict = field(default_factory=lambda: defaultdict(float))
    counts: dict = field(default_factory=lambda: defaultdict(int))
    names: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))


def cases(tiny: bool, device: str) -> list[Case]:
    found = []
    resnet_batch, image = (2, 64) if tiny else (128, 224)
    found.append(Case("resnet50", TrainConfig(model="resnet50", device=device, batch_per_rank=resnet_batch,
                                              image_size=image, timing=False,
                                              speed=SpeedOptions(precision="bf16", channels_last=True)),
                      TrainingJob(None, ParallelLayout(), resnet_batch, 0, "bf16", resnet_depth=50,
                                  channels_last=True, autocast=True, image=image), False))
    if tiny:
        g = {"layers": 2, "d_model": 64, "heads": 2, "ffn_dim": 256, "vocab_size": 256, "max_seq_len": 32,
             "style": "gpt2"}
        gpt, name, batch, seq = config_from_fields("gpt-tiny", g, "gpt-tiny"), "gpt-tiny", 2, 32
    else:
        gpt, name, batch, seq = load_model_config("gpt2-small"), "gpt-small", 16, 1024
    found.append(Case(name, TrainConfig(model=name, device=device, batch_per_rank=batch, timing=False,
                                        speed=SpeedOptions(precision="bf16")),
                      TrainingJob(gpt, ParallelLayout(), batch, seq, "bf16", autocast=True, sharding="none"), False,
                      gpt.vocab_size, gpt.ffn_dim))
    llama_name, batch, seq = ("llama-tiny", 2, 64) if tiny else ("llama-1b", 2, 2048)
    llama = load_model_config(llama_name)
    found.append(Case(llama_name, TrainConfig(model=llama_name, device=device, batch_per_rank=batch, timing=False,
                                              speed=SpeedOptions(precision="bf16"),
                                              layout=LayoutOptions(seq_len=seq, checkpointing="full")),
                      TrainingJob(llama, ParallelLayout(), batch, seq, "bf16", "full"), True,
                      llama.vocab_size, llama.ffn_dim))
    return found


def step_function(case: Case, device: torch.device):
    """train's own step for the case, as a function of the step index."""
    if case.layout:
        from meshscale.train.build import learning_rate
        from meshscale.train.parallel.worker import build_layout, layout_step
        t = build_layout(case.cfg, device)
        return lambda i: layout_step(t, i, learning_rate(case.cfg, t.spec, i))
    from meshscale.train.build import build, learning_rate
    from meshscale.train.step import run_step
    t = build(case.cfg, device, 0, 1)
    return lambda i: run_step(t, i, learning_rate(case.cfg, t.spec, i))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _trace(step, first: int, steps: int, device: torch.device, detailed: bool) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=detailed, with_stack=detailed) as prof:
        for i in range(first, first + steps):
            step(i)
        _sync(device)
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


def _by_ops(names: list[str], ops: list[dict], kernel: str, case: Case) -> str | None:
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
        if case.job.model is None:
            return "matmul: other"
        dims = _dims(mm) if mm is not None else set()
        if case.vocab in dims:
            return "matmul: head"
        if case.ffn in dims:
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


def categorize(events: list[dict], case: Case, device: torch.device) -> Measured:
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
        return _by_ops(names, ops, kernel, case) or backward or _by_module(python) or \
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
    """(sum of kernel time, time the GPU ran anything (union of intervals), kernels) of a plain trace."""
    kinds = ("kernel", "gpu_memcpy", "gpu_memset") if device.type == "cuda" else ()
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in kinds)
    total = sum(b - a for a, b in spans)
    union, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            union += b - max(a, end)
            end = b
    return total * 1e-6, union * 1e-6, len(spans)


def run_case(case: Case, device: torch.device, warm: int, timed: int, profiled: int, detailed_steps: int,
             gpu) -> dict:
    step = step_function(case, device)
    for i in range(warm):
        step(i)
    _sync(device)
    t0 = time.perf_counter()
    for i in range(warm, warm + timed):
        step(i)
    _sync(device)
    wall = (time.perf_counter() - t0) / timed
    first = warm + timed
    plain = _trace(step, first, profiled, device, detailed=False)
    total, busy, count = busy_seconds(plain, device)
    detailed = _trace(step, first + profiled, detailed_steps, device, detailed=True)
    measured = categorize(detailed, case, device)
    r = rates(gpu, case.job.precision)
    predicted = {c.category: c for c in predicted_categories(case.job, r)}
    prediction = predict_step(case.job, Placement("hgx-h100", 1), gpu)
    rows = []
    for c in CATEGORIES:
        if c not in predicted and c not in measured.seconds:
            continue
        m_s = measured.seconds.get(c, 0.0) / detailed_steps
        p = predicted.get(c)
        rows.append({"category": c, "measured_s": m_s, "predicted_s": p.seconds if p else 0.0,
                     "ratio_measured_over_predicted": m_s / p.seconds if p and p.seconds else None,
                     "kernels_measured": measured.counts.get(c, 0) / detailed_steps,
                     "kernels_modelled": p.kernels if p else 0,
                     "top_kernels": sorted(((n, s / detailed_steps) for n, s in measured.names[c].items()),
                                           key=lambda x: -x[1])[:5]})
    return {"case": case.name, "gpu": gpu.model, "device": str(device), "rows": rows,
            "wall_s_per_step": wall, "kernel_sum_s_per_step": total / profiled,
            "gpu_busy_s_per_step": busy / profiled, "gpu_idle_s_per_step": max(0.0, wall - busy / profiled),
            "kernels_per_step": count / profiled, "predicted_step_s": prediction.step_s,
            "predicted_kernel_s": sum(p.seconds for p in predicted.values()),
            "predicted_host_bound_s": prediction.launch_s,
            "predicted_kernels_per_step": sum(p.kernels for p in predicted.values())}


def print_case(out: dict) -> None:
    print(f"\n== {out['case']} on {out['device']} (predicted for {out['gpu']}, datasheet, no profile)")
    print(f"{'category':<32} {'meas ms':>9} {'pred ms':>9} {'meas/pred':>9} {'kern meas':>10} {'kern model':>10}")
    for r in out["rows"]:
        ratio = f"{r['ratio_measured_over_predicted']:.2f}" if r["ratio_measured_over_predicted"] else "-"
        print(f"{r['category']:<32} {r['measured_s'] * 1e3:>9.3f} {r['predicted_s'] * 1e3:>9.3f} {ratio:>9} "
              f"{r['kernels_measured']:>10.0f} {r['kernels_modelled']:>10}")
    print(f"step wall {out['wall_s_per_step'] * 1e3:.2f} ms (predicted {out['predicted_step_s'] * 1e3:.2f}); "
          f"kernel sum {out['kernel_sum_s_per_step'] * 1e3:.2f} ms (predicted {out['predicted_kernel_s'] * 1e3:.2f}); "
          f"GPU busy {out['gpu_busy_s_per_step'] * 1e3:.2f} ms, idle {out['gpu_idle_s_per_step'] * 1e3:.2f} ms "
          f"(predicted host-bound {out['predicted_host_bound_s'] * 1e3:.2f}); kernels {out['kernels_per_step']:.0f} "
          f"(modelled {out['predicted_kernels_per_step']})")


def _init_one_rank(device: torch.device, tmp: str) -> None:
    """A process group of one rank: DDP and FSDP2 want one even alone (as `train --gpus 1` has)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    from datetime import timedelta
    dist.init_process_group(backend, init_method=f"file://{tmp}/store", rank=0, world_size=1,
                            timeout=timedelta(seconds=300))


def common_arguments(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--device, --tiny and --out, as this directory's GPU profiles take them."""
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="small shapes and few steps (the CPU dry run)")
    ap.add_argument("--out", type=Path, default=None, help="write everything as JSON here")
    return ap


def device_and_gpu(name: str) -> tuple[torch.device, GpuSpec] | None:
    """The device to run on and the GPU to predict for: this machine's first GPU, or on CPU (the dry run, one
    thread) hgx-h100's; None (said on stderr) where CUDA was asked for and there is none."""
    if name == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu --tiny for the dry run", file=sys.stderr)
        return None
    if name == "cuda":
        device = torch.device("cuda", 0)
        return device, gpu_spec({"model": torch.cuda.get_device_name(device)})
    torch.set_num_threads(1)
    return torch.device("cpu"), system_gpu("hgx-h100")[0]


def main(argv: list[str] | None = None) -> int:
    ap = common_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    ap.add_argument("--cases", default="resnet50,gpt,llama", help="comma list of resnet50, gpt, llama")
    ap.add_argument("--warm", type=int, default=None)
    ap.add_argument("--timed", type=int, default=None)
    ap.add_argument("--profiled", type=int, default=None)
    ap.add_argument("--detailed", type=int, default=None, help="steps profiled with stacks and shapes")
    args = ap.parse_args(argv)
    picked = device_and_gpu(args.device)
    if picked is None:
        return 2
    device, gpu = picked
    warm = args.warm if args.warm is not None else (1 if args.tiny else 20)
    timed = args.timed if args.timed is not None else (2 if args.tiny else 20)
    profiled = args.profiled if args.profiled is not None else (1 if args.tiny else 5)
    detailed = args.detailed if args.detailed is not None else (1 if args.tiny else 2)
    wanted = set(args.cases.split(","))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        _init_one_rank(device, tmp)
        try:
            for case in cases(args.tiny, args.device):
                key = "resnet50" if case.job.model is None else ("llama" if case.layout else "gpt")
                if key not in wanted:
                    continue
                try:
                    out = run_case(case, device, warm, timed, profiled, detailed, gpu)
                except MeshscaleError as e:   # torchvision is unusable on CPU builds of torch
                    print(f"\n== {case.name}: skipped ({e})")
                    results.append({"case": case.name, "skipped": str(e)})
                    continue
                print_case(out)
                results.append(out)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        finally:
            dist.destroy_process_group()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"torch": torch.__version__, "cases": results}, indent=1))
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
