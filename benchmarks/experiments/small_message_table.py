"""One table of small-message times (us, 1 KiB .. 1 MiB) from every source of one session, side by side:
nccl-tests' reference, the NCCL C launch loop (nccl_c_loop.cu) in both launch configurations, and any number
of `meshscale bench collective` JSON files (median over the files given per label).
    python benchmarks/experiments/small_message_table.py --c-loop nccl-c-loop.txt --bench "impl nccl=a.json,b.json" \\
        --bench "native=c.json" [--reference benchmarks/reference/nccl-tests-h200x2.txt]"""
import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_nccl_tests import parse_nccl_tests  # noqa: E402

COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv"]
IN_PLACE = {"all_reduce", "broadcast"}  # the reference column meshscale compares with (torch has only in-place)


def c_loop(path: Path) -> dict:
    """{(mode, collective, size): us} from nccl_c_loop's output lines."""
    out = {}
    for line in path.read_text().splitlines():
        f = line.split()
        if len(f) == 5 and f[0] in ("threads", "procs"):
            out[(f[0], f[1], int(f[2]))] = float(f[3])
    return out


def bench_times(paths: list[str]) -> dict:
    """{(collective, size): median us over the files}, the place compared with the reference."""
    acc: dict = {}
    for p in paths:
        for r in json.loads(Path(p).read_text())["rows"]:
            if r["inplace"] == (r["collective"] in IN_PLACE):
                acc.setdefault((r["collective"], r["size_bytes"]), []).append(r["time_s"] * 1e6)
    return {k: statistics.median(v) for k, v in acc.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path, default=Path(__file__).resolve().parent / "reference" / "nccl-tests-h200x2.txt")
    ap.add_argument("--c-loop", type=Path)
    ap.add_argument("--bench", action="append", default=[], help="LABEL=file.json[,file.json...]")
    args = ap.parse_args()
    ref = parse_nccl_tests(args.reference)
    loop = c_loop(args.c_loop) if args.c_loop else {}
    benches = [(label, bench_times(files.split(","))) for label, files in (b.split("=", 1) for b in args.bench)]
    head = ["collective", "size B", "nccl-tests ref"] + (["C loop, 1 thread", "C loop, 1 proc/GPU"] if loop else [])
    head += [f"meshscale {label}" for label, _ in benches] + [f"{label} / ref" for label, _ in benches]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for c in COLLECTIVES:
        size = 1024
        while size <= 1 << 20:
            r = ref.get((c, size, c in IN_PLACE))
            cells = [c, str(size), f"{r['time_s'] * 1e6:.1f}" if r else "-"]
            if loop:
                cells += [f"{loop.get((m, c, size), float('nan')):.1f}" for m in ("threads", "procs")]
            values = [b.get((c, size)) for _, b in benches]
            cells += [f"{v:.1f}" if v else "-" for v in values]
            cells += [f"{v / (r['time_s'] * 1e6):.2f}" if v and r else "-" for v in values]
            print("| " + " | ".join(cells) + " |")
            size *= 4


if __name__ == "__main__":
    main()
