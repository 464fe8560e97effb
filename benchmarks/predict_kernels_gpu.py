"""Measured GPU time per kernel category of `meshscale train`'s own step, beside what the training step model
predicts for the same category from the datasheet (no profile), on this machine's one GPU.

Cases (each the step `train` runs, built by train's own functions):
  resnet50   ResNet-50 bf16 channels-last, batch 128 (train.build + train.step.run_step, DDP of one rank)
  gpt-small  GPT-small bf16 (autocast), batch 16 x 1024 tokens (same)
  llama-1b   llama-1b bf16 FSDP2 of one rank, full activation checkpointing, batch 2 x 2048
             (train.build + train.step.run_step)
  fp8        llama-1b (batch 1 x 2048) and llama3-8b's layers (4 of them, batch 2 x 8192: eager bf16 too),
             bf16 and fp8 (torchao float8, tensorwise) compiled per block as torchtitan does: where fp8's time goes
  moe        a Mixtral-style MoE of 0.65B (benchmarks/moe_fp8_gpu.py's config), bf16, batch 4 x 2048
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
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from meshscale.errors import MeshscaleError
from meshscale.models.layout import ParallelLayout
from meshscale.models.transformer import config_from_fields, load_model_config
from meshscale.predict.training.breakdown import predicted_categories
from meshscale.predict.training.comm import Allocation
from meshscale.predict.training.hardware import GpuSpec, gpu_spec, system_gpu
from meshscale.predict.training.kernels import rates
from meshscale.predict.training.step import TrainingJob, predict_step
from meshscale.train.config import LayoutOptions, SpeedOptions, TrainConfig
from meshscale.train.kernel_categories import (CATEGORIES, StepShapes, busy_seconds, categorize, step_function,
                                                sync, trace)

@dataclass
class Case:
    name: str
    cfg: TrainConfig
    job: TrainingJob
    layout: bool          # a transformer under a parallel layout (train/parallel), else train.build
    vocab: int = 0
    ffn: int = 0


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


def extra_cases(wanted: set[str], tiny: bool, device: str, tmp: str) -> list[Case]:
    """The fp8 and mixture-of-experts cases (see the module), as config files written to ``tmp``."""
    found = []
    if "fp8" in wanted:
        eight = {"model_type": "llama", "num_hidden_layers": 1 if tiny else 4, "hidden_size": 4096,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                 "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
                 "tie_word_embeddings": False}
        path = Path(tmp) / "llama3-8b-4-layers.json"
        path.write_text(json.dumps(eight))
        shapes = [("llama-tiny", "llama-tiny", 2, 64)] if tiny else \
            [("llama-1b", "llama-1b", 1, 2048), ("llama3-8b x4 layers", str(path), 2, 8192)]
        for label, model, batch, seq in shapes:
            cfg_model = load_model_config(model)
            variants = [("bf16", None), ("bf16", "default"), ("fp8", "default")] if device == "cuda" else \
                [("bf16", "default")]
            if label.startswith("llama-1b"):
                variants = variants[1:]
            for precision, compiled in variants:
                speed = SpeedOptions(precision=precision, compile=compiled,
                                     fp8_recipe="tensorwise" if precision == "fp8" else None)
                found.append(Case(f"{label} {precision} {'compiled' if compiled else 'eager'}", TrainConfig(
                    model=model, device=device, batch_per_rank=batch, timing=False, speed=speed,
                    layout=LayoutOptions(seq_len=seq, checkpointing="none")),
                    TrainingJob(cfg_model, ParallelLayout(), batch, seq, precision, "none",
                                framework="compile" if compiled else "eager", fp8_recipe="tensorwise"), True,
                    cfg_model.vocab_size, cfg_model.ffn_dim))
    if "moe" in wanted and not tiny:
        from moe_fp8_gpu import MOE_CONFIG
        path = Path(tmp) / "moe.json"
        path.write_text(json.dumps(MOE_CONFIG))
        moe = load_model_config(str(path))
        found.append(Case("moe 0.65B bf16", TrainConfig(model=str(path), device=device, batch_per_rank=4,
                                                        timing=False, speed=SpeedOptions(precision="bf16"),
                                                        layout=LayoutOptions(seq_len=2048)),
                          TrainingJob(moe, ParallelLayout(), 4, 2048, "bf16"), True, moe.vocab_size, moe.ffn_dim))
    return found


def top_kernels(events: list[dict], steps: int, n: int = 25) -> list[tuple[str, float, float]]:
    """The ``n`` kernels of most GPU time per step: (name, seconds per step, launches per step)."""
    seconds, counts = defaultdict(float), defaultdict(int)
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            seconds[e["name"][:100]] += e["dur"] * 1e-6 / steps
            counts[e["name"][:100]] += 1
    return [(k, s, counts[k] / steps) for k, s in sorted(seconds.items(), key=lambda x: -x[1])[:n]]


def idle_gaps(events: list[dict], steps: int, min_us: float = 20.0, n: int = 12) -> dict:
    """Where the GPU ran dry: each gap of at least ``min_us`` between the GPU's work (kernels, copies, sets) is
    charged to the host op that issued the work after it (the innermost op around the runtime call whose
    correlation id the work carries) and to the runtime calls that overlap it (a synchronize, an allocation);
    seconds per step, the largest ``n`` of each."""
    kinds = ("kernel", "gpu_memcpy", "gpu_memset")
    work = sorted((e for e in events if e.get("cat") in kinds), key=lambda e: e["ts"])
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    by_corr = {(e.get("args") or {}).get("correlation"): e for e in runtime}
    ops = sorted((e for e in events if e.get("cat") in ("cpu_op", "user_annotation")), key=lambda e: e["ts"])
    issuer, during = defaultdict(float), defaultdict(float)
    end = None
    for e in work:
        gap = e["ts"] - end if end is not None else 0.0
        if gap >= min_us:
            call = by_corr.get((e.get("args") or {}).get("correlation"))
            name = "(no launch found)"
            if call is not None:
                around = [o for o in ops if o["ts"] <= call["ts"] and o["ts"] + o["dur"] >= call["ts"] + call["dur"]
                          and o.get("tid") == call.get("tid")]
                name = min(around, key=lambda o: o["dur"])["name"] if around else call["name"]
            issuer[name[:90]] += gap * 1e-6 / steps
            for r in runtime:
                overlap = min(r["ts"] + r["dur"], e["ts"]) - max(r["ts"], end)
                if overlap > 0.2 * gap:
                    during[r["name"][:90]] += overlap * 1e-6 / steps
        end = max(end or e["ts"], e["ts"] + e["dur"])
    top = lambda d: sorted(d.items(), key=lambda x: -x[1])[:n]  # noqa: E731
    return {"issued_after_gap": top(issuer), "runtime_calls_in_gaps": top(during)}


def run_case(case: Case, device: torch.device, warm: int, timed: int, profiled: int, detailed_steps: int,
             gpu) -> dict:
    step = step_function(case.cfg, device)
    for i in range(warm):
        step(i)
    sync(device)
    t0 = time.perf_counter()
    for i in range(warm, warm + timed):
        step(i)
    sync(device)
    wall = (time.perf_counter() - t0) / timed
    first = warm + timed
    plain = trace(step, first, profiled, device, detailed=False)
    total, busy, count = busy_seconds(plain, device)
    top = top_kernels(plain, profiled)
    gaps = idle_gaps(plain, profiled)
    detailed = trace(step, first + profiled, detailed_steps, device, detailed=True)
    measured = categorize(detailed, StepShapes(case.job.model is not None, case.vocab, case.ffn), device)
    r = rates(gpu, case.job.precision, fp8_recipe=case.job.fp8_recipe)
    predicted = {c.category: c for c in predicted_categories(case.job, r)}
    prediction = predict_step(case.job, Allocation.of("hgx-h100", 1), gpu)
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
            "predicted_kernels_per_step": sum(p.kernels for p in predicted.values()), "top_kernels": top,
            "idle_gaps": gaps}


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
    for name, seconds, launches in out.get("top_kernels", [])[:15]:
        print(f"  {seconds * 1e3:8.3f} ms {launches:6.0f}x  {name}")
    for key, label in (("issued_after_gap", "GPU idle before work issued by"), ("runtime_calls_in_gaps",
                                                                              "runtime calls in the idle gaps")):
        print(f"  {label}:")
        for name, seconds in out.get("idle_gaps", {}).get(key, []):
            print(f"    {seconds * 1e3:8.3f} ms  {name}")


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
    ap.add_argument("--cases", default="resnet50,gpt,llama", help="comma list of resnet50, gpt, llama, fp8, moe")
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
            for case in cases(args.tiny, args.device) + extra_cases(wanted, args.tiny, args.device, tmp):
                key = "resnet50" if case.job.model is None else ("llama" if case.layout else "gpt")
                if key not in wanted and " " not in case.name:
                    continue
                # each case compiles afresh, as its own run would: dynamo's cache from an earlier case would make
                # its recompile mark sizes dynamic (automatic dynamic shapes), whose kernels index slower
                torch._dynamo.reset()
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
