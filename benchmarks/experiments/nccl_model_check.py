"""Predicted (meshscale's NCCL model, defaults) vs measured NCCL figures: the nccl-tests tables measured here
(2x / 4x H200, NCCL 2.28.9, NVLS off, one thread driving all GPUs), published 8-GPU rows of a corpus CSV, and
runs with NCCL_ALGO x NCCL_PROTO forced (one process per GPU; meshscale Result JSON files named
COLLECTIVE-ALGO-PROTO.json): NCCL's own formula (latency + size / bandwidth) and the predicted time against
the measured one, algorithm by protocol. A check, not a fit: nothing here feeds back into the model.

    python benchmarks/experiments/nccl_model_check.py [--reference DIR] [--corpus FILE] [--forced DIR ...] [--all-sizes]
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
from pathlib import Path

from meshscale.collectives.kinds import kind
from meshscale.simulate.nccl import analyse, constants, predict
from meshscale.simulate.nccl.tuning import bus_bandwidth, latency_us
from meshscale.topology.catalog import load_system

SIZES = (1 << 10, 1 << 16, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 30)
NAMES = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather", "reduce_scatter_perf": "reduce_scatter",
         "alltoall_perf": "all_to_all", "broadcast_perf": "broadcast", "sendrecv_perf": "send_recv",
         "reduce_perf": "reduce"}


def nccl_tests_rows(path: Path):
    """(collective, gpus, gpus per thread, size, out-of-place time us) from an nccl-tests log."""
    collective, gpus = None, 0
    for line in path.read_text().splitlines():
        m = re.search(r"Collective test starting: (\w+)", line)
        if m:
            collective = NAMES.get(m.group(1))
        m = re.search(r"nThread (\d+) nGpus (\d+)", line)
        if m:
            gpus = int(m.group(2))
        fields = line.split()
        if collective and len(fields) >= 8 and fields[0].isdigit():
            yield collective, gpus, gpus, int(fields[0]), float(fields[5])


def corpus_rows(path: Path):
    """(system, collective, gpus, size, time us, version, algo) of the single-node rows of the corpus."""
    for r in csv.DictReader(path.open()):
        if r["nodes"] != "1" or r["system"] not in ("dgx-a100", "hgx-h100", "hgx-h200", "hgx-h20"):
            continue
        n, size = int(r["gpus"]), int(r["size_bytes"])
        if r["time_us"]:
            t = float(r["time_us"])
        elif float(r["busbw_GBps"] or 0) > 0:
            t = size * kind(r["collective"]).busbw_factor(n) / (float(r["busbw_GBps"]) * 1e3)
        else:
            continue
        algo = "nvls" if r["algo"].upper().startswith("NVLS") else None
        yield r["system"], r["collective"], n, size, t, r["nccl_version"] or None, algo


def forced_rows(folder: Path):
    """(collective, algo, proto, gpus, size, time us) of forced runs (COLLECTIVE-ALGO-PROTO.json), out of place
    where measured, else in place."""
    for path in sorted(folder.glob("*-*-*.json")):
        collective, algo, proto = path.stem.split("-")
        data = json.loads(path.read_text())
        n = int(data["meta"]["world_size"])
        by_size: dict[int, float] = {}
        for r in sorted(data["rows"], key=lambda r: not r["inplace"]):  # out-of-place rows last: they win
            by_size[int(r["size_bytes"])] = float(r["time_s"]) * 1e6
        for size, t in sorted(by_size.items()):
            yield collective, algo, proto, n, size, t


def forced_report(folder: Path, all_sizes: bool) -> None:
    """Measured vs NCCL's formula (its own latency and bandwidth) vs the predicted time, per forced pair."""
    topo = load_system("hgx-h200")
    c = constants("2.28")
    print(f"\n{folder} (forced NCCL_ALGO x NCCL_PROTO, one process per GPU)")
    print(f"{'pair':<28}{'size':>11}{'measured us':>13}{'NCCL formula':>14}{'predicted':>11}{'formula err':>12}")
    for coll, algo, proto, n, size, t in forced_rows(folder):
        if not all_sizes and size not in SIZES:
            continue
        s = analyse(topo, list(range(n)), "2.28")
        formula = latency_us(s, c, coll, algo.lower(), proto) + size / (1000 * bus_bandwidth(s, c, coll, algo.lower(), proto))
        p = predict(topo, coll, list(range(n)), size, nccl_version="2.28", nccl_algo=algo, proto=proto, nvls=False)
        print(f"{f'{n}x {coll} {algo}/{proto}':<28}{size:>11}{t:>13.1f}{formula:>14.1f}{p.time_s * 1e6:>11.1f}"
              f"{(formula / t - 1) * 100:>11.0f}%")


