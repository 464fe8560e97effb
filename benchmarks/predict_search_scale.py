"""How `predict --search` and the cluster commands grow with the cluster (issue 44: bounded work from any input).

Each command runs as a user runs it (a new process): `predict --search` of Llama 3 70B on 64, 1,024, 8,192 and
65,536 GPUs of hgx-h100 (8 to 8,192 nodes, 8x NDR each), then sim, plan (its refusal above 32 ranks), place and
cluster on 8,192 nodes. Targets on a 2-core machine: 64 GPUs under 2 s, 65,536 under 15 s. With ``--before SRC``
(the src/ of an older checkout) every command runs on it too and the ratio before / after is printed. Then the
mechanism: the node parts built to price a collective over every GPU of 16 and of 2,048 nodes (one node's
graph and the network's shape, whatever the size: the same few parts).

    PYTHONPATH=src python benchmarks/predict_search_scale.py [--before OLD/src] [--timeout 300]

Measured on the 2-core development machine (load about 1 from other sessions), main at 321d553 before, this change
after: predict --search 64 GPUs 4.4 s -> 1.9 s, 1,024 GPUs 11.2 s -> 4.8 s, 8,192 GPUs 21.5 s -> 7.3 s, 65,536
GPUs 59.7 s -> 11.3 s; sim on 8,192 nodes 6.2 s -> 1.1 s, plan's refusal 4.4 s -> 0.7 s, place on 8,192 nodes
killed at 150 s (300 s too) -> 2.3 s; cluster 0.4 s both. Node parts built: [0, 1] at 16 and at 2,048 nodes.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PREDICT = ["predict", "--model", "llama3-70b", "--system", "hgx-h100", "--search"]
CASES = [("predict --search, 64 GPUs", PREDICT + ["--gpus", "64"], 2.0),
         ("predict --search, 1,024 GPUs", PREDICT + ["--gpus", "1024"], None),
         ("predict --search, 8,192 GPUs", PREDICT + ["--gpus", "8192"], None),
         ("predict --search, 65,536 GPUs", PREDICT + ["--gpus", "65536"], 15.0),
         ("sim all_reduce, 8,192 nodes", ["sim", "all_reduce", "--system", "hgx-h100", "--nodes", "8192"], None),
         ("plan (refused: > 32 ranks), 8,192 nodes", ["plan", "all_reduce", "--system", "hgx-h100", "--nodes", "8192"],
          None),
         ("place 64 GPUs, 8,192 nodes", ["place", "--system", "hgx-h100", "--nodes", "8192", "--gpus", "64"], None),
         ("cluster, 8,192 nodes", ["cluster", "--node", "hgx-h100", "--nodes", "8192", "--link", "ndr", "--nics", "8"],
          None)]


def timed(src: Path, args: list[str], timeout_s: float) -> tuple[float | None, int]:
    """Seconds one command takes as a new process on ``src`` (None: killed at ``timeout_s``), and its exit code."""
    env = dict(os.environ, PYTHONPATH=str(src), COLUMNS="200")
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "meshscale", *args], env=env, capture_output=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, -1
    return time.perf_counter() - start, done.returncode


def parts_built(nodes: int) -> list[int]:
    """The nodes whose parts were built to price all_reduce, all_gather over every GPU of a cluster of ``nodes``
    hgx-h100 and a send from node 0 to node 1."""
    from meshscale.simulate.cost import Call
    from meshscale.simulate.fabric import resolve_fabric
    from meshscale.topology import cluster

    built: set[int] = set()
    originals = {name: getattr(cluster, name) for name in ("_part_nodes", "_part_links")}
    for name, original in originals.items():
        setattr(cluster, name, lambda plan, points, k, f=original: built.add(k) or f(plan, points, k))
    try:
        fabric = resolve_fabric("hgx-h100", {"nodes": nodes})
        ranks = tuple(range(fabric.world_size))
        for collective in ("all_reduce", "all_gather"):
            fabric.cost(Call(collective, 1 << 26, ranks))
        fabric.cost(Call("send_recv", 1 << 20, (0, 8)))
    finally:
        for name, original in originals.items():
            setattr(cluster, name, original)
    return sorted(built)


def show(seconds: float | None) -> str:
    return f"{seconds:7.2f} s" if seconds is not None else "  killed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="the src/ of an older checkout, timed beside this one")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a command is killed")
    args = parser.parse_args()
    print(f"{'command':42s} {'after':>9s}" + (f" {'before':>9s} {'ratio':>7s}" if args.before else "") + "  target")
    for label, command, target_s in CASES:
        after, code = timed(SRC, command, args.timeout)
        line = f"{label:42s} {show(after)}"
        if args.before:
            before, _ = timed(args.before, command, args.timeout)
            ratio = (before or args.timeout) / after if after else float("nan")
            line += f" {show(before)} {('>' if before is None else ' ')}{ratio:5.1f}x"
        if target_s is not None:
            line += f"  under {target_s:.0f} s: " + ("ok" if after is not None and after < target_s else "TOO SLOW")
        print(line + (f"  (exit {code})" if code not in (0, 2) else ""))
    small, large = parts_built(16), parts_built(2048)
    print(f"node parts built to price collectives over every GPU: 16 nodes {small}, 2,048 nodes {large} "
          f"({'the same' if small == large else 'DIFFERENT'})")


if __name__ == "__main__":
    main()
