"""How fast the simulator is: a DGX-1 P100 ring all_reduce of ~100,000 transfers (4 channels, pipelined).

    .venv/bin/python benchmarks/sim_speed.py [--transfers 100000]

Prints the schedule size, the time to build it, the time to simulate it (wall and CPU time of this one-threaded
process: on a busy machine the CPU time is the figure to compare with the 5 s target) and the prediction.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the figure is for one core

from meshscale.collectives.algorithms.ring import ring  # noqa: E402
from meshscale.simulate.sim import simulate  # noqa: E402
from meshscale.topology import load_system  # noqa: E402
from meshscale.units import gbps  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transfers", type=int, default=100_000)
    parser.add_argument("--system", default="dgx1-p100")
    args = parser.parse_args()
    topo = load_system(args.system)
    ranks = [topo.nodes[d].index for d in topo.devices()]
    n = len(ranks)
    rings = [[0, 3, 2, 1, 5, 6, 7, 4], [0, 1, 3, 7, 5, 4, 6, 2]] if args.system.startswith("dgx1") else [ranks]
    channels = 2 * len(rings)
    per_piece = channels * 2 * (n - 1) * n
    pieces = max(1, round(args.transfers / per_piece))
    unit = 4 * n * channels * pieces
    nbytes = (1 << 30) // unit * unit  # about 1 GiB, split evenly
    t0 = time.perf_counter()
    schedule = ring("all_reduce", ranks, nbytes, topo, rings=rings, bidirectional=True, pieces=pieces)
    t1, c1 = time.perf_counter(), time.process_time()
    result = simulate(schedule, topo)
    t2, c2 = time.perf_counter(), time.process_time()
    count = len(schedule.transfers())
    print(f"{args.system}: ring all_reduce, {n} ranks, {channels} channels, {pieces} pieces, {nbytes / 2**20:.0f} MiB")
    print(f"transfers: {count}; build {t1 - t0:.2f} s; simulate {t2 - t1:.2f} s wall, {c2 - c1:.2f} s CPU "
          f"({count / (c2 - c1):,.0f} transfers per CPU second)")
    print(f"predicted: {result.time_s * 1e3:.2f} ms, busbw {gbps(result.busbw_bytes_per_s):.1f} GB/s")


if __name__ == "__main__":
    main()
