"""The tour's collective verdicts beside nccl-tests on the same kind of machine: for each collective, its worst
busbw against nccl-tests over the sizes both measured (the better placement of each), and the verdict the
report prints. A collective within 10% of nccl-tests at every size that still gets a warning (or worse) is a
false alarm; the script lists them and exits 1.

    python3 benchmarks/experiments/tour_verdicts.py TOUR_DIR REFERENCE.txt [--min-bytes 1M]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_nccl_tests import parse_nccl_tests  # noqa: E402

from meshscale.report.figures import measured_collective_verdict, topology_of  # noqa: E402
from meshscale.report.html import load_sources  # noqa: E402
from meshscale.units import parse_bytes  # noqa: E402

WITHIN = 0.10


def best_busbw(rows: list[dict], size: int) -> float | None:
    found = [r["busbw_bytes_per_s"] for r in rows if r["size_bytes"] == size and r.get("busbw_bytes_per_s")]
    return max(found) if found else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tour", type=Path)
    parser.add_argument("reference", type=Path)
    parser.add_argument("--min-bytes", default="0", help="compare sizes from this one up")
    args = parser.parse_args()
    reference = parse_nccl_tests(args.reference)
    sources = load_sources([args.tour])
    topo = topology_of(sources)
    runs = [s for s in sources if s.result.kind == "bench-collective" and s.result.meta.get("world_size") != 1]
    if not runs:
        print(f"no multi-rank collective result under {args.tour}")
        return 2
    false_alarms = []
    print(f"{'collective':<15} {'sizes':>5} {'worst vs nccl-tests':>20} {'at':>10}  verdict")
    for s in runs:
        for name in sorted({r["collective"] for r in s.result.rows}):
            rows = [r for r in s.result.rows if r["collective"] == name]
            ratios = []
            for size in sorted({r["size_bytes"] for r in rows if r["size_bytes"] >= parse_bytes(args.min_bytes)}):
                ours = best_busbw(rows, size)
                theirs = max((reference[(name, size, p)]["busbw_bytes_per_s"] for p in (False, True)
                              if (name, size, p) in reference), default=None)
                if ours and theirs:
                    ratios.append((ours / theirs, size))
            verdict = measured_collective_verdict(s, name, topo)
            worst, at = min(ratios) if ratios else (float("nan"), 0)
            within = bool(ratios) and worst >= 1 - WITHIN
            if within and verdict.level in ("warn", "bad"):
                false_alarms.append(name)
            print(f"{name:<15} {len(ratios):>5} {worst:>19.1%} {at:>10}  {verdict.level}: {verdict.text}")
    if false_alarms:
        print(f"FALSE ALARMS (within {WITHIN:.0%} of nccl-tests, yet a warning): {', '.join(false_alarms)}")
        return 1
    print(f"no warning on any collective within {WITHIN:.0%} of nccl-tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
