"""Where the ResNet-50 data-parallel step spends its host time: meshscale's path beside a plain loop, timed in
interleaved rounds, then profiled (torch.profiler, CPU + CUDA activity) side by side.

Three sides, all in this process on one device, each with its own model:
- plain: a plain loop (benchmarks/train_vs_plain.py's: DDP of one rank, bf16 autocast, channels-last, SGD,
  synthetic batch on the device; zero_grad, forward, loss, backward, step).
- step: meshscale's Trainer (train/build.py) and `run_step`, called in a bare Python loop.
- loop: exactly what one rank of `meshscale train --model resnet50 --gpus 1 --precision bf16 --channels-last
  --batch 128 --no-timing` runs per step: train/loop.py's `run_steps` over `TrainSteps` (phase written to the
  store, the throughput window, the step log with its progress bar, the tracer's hook, the checkpoint check).
- view: "loop" with --bucket-view (DDP's gradient_as_bucket_view: gradients live in DDP's buckets, no copy of
  each gradient into its bucket and back, about 320 device copies a step fewer for ResNet-50).
- timed: "loop" with timing on (train's default: each step's marks, read once the next step is queued).
"step" against "plain" isolates the step; "loop" against "step" the loop around it.

    python benchmarks/resnet_host_profile.py                       # one GPU: resnet50, bf16, batch 128
    python benchmarks/resnet_host_profile.py --steps 3 --device cpu  # dry run: small-cnn, a few seconds

Prints: one line per round and side (images/s), the median ratio of each side to plain, then for
``--profile-steps`` steps of each side under torch.profiler: (a) CPU milliseconds per step by top-level operator
(per thread, top 25) and the main thread's time outside any operator, (b) the GPU's idle gaps per step (the
window from the first kernel to the last, less the union of kernels, copies and sets), (c) kernels and CUDA
runtime calls per step (cudaLaunchKernel, cudaStreamSynchronize, cudaMemcpy*, cudaEventRecord, cudaEventQuery
...), (d) the top GPU kernels by time per step. With --cli (default), also the real command's figures,
untimed and timed (fresh processes). Last, the loop's own host time per step, untimed and timed, measured around
a step that launches nothing (what "loop" adds to "step" whatever the host's pace).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from train_vs_plain import init_one_rank, plain_resnet, sync  # noqa: E402

SIDES = ("plain", "step", "loop", "view", "timed")
RUNTIME_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                 "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaMemcpy",
                 "cudaEventRecord", "cudaEventQuery", "cudaEventSynchronize", "cudaStreamWaitEvent",
                 "cudaMalloc", "cudaFree", "cudaMemsetAsync")


# ---- the three sides, each a function run(n): n steps -----------------------------------------------------------
def train_config(args, device: torch.device, bucket_view: bool = False, timing: bool = False):
    from meshscale.train.config import DdpOptions, LogOptions, SpeedOptions, TrainConfig
    # as the CLI builds it for `train --gpus 1 --precision bf16 --channels-last --batch 128 --no-timing`
    return TrainConfig(model=args.model, batch_per_rank=args.batch, timing=timing, device=device.type, world=1,
                       image_size=args.image_size, logging=LogOptions(progress=True),
                       ddp=DdpOptions(bucket_view=bucket_view),
                       speed=SpeedOptions(precision=args.precision, channels_last=True))


def meshscale_step_side(args, device: torch.device):
    """meshscale's Trainer and run_step in a bare loop."""
    from meshscale.train.build import build
    from meshscale.train.recipe import learning_rate
    from meshscale.train.step import run_step
    cfg = train_config(args, device)
    t = build(cfg, device, 0, 1)
    counter = iter(range(1 << 40))

    def run(n: int) -> None:
        for _ in range(n):
            i = next(counter)
            run_step(t, i, learning_rate(cfg, t.spec, i))
    return run


