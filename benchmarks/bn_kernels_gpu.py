"""Batch norm's four channels-last kernels per ResNet-50 layer shape, measured under torch.profiler beside the
step model's price of each (its bytes at HBM_FRACTION of the bandwidth, its instructions at the issue rate), on
this machine's one GPU.

For each distinct (rows, channels) of ResNet-50's 53 batch norms at --batch (bf16 activations in channels-last
and fp32 weights, as under autocast; --fp32 adds the same shapes with fp32 activations), a BatchNorm2d in
training mode runs forward and backward --reps times under the profiler. Per shape and kernel (statistics,
transform, backward reduce, backward elemt) it prints the measured and predicted microseconds, the bound the
model picked (memory or instructions) and the measured elements per nanosecond; then each kernel's total over
the 53 layers (each shape weighted by its layers), comparable with the batch-norm row of
benchmarks/predict_kernels_gpu.py. The per-shape rows say where the model misses: a time that follows the
elements and not the bytes (fp32 no slower per element than bf16) points at something other than bandwidth.

  PYTHONPATH=src python benchmarks/bn_kernels_gpu.py --fp32 --out $OUT/bn-kernels.json
  PYTHONPATH=src python benchmarks/bn_kernels_gpu.py --device cpu --tiny     (dry run: the machinery, no kernels)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter

import torch

from meshscale.predict.training.kernels import KERNEL_FLOOR_S, instruction_seconds, rates
from meshscale.models.images import resnet_blocks
from meshscale.predict.training.workload import batch_norm_passes
from predict_kernels_gpu import common_arguments, device_and_gpu   # run from the repository root

# the kernels' names as the profiler reports them (Normalization.cuh), and the step model's kernel for each
KERNELS = (("statistics", "collect_statistics_channels_last", "statistics"),
           ("transform", "transform_input_channels_last", "normalize"),
           ("backward reduce", "backward_reduce_channels_last", "statistics backward"),
           ("backward elemt", "backward_elemt_channels_last", "normalize backward"))


def shapes(batch: int, image: int) -> Counter:
    """(batch, channels, height) of each batch norm of ResNet-50, and how many layers have it."""
    blocks, _ = resnet_blocks(50, image)
    return Counter((batch, c.c_out, c.out_hw) for block in blocks for c in block)


def predicted(rows: int, channels: int, e: int, r) -> dict:
    """Each kernel's predicted seconds and bound: the longer of its bytes and its instructions."""
    passes = batch_norm_passes("bn", rows, channels, e)
    by_name = {k.name[3:]: k for k in passes.forward + passes.backward}
    out = {}
    for label, _, model_name in KERNELS:
        k = by_name[model_name]
        memory_s, inst_s = k.bytes / r.bandwidth_bytes_per_s, instruction_seconds(k.instructions, r)
        out[label] = {"seconds": max(memory_s, inst_s, KERNEL_FLOOR_S),
                      "bound": "memory" if memory_s >= inst_s else "instructions"}
    return out


def measure(shape: tuple, dtype: torch.dtype, device: torch.device, reps: int) -> dict:
    """Each kernel's mean GPU seconds per forward + backward (empty on a device without kernels)."""
    from torch.profiler import ProfilerActivity, profile
    n, c, hw = shape
    bn = torch.nn.BatchNorm2d(c).to(device)
    x = torch.randn(n, c, hw, hw, device=device).to(dtype=dtype, memory_format=torch.channels_last)
    x.requires_grad_(True)
    grad = torch.randn_like(x)

    def step():
        bn(x).backward(grad)
    for _ in range(3):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(reps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = [e for e in json.load(f).get("traceEvents", []) if e.get("cat") == "kernel" and "dur" in e]
    out = {}
    for label, key, _ in KERNELS:
        us = [e["dur"] for e in events if key in e["name"]]
        if us:
            out[label] = sum(us) / reps * 1e-6
    return out


def main(argv: list[str] | None = None) -> int:
    ap = common_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--fp32", action="store_true", help="also fp32 activations")
    args = ap.parse_args(argv)
    picked = device_and_gpu(args.device)
    if picked is None:
        return 2
    device, gpu = picked
    batch = args.batch or (2 if args.tiny else 128)
    reps = args.reps or (1 if args.tiny else 20)
    image = 64 if args.tiny else 224
    dtypes = [("bf16", torch.bfloat16, 2)] + ([("fp32", torch.float32, 4)] if args.fp32 else [])
    print(f"batch norm kernels, ResNet-50 shapes at batch {batch}, on {device} (predicted for {gpu.model})")
    rows_out = []
    for dname, dtype, e in dtypes:
        r = rates(gpu, dname)
        totals = {label: [0.0, 0.0] for label, _, _ in KERNELS}
        print(f"\n{dname}   {'N x C x H':>16} {'layers':>6}  " + "  ".join(f"{label:>30}" for label, _, _ in KERNELS))
        print(f"{'':>24} {'':>6}  " + "  ".join(f"{'meas us  pred us  bound  el/ns':>30}" for _ in KERNELS))
        for shape, layers in sorted(shapes(batch, image).items(), key=lambda s: -s[0][1] * s[0][2] ** 2):
            n, c, hw = shape
            rows = n * hw * hw
            pred = predicted(rows, c, e, r)
            meas = measure(shape, dtype, device, reps)
            cells = []
            for label, _, _ in KERNELS:
                m, p = meas.get(label), pred[label]
                totals[label][0] += (m or 0.0) * layers
                totals[label][1] += p["seconds"] * layers
                rate = f"{rows * c / m / 1e9:6.1f}" if m else "     -"
                measured = f"{m * 1e6:8.1f}" if m else f"{'-':>8}"
                cells.append(f"{measured} {p['seconds'] * 1e6:8.1f} {p['bound'][:6]:>6} {rate}")
            print(f"{'':>4} {n:>4} x {c:>4} x {hw:>3} {layers:>6}  " + "  ".join(f"{x:>30}" for x in cells))
            rows_out.append({"dtype": dname, "batch": n, "channels": c, "hw": hw, "layers": layers,
                             "measured_s": meas, "predicted": pred})
        print(f"{'per step (ms)':>24} {'':>6}  " + "  ".join(
            f"{t[0] * 1e3:8.3f} {t[1] * 1e3:8.3f} {'':>13}" for t in totals.values()))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"torch": torch.__version__, "gpu": gpu.model, "rows": rows_out}, indent=1))
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
