"""The cluster study from the command line: `meshscale sim --nodes N` for 1 to 124 DGX-1 nodes, EDR InfiniBand
against 10 GbE, NCCL's ring against its tree (the hierarchical algorithm: chains inside a node, a tree across
nodes) for all_reduce, and ring all_gather (NCCL has no tree all_gather), at one gradient-bucket size.

    PYTHONPATH=src python benchmarks/experiments/cluster_study_cli.py [--system dgx1-p100] [--size 64M] [--out docs/results]

Writes cluster-study-cli.md (the table, and where each stops scaling) and cluster-study-cli.png.
Every figure is PREDICTED by NCCL's cost model; each comes from one `meshscale sim ... --json` run.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

NODES = (1, 2, 4, 8, 16, 32, 64, 124)
LINKS = ("edr", "10gbe")
CASES = (("all_reduce", "ring"), ("all_reduce", "tree"), ("all_gather", "ring"))
SCALING_STOPS = 0.9  # a node count whose busbw is below this share of the best so far stops scaling


def sim(system: str, nodes: int, link: str, collective: str, algo: str, size: str, tmp: Path) -> dict:
    """One `meshscale sim` run; its single row."""
    out = tmp / f"{collective}-{algo}-{link}-{nodes}.json"
    cmd = [sys.executable, "-m", "meshscale", "sim", collective, "-s", system, "--nodes", str(nodes),
           "--link", link, "--nccl-algo", algo, "-b", size, "-e", size, "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
    row = json.loads(out.read_text())["rows"][0]
    return {"nodes": nodes, "link": link, "collective": collective, "algo": algo, "gpus": len(row.get("ranks", [])) or None,
            "busbw_bytes_per_s": row["busbw_bytes_per_s"], "time_s": row["time_s"], "picked": row["algorithm"]}


def stops_scaling(points: list[dict]) -> str:
    """Where the aggregate rate (busbw x GPUs) stops growing in proportion: the first node count past which busbw
    falls below SCALING_STOPS of its best so far."""
    best = 0.0
    for p in points:
        if p["nodes"] > 1 and best and p["busbw_bytes_per_s"] < SCALING_STOPS * best:
            return f"{p['nodes']} nodes ({p['busbw_bytes_per_s'] / best:.0%} of the best busbw before)"
        if p["nodes"] > 1:
            best = max(best, p["busbw_bytes_per_s"])
    return "scales to 124 nodes (busbw within 10% of its best)"


def chart(rows: list[dict], title: str, path: Path) -> Path:
    """busbw against nodes: `plots.busbw_chart` with the node counts on the x axis."""
    from matplotlib.ticker import ScalarFormatter

    from meshscale import plots

    series = []
    for link in LINKS:
        for collective, algo in CASES:
            pts = [r for r in rows if r["link"] == link and r["collective"] == collective and r["algo"] == algo]
            series.append(plots.Series(f"{collective} {algo}, {link.upper()}", [p["nodes"] for p in pts],
                                       [p["busbw_bytes_per_s"] for p in pts], "predicted"))
    fig = plots.busbw_chart(title, series)
    ax = fig.axes[0]
    ax.set_xticks(NODES, [str(n) for n in NODES])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.set_xlabel("DGX-1 nodes")
    return plots.save(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="dgx1-p100")
    ap.add_argument("--size", default="64M")
    ap.add_argument("--out", default="docs/results")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        jobs = [(args.system, n, link, c, a, args.size, Path(tmp)) for link in LINKS for c, a in CASES for n in NODES]
        rows = list(pool.map(lambda j: sim(*j), jobs))
    key = {(r["link"], r["collective"], r["algo"], r["nodes"]): r for r in rows}
    lines = [f"# Cluster study from the CLI: {args.system} nodes, {args.size} per collective (PREDICTED)", "",
             f"Made by `benchmarks/experiments/cluster_study_cli.py`: one `meshscale sim COLLECTIVE -s {args.system} --nodes N "
             f"--link LINK --nccl-algo ALGO -b {args.size} -e {args.size}` per cell. NCCL's cost model across nodes: "
             "4 NICs per node for EDR (GPUDirect RDMA through the PCIe switches), 2 for 10 GbE (on a CPU: no "
             "GPUDirect); tree is NCCL's hierarchical algorithm (chains inside each node, a tree across nodes). "
             "NCCL picks the protocol (LL, LL128, Simple); the column says which.", "",
             "busbw, GB/s:", "",
             "| nodes | GPUs | " + " | ".join(f"{c} {a} {l.upper()}" for l in LINKS for c, a in CASES) + " |",
             "|---:|---:|" + "---:|" * (len(LINKS) * len(CASES))]
    for n in NODES:
        cells = []
        for link in LINKS:
            for c, a in CASES:
                r = key[(link, c, a, n)]
                cells.append(f"{r['busbw_bytes_per_s'] / 1e9:.2f} ({r['picked'].split(',')[0].replace('nccl ', '')})")
        gpus = n * 8
        lines.append(f"| {n} | {gpus} | " + " | ".join(cells) + " |")
    lines += ["", "Where each stops scaling (busbw below 90% of its best at fewer nodes; busbw is per GPU, so a flat "
              "busbw means the aggregate grows with the GPUs):", ""]
    for link in LINKS:
        for c, a in CASES:
            pts = [key[(link, c, a, n)] for n in NODES]
            lines.append(f"- {c} {a}, {link.upper()}: leaving one node, busbw falls from "
                         f"{pts[0]['busbw_bytes_per_s'] / 1e9:.1f} to {pts[1]['busbw_bytes_per_s'] / 1e9:.1f} GB/s "
                         f"(the network, not NVLink, is the bottleneck); across nodes: {stops_scaling(pts)}")
    png = chart(rows, f"{args.system} cluster, {args.size}: NCCL ring vs tree, EDR vs 10 GbE (PREDICTED)",
                out / "cluster-study-cli.png")
    lines += ["", f"![busbw against nodes]({png.name})", ""]
    (out / "cluster-study-cli.md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {out / 'cluster-study-cli.md'} and {png}")


if __name__ == "__main__":
    main()
