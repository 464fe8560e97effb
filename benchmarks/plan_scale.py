"""How `plan`'s cost grows with the cluster: meshscale's schedules simulated on 1, 2 and 4 nodes (8, 16, 32 ranks).

    .venv/bin/python benchmarks/plan_scale.py [--systems hgx-h100,dgx-a100] [--collective all_reduce] [--bytes 256M]
        [--nodes 1,2,4,8] [--link ndr] [--nics 8]

For each system and node count: the CPU time of `plan` (this one-threaded process; on a busy machine the CPU time
is the figure to compare with the targets: under 3 s for 32 ranks), the wall time, the schedule it chose and its
busbw; then the ratio of the 32-rank time to the 8-rank one. Past 32 ranks `plan` refuses in one line
(`simulate.plan.MAX_PLAN_RANKS`); the script shows that refusal and its time too. CPU only.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the figure is for one core

from meshscale.errors import MeshscaleError  # noqa: E402
from meshscale.simulate.plan import plan  # noqa: E402
from meshscale.topology.cluster import system_or_cluster  # noqa: E402
from meshscale.units import gbps, parse_bytes  # noqa: E402

NODES = (1, 2, 4)


def timed_plan(system: str, nodes: int, collective: str, nbytes: int, link: str | None = None,
               nics: int | None = None) -> tuple[float, float, str]:
    """(CPU s, wall s, what it chose) of one plan, the cluster built fresh (no routes remembered)."""
    wall, cpu = time.perf_counter(), time.process_time()
    topo = system_or_cluster(system, nodes, link, nics) if nodes > 1 else system_or_cluster(system)
    ranks = [topo.nodes[d].index for d in topo.devices()]
    try:
        p = plan(topo, collective, ranks, nbytes)
        chose = f"{p.result.detail}, busbw {gbps(p.result.busbw_bytes_per_s):.2f} GB/s"
    except MeshscaleError as exc:
        chose = f"refused: {exc}"
    return time.process_time() - cpu, time.perf_counter() - wall, chose


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default="hgx-h100,dgx-a100")
    parser.add_argument("--collective", default="all_reduce")
    parser.add_argument("--bytes", default="256M")
    parser.add_argument("--nodes", default=",".join(str(n) for n in NODES + (8,)), help="node counts, e.g. 2,4")
    parser.add_argument("--link", default=None, help="cluster network (as plan --link); default: the system's")
    parser.add_argument("--nics", type=int, default=None, help="network ports per node (as plan --nics)")
    args = parser.parse_args()
    nbytes = parse_bytes(args.bytes)
    for system in args.systems.split(","):
        timed_plan(system, 1, args.collective, nbytes)  # untimed: the libraries load on first use
        cpu_of = {}
        for nodes in [int(n) for n in args.nodes.split(",")]:
            cpu, wall, chose = timed_plan(system, nodes, args.collective, nbytes, args.link, args.nics)
            cpu_of[nodes] = cpu
            print(f"{system} x{nodes}: {cpu:6.2f} s CPU {wall:6.2f} s wall  {chose}")
        if 1 in cpu_of and 4 in cpu_of:
            print(f"{system}: 32 ranks / 8 ranks = {cpu_of[4] / cpu_of[1]:.2f}x (CPU)")


if __name__ == "__main__":
    main()
