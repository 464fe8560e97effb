"""What `bench collective --iter-times` costs: the all_reduce sweep with and without an event between calls, in
turns (plain, timed per call, plain, ...), on every GPU of this machine. Prints per size the median mean-time of
each way over the rounds and their ratio (1.00: the events change nothing), and each way's spread.
    PYTHONPATH=src python3 benchmarks/experiments/iter_times_overhead.py [ROUNDS]"""
import statistics
import sys

import torch

from meshscale.bench.collective import CollectiveSpec, bench_collectives
from meshscale.execute.world import World
from meshscale.units import format_bytes, sweep_sizes


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    world = World(torch.cuda.device_count(), "nccl") if torch.cuda.is_available() else World(2, "gloo")
    sizes = sweep_sizes(1 << 10, 512 << 20 if world.backend == "nccl" else 1 << 20, 4)
    times = {False: {s: [] for s in sizes}, True: {s: [] for s in sizes}}
    for _ in range(rounds):
        for each in (False, True):
            spec = CollectiveSpec(collectives=["all_reduce"], sizes_bytes=sizes, places=("in",), iter_times=each)
            for row in bench_collectives(spec, world).rows:
                times[each][row["size_bytes"]].append(row["time_s"])
    print(f"all_reduce over {world.size} ranks ({world.backend}), mean time per call (us), median of {rounds} rounds")
    print(f"{'size':>8} {'plain':>10} {'per call':>10} {'ratio':>6}   plain spread  per-call spread")
    for s in sizes:
        plain, each = statistics.median(times[False][s]), statistics.median(times[True][s])
        spread = lambda t: f"{min(t) * 1e6:.1f}-{max(t) * 1e6:.1f}"
        print(f"{format_bytes(s):>8} {plain * 1e6:>10.2f} {each * 1e6:>10.2f} {each / plain:>6.3f}   "
              f"{spread(times[False][s]):>13}  {spread(times[True][s]):>15}")


if __name__ == "__main__":  # the ranks are spawned processes that import this file
    main()