def report(label: str, rows: list[tuple]) -> None:
    print(f"\n{label}")
    print(f"{'collective':<15}{'size':>11}{'measured us':>13}{'predicted us':>14}{'error':>8}  choice")
    for coll, size, meas, pred, detail in rows:
        print(f"{coll:<15}{size:>11}{meas:>13.1f}{pred:>14.1f}{(pred / meas - 1) * 100:>7.0f}%  {detail}")


def geomean_abs(errors: list[float]) -> float:
    return math.exp(sum(math.log(1 + abs(e)) for e in errors) / len(errors)) - 1 if errors else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reference", default="/work/shared/reference")
    ap.add_argument("--corpus", default="/work/research/corpus.csv")
    ap.add_argument("--forced", nargs="*", default=["/work/research/forced/h200x2", "/work/research/forced/h200x4"],
                    help="folders of forced NCCL_ALGO x NCCL_PROTO runs")
    ap.add_argument("--all-sizes", action="store_true", help="every size, not only 1K, 64K, 1M, 4M, 16M, 64M, 1G")
    args = ap.parse_args()
    small, large = [], []
    for name in ("nccl-tests-h200x2.txt", "nccl-tests-h200x4.txt"):
        path = Path(args.reference) / name
        if not path.exists():
            continue
        topo = load_system("hgx-h200")
        rows = []
        for coll, n, per_thread, size, t in nccl_tests_rows(path):
            p = predict(topo, coll, list(range(n)), size, nccl_version="2.28", nvls=False, gpus_per_thread=per_thread)
            err = p.time_s * 1e6 / t - 1
            (large if size >= 1 << 20 else small).append(err)
            if args.all_sizes or size in SIZES:
                rows.append((coll, size, t, p.time_s * 1e6, p.detail))
        report(f"{name} (NCCL 2.28, NVLS off, one thread drives all GPUs)", rows)
    corpus = Path(args.corpus)
    if corpus.exists():
        rows = []
        for system, coll, n, size, t, version, algo in corpus_rows(corpus):
            topo = load_system("hgx-h100" if system == "hgx-h20" else system)
            p = predict(topo, coll, list(range(n)), size, nccl_version=version, nccl_algo=algo)
            err = p.time_s * 1e6 / t - 1
            (large if size >= 1 << 20 else small).append(err)
            rows.append((f"{system} {coll}", size, t, p.time_s * 1e6, p.detail + (" [NVLS forced]" if algo else "")))
        report(f"{corpus} (single node, 8 GPUs, one process per GPU)", rows)
    for folder in map(Path, args.forced):
        if folder.is_dir():
            forced_report(folder, args.all_sizes)
    print(f"\ngeomean |error|: >= 1 MiB {geomean_abs(large) * 100:.1f}% ({len(large)} rows), "
          f"< 1 MiB {geomean_abs(small) * 100:.1f}% ({len(small)} rows); "
          f"worst ratio {max(max(1 + e, 1 / (1 + e)) for e in small + large):.2f}x")


if __name__ == "__main__":
    main()
