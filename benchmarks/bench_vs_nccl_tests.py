"""Run meshscale's collective sweep and p2p matrix on all GPUs and compare with nccl-tests' published output.

    python benchmarks/bench_vs_nccl_tests.py OUTDIR [--reference benchmarks/reference/nccl-tests-h200x2.txt]

Sweeps 1K..1G (factor 4, as the reference) for all_reduce, all_gather, reduce_scatter, broadcast, reduce,
all_to_all and send_recv, float32 sum, 5 warm-up + 20 timed iterations, time averaged over ranks (nccl-tests'
default -a 1), then for every size the reference also has: busbw ratio (meshscale / nccl-tests; target within
5 % for sizes >= 64 MiB) and time ratio (target within 25 % for sizes <= 1 MiB). The reference column used is the
one meshscale measured: out-of-place where torch.distributed has it, else in-place. Also a p2p run.
``--impl nccl`` times NCCL called directly (as nccl-tests does) instead of torch.distributed's eager path.
Writes to OUTDIR: bench-collective.{json,txt}, ratios.{csv,md}, p2p.{json,txt,png}. Exit code 1 if a target
is missed (the files are written anyway).
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch
from rich.console import Console

from meshscale.bench.collective import CollectiveSpec, bench_collectives
from meshscale.plots import p2p_chart, save
from meshscale.bench.p2p import P2PSpec, bench_p2p
from meshscale.bench.tables import collective_tables, p2p_tables
from meshscale.execute.world import World
from meshscale.collectives.kinds import kind
from meshscale.errors import MeshscaleError
from meshscale.units import sweep_sizes

HERE = Path(__file__).resolve().parent
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "send_recv"]
BIG_BYTES, SMALL_BYTES = 64 << 20, 1 << 20
BUSBW_TOLERANCE, TIME_TOLERANCE = 0.05, 0.25


def parse_nccl_tests(path: Path) -> dict[tuple[str, int, bool], dict[str, float]]:
    """{(collective, size_bytes, inplace): {time_s, algbw_bytes_per_s, busbw_bytes_per_s}} from nccl-tests output."""
    table, collective = {}, None
    for line in path.read_text().splitlines():
        if line.startswith("# Collective test starting:"):
            binary = line.split(":", 1)[1].strip().removesuffix("_perf")
            try:
                collective = kind(binary).name  # nccl-tests' binary names are the records' aliases
            except MeshscaleError:
                collective = binary
            continue
        fields = line.split()
        if line.startswith("#") or len(fields) != 13 or collective is None:
            continue
        size = int(fields[0])
        for inplace, (t, algbw, busbw) in ((False, fields[5:8]), (True, fields[9:12])):
            table[(collective, size, inplace)] = {"time_s": float(t) * 1e-6, "algbw_bytes_per_s": float(algbw) * 1e9,
                                                  "busbw_bytes_per_s": float(busbw) * 1e9}
    return table


def compare(rows: list[dict], reference: dict) -> list[dict]:
    """One line per (collective, size) found in both, with ratios and pass/fail against the targets."""
    out = []
    for row in rows:
        ref = reference.get((row["collective"], row["size_bytes"], row["inplace"]))
        if ref is None:
            continue
        busbw_ratio = row["busbw_bytes_per_s"] / ref["busbw_bytes_per_s"] if ref["busbw_bytes_per_s"] else None
        time_ratio = row["time_s"] / ref["time_s"]
        target, ok = "-", True
        if row["size_bytes"] >= BIG_BYTES:
            target, ok = "busbw within 5%", busbw_ratio is not None and abs(busbw_ratio - 1) <= BUSBW_TOLERANCE
        elif row["size_bytes"] <= SMALL_BYTES:
            target, ok = "time within 25%", abs(time_ratio - 1) <= TIME_TOLERANCE
        out.append({"collective": row["collective"], "size_bytes": row["size_bytes"], "inplace": row["inplace"],
                    "time_us": row["time_s"] * 1e6, "ref_time_us": ref["time_s"] * 1e6,
                    "busbw_gbps": row["busbw_bytes_per_s"] / 1e9, "ref_busbw_gbps": ref["busbw_bytes_per_s"] / 1e9,
                    "busbw_ratio": busbw_ratio, "time_ratio": time_ratio, "target": target,
                    "verdict": "pass" if ok else "FAIL" if target != "-" else "-"})
    return out


def write_ratios(lines: list[dict], outdir: Path) -> None:
    with open(outdir / "ratios.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(lines[0]))
        writer.writeheader()
        writer.writerows(lines)
    md = ["| collective | size (B) | place | time us | ref us | time ratio | busbw GB/s | ref GB/s | busbw ratio | target | verdict |",
          "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for l in lines:
        ratio = f"{l['busbw_ratio']:.3f}" if l["busbw_ratio"] is not None else "-"
        md.append(f"| {l['collective']} | {l['size_bytes']} | {'in' if l['inplace'] else 'out'} | {l['time_us']:.2f} | "
                  f"{l['ref_time_us']:.2f} | {l['time_ratio']:.3f} | {l['busbw_gbps']:.2f} | {l['ref_busbw_gbps']:.2f} | "
                  f"{ratio} | {l['target']} | {l['verdict']} |")
    (outdir / "ratios.md").write_text("\n".join(md) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--reference", type=Path, help="nccl-tests output (default: reference/nccl-tests-h200x<N>.txt)")
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    parser.add_argument("--max-bytes", default="1G")
    parser.add_argument("--cuda-graph", action="store_true")
    parser.add_argument("--impl", default="native", help="native (torch.distributed) or nccl (NCCL called directly)")
    parser.add_argument("--no-p2p", action="store_true", help="skip the p2p matrix")
    parser.add_argument("--p2p-size", default="1G")
    parser.add_argument("--timeout-s", type=float, default=300)
    args = parser.parse_args()
    if args.gpus < 2:
        sys.exit("needs 2 or more GPUs")
    args.outdir.mkdir(parents=True, exist_ok=True)
    console = Console(width=200, record=True)

    spec = CollectiveSpec(collectives=COLLECTIVES, sizes_bytes=sweep_sizes("1K", args.max_bytes, 4), dtypes=("float32",),
                          ops=("sum",), root=0, places=("out", "in"), warmup_iters=5, iters=20, average=1,
                          cuda_graph=args.cuda_graph, impl=args.impl)
    result = bench_collectives(spec, World(args.gpus, "nccl"), args.timeout_s)
    result.save(args.outdir / "bench-collective.json")
    for table in collective_tables(result):
        console.print(table)
    (args.outdir / "bench-collective.txt").write_text(console.export_text())

    reference_path = args.reference or HERE / "reference" / f"nccl-tests-h200x{args.gpus}.txt"
    lines = compare(result.rows, parse_nccl_tests(reference_path)) if reference_path.exists() else []
    failed = [l for l in lines if l["verdict"] == "FAIL"]
    if lines:
        write_ratios(lines, args.outdir)
        console.print((args.outdir / "ratios.md").read_text())
        console.print(f"reference {reference_path.name}: {len(lines)} sizes compared, "
                      f"{sum(l['verdict'] == 'pass' for l in lines)} pass, {len(failed)} FAIL")
    else:
        console.print(f"no reference at {reference_path}: ratios skipped")

    if args.no_p2p:
        return 1 if failed else 0
    from meshscale.units import parse_bytes
    p2p = bench_p2p(P2PSpec(parse_bytes(args.p2p_size), iters=10, latency_iters=200), World(args.gpus, "nccl"))
    p2p.save(args.outdir / "p2p.json")
    save(p2p_chart(p2p), args.outdir / "p2p.png")
    p2p_console = Console(width=200, record=True)
    for table in p2p_tables(p2p):
        p2p_console.print(table)
    (args.outdir / "p2p.txt").write_text(p2p_console.export_text())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