def meshscale_loop_side(args, device: torch.device, store, bucket_view: bool = False, timing: bool = False):
    """train_worker's loop: run_steps over TrainSteps, a fresh step log and window each call (as a run has)."""
    from meshscale.execute import RankContext
    from meshscale.train.build import build
    from meshscale.train.loop import TrainSteps, open_log, run_steps
    from meshscale.train.timing import Window
    from meshscale.train.trace import StepTracer
    cfg = train_config(args, device, bucket_view, timing)
    ctx = RankContext(0, 1, 0, "nccl" if device.type == "cuda" else "gloo", device, store)
    t = build(cfg, device, 0, 1)
    steps = TrainSteps(t, StepTracer(None, 0, 0, 1 << 40, t))
    done = [0]

    def run(n: int) -> None:
        start = done[0]
        part = replace(cfg, steps=start + n)
        log = open_log(ctx, part, start)
        run_steps(ctx, part, start, log, Window(t.clock, start), steps, lambda _: None, part.mode)
        done[0] += n
    return run


def loop_own_seconds(args, device: torch.device, store, timing: bool, n: int = 2000) -> float:
    """Host seconds per step that train/loop.py's `run_steps` adds around a step: the phase written to the store,
    the window, the step log and progress bar, the timed step's marks and reads, around a step that launches
    nothing. Independent of how fast the host runs the step itself, which moves from round to round on a VM."""
    from meshscale.execute import RankContext
    from meshscale.train.loop import open_log, run_steps
    from meshscale.train.timing import Clock, TimedStep, Window
    cfg = replace(train_config(args, device, timing=timing), steps=n)
    ctx = RankContext(0, 1, 0, "nccl" if device.type == "cuda" else "gloo", device, store)
    clock, zero = Clock(device), torch.zeros((), device=device)

    def nothing(step: int):
        if not timing:
            return {"step": step, "lr": 0.0}, zero, None
        start = clock.mark()
        return {"step": step, "lr": 0.0}, zero, TimedStep(clock, start, start, clock.mark(), per_step={"samples": 1})
    log = open_log(ctx, cfg, 0)
    sync(device)
    begin = time.perf_counter()
    run_steps(ctx, cfg, 0, log, Window(clock, 0), nothing, lambda _: None, "nothing")
    return (time.perf_counter() - begin) / n


def plain_side(args, device: torch.device):
    step = plain_resnet(SimpleNamespace(resnet=args.model, resnet_batch=args.batch, image_size=args.image_size,
                                        precision=args.precision), device)

    def run(n: int) -> None:
        for _ in range(n):
            step()
    return run


