"""Tensor-core throughput under sustained load, beside the GPU's clock, power and temperature (NVML): what a
training run that keeps the GPU busy for minutes gets, against the short bursts the kernel atlas times.

Runs a large GEMM (bf16 8192^3 by default; fp8 `torch._scaled_mm` with --fp8) back to back for --seconds,
synchronizing every window (about 0.5 s) and reading NVML's SM clock, power draw, power limit, temperature and
clock-throttle reasons at each window's end. Prints the first window, the mean of the first 2 s and of the last
--tail seconds: TFLOP/s, SM MHz, W, C; and the ratio last / first. Writes every window as JSON to --out.

  PYTHONPATH=src python3 benchmarks/sustained_gemm_gpu.py --seconds 60 --out $OUT/sustained.json
  python3 benchmarks/sustained_gemm_gpu.py --dry-run           (CPU: a small fp32 GEMM for 2 s, no NVML)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def nvml_reader(index: int):
    """A function returning (SM MHz, W, limit W, C, throttle reasons) of GPU ``index``, or None without NVML."""
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:   # no NVML (CPU dry run)
        return None

    def read():
        return (pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                pynvml.nvmlDeviceGetPowerUsage(h) / 1e3, pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3,
                pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))
    return read


def operands(n: int, device: str, fp8: bool):
    if fp8:
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    return lambda: a @ b


def run(n: int, seconds: float, window_s: float, device: str, fp8: bool) -> list[dict]:
    gemm = operands(n, device, fp8)
    read = nvml_reader(0) if device == "cuda" else None
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    flops = 2.0 * n ** 3
    gemm()
    sync()
    # GEMMs per window from one timed GEMM
    t = time.perf_counter()
    for _ in range(3):
        gemm()
    sync()
    per_window = max(1, int(window_s / ((time.perf_counter() - t) / 3)))
    windows, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        for _ in range(per_window):
            gemm()
        sync()
        dt = time.perf_counter() - t
        row = {"t_s": time.perf_counter() - start, "tflops": flops * per_window / dt / 1e12}
        if read is not None:
            mhz, w, limit, c, reasons = read()
            row.update(sm_mhz=mhz, power_w=w, limit_w=limit, temp_c=c, throttle_reasons=reasons)
        windows.append(row)
    return windows


def summary(windows: list[dict], tail_s: float) -> dict:
    end = windows[-1]["t_s"]
    first2 = [w for w in windows if w["t_s"] <= 2.0] or windows[:1]
    tail = [w for w in windows if w["t_s"] >= end - tail_s] or windows[-1:]
    mean = lambda rows, key: sum(r.get(key, 0.0) for r in rows) / len(rows)  # noqa: E731
    keys = ("tflops", "sm_mhz", "power_w", "temp_c")
    out = {"first": {k: windows[0].get(k) for k in keys}, "first_2s": {k: mean(first2, k) for k in keys},
           "last": {k: mean(tail, k) for k in keys}}
    out["last_over_first_2s"] = out["last"]["tflops"] / out["first_2s"]["tflops"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--tail", type=float, default=10.0, help="seconds at the end averaged")
    ap.add_argument("--window", type=float, default=0.5)
    ap.add_argument("--fp8", action="store_true", help="torch._scaled_mm in float8_e4m3fn")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    device = "cpu" if a.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: --dry-run runs on the CPU", file=sys.stderr)
        return 2
    if a.dry_run:
        a.n, a.seconds, a.tail, a.window = 256, 2.0, 1.0, 0.2
    windows = run(a.n, a.seconds, a.window, device, a.fp8)
    s = summary(windows, a.tail)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    kind = "fp8 _scaled_mm" if a.fp8 else "bf16 matmul"
    print(f"{name}: {kind} {a.n}^3 for {a.seconds:.0f} s ({len(windows)} windows)")
    for label in ("first", "first_2s", "last"):
        r = s[label]
        print(f"  {label:9} {r['tflops']:8.1f} TFLOP/s  SM {r.get('sm_mhz') or 0:6.0f} MHz  "
              f"{r.get('power_w') or 0:6.0f} W  {r.get('temp_c') or 0:4.0f} C")
    print(f"  last {a.tail:.0f} s / first 2 s: {s['last_over_first_2s']:.3f}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"gpu": name, "kind": kind, "n": a.n, "summary": s, "windows": windows},
                                    indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
