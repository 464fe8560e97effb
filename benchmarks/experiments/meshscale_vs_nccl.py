"""meshscale's own all_reduce schedules over NCCL, beside NCCL's all_reduce and the simulator's prediction.

    python benchmarks/experiments/meshscale_vs_nccl.py OUTDIR [--min-bytes 1M] [--max-bytes 1G] [--algos ring,direct]
    python benchmarks/experiments/meshscale_vs_nccl.py OUTDIR --cpus 3 --max-bytes 4M     # the same pipeline over Gloo

In one call: (1) `bench p2p` on all GPUs, (2) SimParams calibrated from it (nothing else), (3) for every size,
NCCL's all_reduce and each meshscale schedule (executed with batch_isend_irecv per step) timed on all ranks
(slowest rank, mean of --iters after --warmup) and checked exactly (small integers in float32), (4) the
simulator's prediction for each (the library's own, "native", as meshscale's `auto`), with the error per size. Writes
OUTDIR/p2p.json, OUTDIR/meshscale_vs_nccl.json (a meshscale Result) and OUTDIR/meshscale_vs_nccl.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from meshscale.bench.p2p import P2PSpec, bench_p2p
from meshscale.bench.world_topology import world_topology
from meshscale.execute.world import resolve_world
from meshscale.collectives.algorithms import build
from meshscale.collectives.kinds import kind
from meshscale.execute import launch
from meshscale.execute.schedule_runner import schedule_callable
from meshscale.results import measured
from meshscale.simulate import calibrate, simulate
from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric
from meshscale.units import format_bytes, gbps, parse_bytes


def _sizes(lo: int, hi: int, n: int) -> list[int]:
    sizes, size = [], lo
    while size <= hi:
        sizes.append(size // (4 * n) * 4 * n)  # whole float32 elements per rank
        size *= 2
    return sizes


def rank_main(ctx, ranks, sizes, algos, topo_data, warmup, iters):
    """On every rank: per size, native all_reduce and each schedule; returns rows (slowest-rank times)."""
    from meshscale.topology import from_dict
    topo = from_dict(topo_data)
    n, dev = ctx.world_size, ctx.device
    rows = []
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for size in sizes:
        count = size // 4
        pattern = (torch.arange(count, device=dev, dtype=torch.float32) % 7) + 1
        want = pattern * (n * (n + 1) / 2)
        for impl in ("native", *algos):
            ctx.phase(f"{impl} all_reduce {format_bytes(size)}")
            inp = pattern * (ctx.rank + 1)
            out = torch.empty_like(inp)
            if impl == "native":  # in place, as nccl-tests times it (the check below runs on a fresh copy)
                out.copy_(inp)

                def op():
                    dist.all_reduce(out)
            else:
                run = schedule_callable(build(impl, "all_reduce", ranks, size, topo))

                def op():
                    run(inp, out)
            op()
            sync()
            wrong = int((out != want).sum().item())
            if impl == "native":
                out.copy_(inp)  # keep the timed in-place sums small
            for _ in range(warmup):
                op()
            sync()
            ctx.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                op()
            sync()
            elapsed = torch.tensor([(time.perf_counter() - start) / iters, float(wrong)], device=dev, dtype=torch.float64)
            dist.all_reduce(elapsed[:1], op=dist.ReduceOp.MAX)
            dist.all_reduce(elapsed[1:], op=dist.ReduceOp.SUM)
            rows.append({"impl": impl, "size_bytes": size, "time_s": float(elapsed[0]), "wrong": int(elapsed[1])})
            del inp, out
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--min-bytes", default="1M")
    parser.add_argument("--max-bytes", default="1G")
    parser.add_argument("--algos", default="ring,direct", help="meshscale algorithms to execute")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--cpus", type=int, default=None, help="CPU workers over Gloo instead of all GPUs")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)

    world = resolve_world(None, args.cpus)
    topo = world_topology(world)
    if topo is None:
        sys.exit("cannot tell this machine's topology (more ranks than local devices?)")
    ranks = [topo.nodes[d].index for d in topo.devices()][: world.size]
    print(f"{world.size} ranks over {world.backend} on {topo.name}: {topo.title}", flush=True)

    p2p = bench_p2p(P2PSpec(size_bytes=(256 << 20) if world.backend == "nccl" else (16 << 20)), world, args.timeout_s)
    p2p.save(args.outdir / "p2p.json")
    params = calibrate(topo, p2p)
    print(f"simulator: {params.source}", flush=True)

    from meshscale.topology import to_dict
    algos = [a for a in args.algos.split(",") if a]
    sizes = _sizes(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes), world.size)
    measured_rows = launch(rank_main, world.size, (ranks, sizes, algos, to_dict(topo), args.warmup, args.iters),
                           backend=world.backend, timeout_s=args.timeout_s)[0]

    factor = kind("all_reduce").busbw_factor(world.size)
    rows = []
    for r in measured_rows:
        size = r["size_bytes"]
        if r["impl"] == "native":
            pred = Fabric(topo, params=params, algo="auto").cost(Call("all_reduce", size, tuple(ranks)))
        else:
            pred = simulate(build(r["impl"], "all_reduce", ranks, size, topo), topo, params)
        busbw = size / r["time_s"] * factor
        rows.append({**r, "collective": "all_reduce", "busbw_bytes_per_s": busbw,
                     "predicted_time_s": pred.time_s, "predicted_busbw_bytes_per_s": pred.busbw_bytes_per_s,
                     "predicted_algorithm": pred.detail or pred.algorithm,
                     "error": (pred.time_s - r["time_s"]) / r["time_s"]})
    result = measured("bench-collective", rows, benchmark="meshscale_vs_nccl", world_size=world.size,
                      backend=world.backend, system=topo.name, params=params.source)
    result.save(args.outdir / "meshscale_vs_nccl.json")

    impls = ["native", *algos]
    head = "| size | " + " | ".join(f"{i} busbw GB/s | {i} predicted | {i} error" for i in impls) + " | wrong |"
    lines = [f"# meshscale schedules vs NCCL: all_reduce, {world.size} ranks ({topo.title})", "",
             f"Simulator: {params.source}. busbw as nccl-tests (factor {factor:.3f}); time = slowest rank, "
             f"mean of {args.iters} after {args.warmup} warm-up; error = (predicted - measured) / measured time.", "",
             head, "|" + "---|" * (2 + 3 * len(impls))]
    for size in sizes:
        by = {r["impl"]: r for r in rows if r["size_bytes"] == size}
        cells = [format_bytes(size)]
        for i in impls:
            r = by[i]
            cells += [f"{gbps(r['busbw_bytes_per_s']):.1f}", f"{gbps(r['predicted_busbw_bytes_per_s']):.1f}",
                      f"{100 * r['error']:+.0f}%"]
        cells.append(str(sum(r["wrong"] for r in by.values())))
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    (args.outdir / "meshscale_vs_nccl.md").write_text(text)
    print(text)
    if any(r["wrong"] for r in rows):
        sys.exit("some results were wrong (see the wrong column)")


if __name__ == "__main__":
    main()
