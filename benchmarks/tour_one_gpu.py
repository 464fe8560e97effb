"""The one-GPU tour against its targets (run on one H100 or H200): the whole tour under 60 s, and host<->device
copies by nvbandwidth's method within 5% of a plain copy loop in the same minute.

Run:   PYTHONPATH=src python benchmarks/tour_one_gpu.py [--out DIR]
Prints: each tour stage's seconds and the total against 60 s; then per direction the pinned host-copy rate of
        the tour's stage (nvbandwidth's method), of a plain loop of 1 GiB copies timed by the host clock, and
        their ratio against the 5% target. On a machine without a GPU it says so and runs nothing (exit 0)."""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

PLAIN_BYTES, PLAIN_COPIES = 1 << 30, 20


def plain_copy_loop_bytes_per_s(direction: str) -> float:
    """A plain loop: 1 GiB pinned <-> device copies back to back, timed by the host clock after a sync."""
    import torch
    gpu = torch.empty(PLAIN_BYTES, dtype=torch.uint8, device="cuda")
    host = torch.ones(PLAIN_BYTES, dtype=torch.uint8, pin_memory=True)
    dst, src = (gpu, host) if direction == "host->device" else (host, gpu)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(PLAIN_COPIES):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return PLAIN_BYTES * PLAIN_COPIES / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="tour output folder (default: a temporary one)")
    args = parser.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("no CUDA GPU here: this benchmark times the one-GPU tour; run it on an H100 or H200")
        return
    from meshscale.app.tour import run_tour
    out = args.out or Path(tempfile.mkdtemp(prefix="meshscale-tour-"))
    start = time.perf_counter()
    outcome = run_tour(out)
    total_s = time.perf_counter() - start
    for stage in outcome.stages:
        print(f"stage {stage.name:<12} {stage.status:<8} {stage.seconds:6.1f} s {stage.note}")
    print(f"tour total {total_s:.1f} s (target under 60 s): {'met' if total_s < 60 else 'NOT met'}")
    copies = json.loads((out / "host-copy.json").read_text())
    for row in (r for r in copies["rows"] if r["memory"] == "pinned"):
        plain = plain_copy_loop_bytes_per_s(row["direction"])
        ratio = row["bandwidth_bytes_per_s"] / plain
        print(f"{row['direction']:<13} pinned: tour {row['bandwidth_bytes_per_s'] / 1e9:6.1f} GB/s, plain 1 GiB loop "
              f"{plain / 1e9:6.1f} GB/s, ratio {ratio:.3f} (target within 5%: {'met' if abs(ratio - 1) <= 0.05 else 'NOT met'})")
    print(f"report: {outcome.index}")


if __name__ == "__main__":
    main()