def timed(run, n: int, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    run(n)
    sync(device)
    return (time.perf_counter() - start) / n


# ---- the profile, read back from its Chrome trace ----------------------------------------------------------------
def profile_trace(run, n: int, device: torch.device) -> tuple[list[dict], float]:
    """The trace events of ``n`` steps of ``run`` and the wall seconds they took."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        run(n)
        sync(device)
        wall = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return [e for e in events if e.get("ph") == "X" and "dur" in e], wall


def top_level_ops(events: list[dict]) -> tuple[dict[str, list[float]], dict]:
    """Per operator name: [ms, calls] summed over its top-level calls (not inside another operator on the same
    thread); and per thread the milliseconds inside top-level operators."""
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    per_thread: dict = defaultdict(float)
    ops = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    ops.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
    end_of: dict = {}
    for e in ops:
        key = (e["pid"], e["tid"])
        if e["ts"] < end_of.get(key, float("-inf")):
            continue  # nested in a top-level operator of this thread
        end_of[key] = e["ts"] + e["dur"]
        by_name[e["name"]][0] += e["dur"] / 1e3
        by_name[e["name"]][1] += 1
        per_thread[key] += e["dur"] / 1e3
    return by_name, per_thread


def device_activity(events: list[dict]) -> tuple[float, float, float]:
    """(window, busy, idle) milliseconds of the device: first kernel start to last end, the union of kernels,
    copies and sets, and the gaps between them."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    if not spans:
        return 0.0, 0.0, 0.0
    busy, cur_start, cur_end = 0.0, spans[0][0], spans[0][1]
    for s, e in spans[1:]:
        if s > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    busy += cur_end - cur_start
    window = max(e for _, e in spans) - spans[0][0]
    return window / 1e3, busy / 1e3, (window - busy) / 1e3


def analyse(events: list[dict], wall_s: float, n: int) -> dict:
    by_name, per_thread = top_level_ops(events)
    main = max(per_thread, key=lambda k: per_thread[k]) if per_thread else None
    window, busy, idle = device_activity(events)
    calls: dict[str, float] = defaultdict(float)
    kernels: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            calls[e["name"]] += 1 / n
        elif e.get("cat") == "kernel":
            calls["(kernels on the device)"] += 1 / n
            kernels[e["name"]] += e["dur"] / 1e3 / n
    return {"wall_ms": wall_s * 1e3 / n,
            "ops": {k: (ms / n, c / n) for k, (ms, c) in by_name.items()},
            "threads": {f"{k[0]}/{k[1]}": ms / n for k, ms in per_thread.items()},
            "main_outside_ops_ms": wall_s * 1e3 / n - (per_thread[main] / n if main else 0.0),
            "device_window_ms": window / n, "device_busy_ms": busy / n, "device_idle_ms": idle / n,
            "calls": dict(calls), "kernels": dict(kernels)}


def side_by_side(title: str, rows: dict[str, dict[str, str]], order: list[str], limit: int) -> None:
    print(f"\n{title}")
    print(f"  {'':60s}" + "".join(f"{s:>16s}" for s in SIDES))
    for name in order[:limit]:
        print(f"  {name[:60]:60s}" + "".join(f"{rows.get(s, {}).get(name, '-'):>16s}" for s in SIDES))


def report(profiles: dict[str, dict], limit: int) -> None:
    print("\n== profile, per step ==")
    for key, label in (("wall_ms", "wall ms"), ("main_outside_ops_ms", "main thread outside any operator, ms"),
                       ("device_window_ms", "device window ms (first kernel -> last)"),
                       ("device_busy_ms", "device busy ms (union of kernels, copies, sets)"),
                       ("device_idle_ms", "(b) device idle gaps ms")):
        print(f"  {label:60s}" + "".join(f"{profiles[s][key]:16.3f}" for s in SIDES))
    names = sorted({k for p in profiles.values() for k in p["ops"]},
                   key=lambda k: -max(p["ops"].get(k, (0, 0))[0] for p in profiles.values()))
    side_by_side("(a) CPU ms per step by top-level operator (calls per step)",
                 {s: {k: f"{ms:.3f} ({c:.0f})" for k, (ms, c) in p["ops"].items()} for s, p in profiles.items()},
                 names, limit)
    for s, p in profiles.items():
        print(f"  {s} threads (ms inside top-level operators per step): "
              + ", ".join(f"{k}: {v:.2f}" for k, v in sorted(p["threads"].items(), key=lambda kv: -kv[1])))
    calls = sorted({k for p in profiles.values() for k in p["calls"]},
                   key=lambda k: (k not in RUNTIME_CALLS and not k.startswith("("),
                                  -max(p["calls"].get(k, 0) for p in profiles.values())))
    side_by_side("(c) kernels and CUDA runtime / driver calls per step",
                 {s: {k: f"{v:.1f}" for k, v in p["calls"].items()} for s, p in profiles.items()}, calls, 40)
    kernels = sorted({k for p in profiles.values() for k in p["kernels"]},
                     key=lambda k: -max(p["kernels"].get(k, 0) for p in profiles.values()))
    side_by_side("(d) top GPU kernels, ms per step",
                 {s: {k: f"{v:.3f}" for k, v in p["kernels"].items()} for s, p in profiles.items()}, kernels, 15)
    if not kernels:
        print("  (no device activity: a CPU run)")


def run_cli(args, device: torch.device) -> None:
    """The real command in a fresh process, untimed and timed (train's default), beside the in-process sides."""
    import meshscale  # the child imports the same package as this process, wherever it lies
    src = str(Path(meshscale.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (src, os.environ.get("PYTHONPATH"))))}
    where = ["--gpus", "1"] if device.type == "cuda" else ["--cpus", "1"]
    for timing in ("--no-timing", "--timing"):
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "train.json"
            cmd = [sys.executable, "-m", "meshscale", "train", "--model", args.model, *where, "--precision",
                   args.precision, "--channels-last", "--batch", str(args.batch), timing,
                   "--steps", str(args.cli_steps)] + (["--image-size", str(args.image_size)] if args.image_size else [])
            cmd += ["--json", str(out)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                print(f"cli: exit {done.returncode}: {done.stderr.strip()[-500:]}")
                continue
            summary = json.loads(out.read_text())["meta"]["summary"]
            print(f"cli: {' '.join(cmd[3:-2])}: {summary['samples_per_s']:,.1f} images/s (fresh process, "
                  f"{summary['timed_steps']} timed steps)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--model", default=None, help="default resnet50 (cuda), small-cnn (cpu)")
    p.add_argument("--batch", type=int, default=None, help="default 128 (cuda), 8 (cpu)")
    p.add_argument("--image-size", type=int, default=None, help="default the model's (cuda), 32 (cpu)")
    p.add_argument("--precision", default=None, help="default bf16 (cuda), fp32 (cpu)")
    p.add_argument("--warmup", type=int, default=None, help="steps per side before the rounds (default 15, cpu 1)")
    p.add_argument("--steps", type=int, default=50, help="timed steps per round and side")
    p.add_argument("--rounds", type=int, default=None, help="default 4 (cuda), 2 (cpu)")
    p.add_argument("--profile-steps", type=int, default=None, help="profiled steps per side (default 10, cpu 2)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (the launcher gives each rank 1)")
    p.add_argument("--cli", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the real `meshscale train` command in a fresh process")
    p.add_argument("--cli-steps", type=int, default=None, help="its --steps (default 60, cpu 8)")
    args = p.parse_args()
    cpu = args.device == "cpu"
    for name, gpu_default, cpu_default in (("model", "resnet50", "small-cnn"), ("batch", 128, 8),
                                           ("image_size", None, 32), ("precision", "bf16", "fp32"),
                                           ("warmup", 15, 1), ("rounds", 4, 2), ("profile_steps", 10, 2),
                                           ("cli_steps", 60, 8)):
        if getattr(args, name) is None:
            setattr(args, name, cpu_default if cpu else gpu_default)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu") if cpu else torch.device("cuda", 0)
    if not cpu:
        torch.cuda.set_device(device)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(device) if not cpu else 'cpu'}; "
          f"{args.model} batch {args.batch} {args.precision} channels-last; {args.rounds} rounds x {args.steps} steps")
    store = init_one_rank(device)
    try:
        runs = {"plain": plain_side(args, device), "step": meshscale_step_side(args, device),
                "loop": meshscale_loop_side(args, device, store),
                "view": meshscale_loop_side(args, device, store, bucket_view=True),
                "timed": meshscale_loop_side(args, device, store, timing=True)}
        for s in SIDES:
            runs[s](args.warmup)
        per_step: dict[str, list[float]] = {s: [] for s in SIDES}
        for r in range(args.rounds):
            order = SIDES[r % len(SIDES):] + SIDES[:r % len(SIDES)]  # rotate who goes first
            for s in order:
                per_step[s].append(timed(runs[s], args.steps, device))
            print(json.dumps({"round": r, **{f"{s}_images_per_s": round(args.batch / per_step[s][-1], 1)
                                             for s in SIDES}}), flush=True)
        for s in SIDES:
            rates = [args.batch / t for t in per_step[s]]
            ratios = [p / t for p, t in zip(per_step["plain"], per_step[s])]
            print(f"{s:5s}: {statistics.median(rates):,.1f} images/s (median; {min(rates):,.1f}-{max(rates):,.1f}); "
                  f"/ plain = {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})", flush=True)
        plain_s = statistics.median(per_step["plain"])
        for timing in (False, True):
            own = loop_own_seconds(args, device, store, timing)
            print(f"the loop's own host time ({'timed' if timing else 'untimed'}): {own * 1e6:,.1f} us per step, "
                  f"{own / plain_s:.2%} of the plain step (run_steps around a step that launches nothing)", flush=True)
        profiles = {}
        for s in SIDES:
            events, wall = profile_trace(runs[s], args.profile_steps, device)
            profiles[s] = analyse(events, wall, args.profile_steps)
        report(profiles, 25)
    finally:
        torch.distributed.destroy_process_group()
    if args.cli:
        run_cli(args, device)


if __name__ == "__main__":
    main()
