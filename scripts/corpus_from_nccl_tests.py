"""Append the rows of an nccl-tests output file (or of a `meshscale bench collective --json` result) to the
measurement corpus `meshscale validate` checks against.

    python scripts/corpus_from_nccl_tests.py FILE --system hgx-h200 --source benchmarks/reference/nccl-tests-h200x2.txt \
        --env NCCL_NVLS_ENABLE=0 [--gpus N] [--nccl-version 2.28.9] [--note TEXT] [--corpus CSV] [--dry-run]

Every collective and size of FILE becomes two rows, out-of-place and in-place (the time as printed, busbw when
nccl-tests printed a non-zero one). The NCCL version comes from the header (`nccl-library=22809` -> 2.28.9)
unless given; the GPU count from the `Rank` lines, else nThread x nGpus; the GPUs one thread drives from nGpus. `--env` records the environment of the
run: NCCL_ALGO / NCCL_PROTO become the forced algorithm / protocol, NCCL_NVLS_ENABLE=0 marks NVLS off. Rows
already in the corpus (same system, GPUs, collective, size, placement and source) are not added twice. The
corpus is checked after writing (`meshscale.predict.validate.load_corpus`). A `.json` FILE is a meshscale
bench result (one process per GPU; give --nccl-version); NCCL_ALGO=allreduce:Tree style values (forced for one
function, NCCL >= 2.24) record the algorithm or protocol forced for that function.
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

from meshscale.collectives.kinds import kind
from meshscale.errors import MeshscaleError
from meshscale.predict.validate import CORPUS_COLUMNS, corpus_path, load_corpus

DTYPES = {"float": "float32", "half": "float16", "double": "float64", "bfloat16": "bfloat16", "int8": "int8",
          "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64", "uint64": "uint64"}


def nccl_version(code: int) -> str:
    """NCCL_VERSION_CODE as a version: 22809 -> 2.28.9 (since 2.9: major*10000 + minor*100 + patch), 2708 -> 2.7.8."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse(text: str, collective: str | None = None) -> list[dict]:
    """One dict per measurement in nccl-tests output: collective, gpus, size_bytes, inplace, time_us, busbw_GBps,
    dtype, nccl_version, tests_version. Several tests in one file are told apart by their start lines."""
    found: list[dict] = []
    state = {"collective": collective, "version": "", "tests": "", "threads_gpus": None, "per_thread": None,
             "ranks": set()}
    for line in text.splitlines():
        if line.startswith("# nccl-tests version"):
            state["tests"] = line.split()[3]
            library = re.search(r"nccl-library=(\d+)", line)
            state["version"] = nccl_version(int(library.group(1))) if library else ""
            state["ranks"] = set()
        elif line.startswith("# Collective test starting:"):
            state["collective"] = kind(line.split(":", 1)[1].strip().removesuffix("_perf")).name
            state["ranks"] = set()
        elif (shape := re.match(r"#\s*nThread (\d+) nGpus (\d+)", line)) is not None:
            state["threads_gpus"] = int(shape.group(1)) * int(shape.group(2))
            state["per_thread"] = int(shape.group(2))
        elif (rank := re.match(r"#\s+Rank\s+(\d+)", line)) is not None:
            state["ranks"].add(int(rank.group(1)))
        elif not line.startswith("#") and line.split()[:1] and line.split()[0].isdigit():
            found.extend(_measurements(line.split(), state))
    return found


def _measurements(tokens: list[str], state: dict) -> list[dict]:
    """The out-of-place and in-place figures of one table line: size count type redop [root] then
    (time algbw busbw #wrong) per placement."""
    if state["collective"] is None:
        raise MeshscaleError("no '# Collective test starting' line before the table; give --collective")
    groups = tokens[4:]
    if len(groups) % 4 == 1:  # nccl-tests >= 2.10 prints the root
        groups = groups[1:]
    rows = []
    for inplace, start in enumerate(range(0, len(groups) - 3, 4)):
        time_us, busbw = _number(groups[start]), _number(groups[start + 2])
        if time_us is None or time_us <= 0 or int(tokens[0]) <= 0:
            continue
        rows.append({"collective": state["collective"], "gpus": len(state["ranks"]) or state["threads_gpus"],
                     "size_bytes": int(tokens[0]), "inplace": inplace, "time_us": groups[start],
                     "busbw_GBps": groups[start + 2] if busbw and busbw > 0 else "",
                     "dtype": DTYPES.get(tokens[2], tokens[2]), "nccl_version": state["version"],
                     "gpus_per_thread": state["per_thread"] or "",
                     "tests_version": state["tests"]})
    return rows


def parse_meshscale(result_path: Path) -> list[dict]:
    """Measurements of a `meshscale bench collective --json` result, in `parse`'s keys (one GPU per process)."""
    from meshscale.results import load_result

    result = load_result(result_path)
    if result.kind != "bench-collective":
        raise MeshscaleError(f"{result_path}: a {result.kind} result; give a bench-collective one")
    gpus = int(result.meta.get("world_size") or 0)
    return [{"collective": r["collective"], "size_bytes": int(r["size_bytes"]), "inplace": int(bool(r["inplace"])),
             "time_us": round(r["time_s"] * 1e6, 3), "busbw_GBps": round(r["busbw_bytes_per_s"] / 1e9, 3),
             "dtype": r["dtype"], "nccl_version": "", "gpus": gpus, "gpus_per_thread": 1,
             "tests_version": None, "tool": "meshscale bench collective --impl nccl"} for r in result.rows]


def _forced(value: str) -> str:
    """The algorithm or protocol an NCCL_ALGO / NCCL_PROTO value forces: 'Tree' or 'allreduce:Tree' (one function);
    blank for a list, which forces nothing single."""
    value = value.split(":", 1)[1] if value.count(":") == 1 and ";" not in value else value
    return "" if "," in value or ":" in value else value


def corpus_rows(measured: list[dict], system: str, source: str, env: dict[str, str], nodes: int = 1,
                gpus: int | None = None, version: str | None = None, note: str = "") -> list[dict]:
    """Corpus rows (CORPUS_COLUMNS) of parsed measurements on ``system``, run with environment ``env``."""
    algo, proto = _forced(env.get("NCCL_ALGO", "")), _forced(env.get("NCCL_PROTO", ""))
    nvls = {"0": "off", "1": "on"}.get(env.get("NCCL_NVLS_ENABLE", ""), "")
    knobs = " ".join(f"{k}={v}" for k, v in sorted(env.items()))
    rows = []
    for m in measured:
        if not m["gpus"] and not gpus:
            raise MeshscaleError("the file gives no GPU count (no nThread/nGpus or Rank lines); give --gpus")
        tool = m.get("tool") or (f"nccl-tests {m['tests_version']}" if m["tests_version"] else "nccl-tests")
        described = [tool,
                     "in-place" if m["inplace"] else "out-of-place", knobs, note]
        rows.append({"system": system, "gpus": gpus or m["gpus"], "nodes": nodes, "collective": m["collective"],
                     "size_bytes": m["size_bytes"], "inplace": m["inplace"], "time_us": m["time_us"],
                     "busbw_GBps": m["busbw_GBps"], "dtype": m["dtype"],
                     "nccl_version": version or m["nccl_version"],
                     "algo": algo, "proto": proto, "nvls": nvls,
                     "gpus_per_thread": m["gpus_per_thread"], "source": source, "note": "; ".join(d for d in described if d)})
    return rows


def append(corpus: Path, rows: list[dict]) -> int:
    """Append ``rows`` not already in ``corpus`` (header written for a new file); the number added."""
    identity = ("system", "gpus", "nodes", "collective", "size_bytes", "inplace", "source")
    present = set()
    if corpus.exists():
        with corpus.open(newline="") as f:
            present = {tuple(str(r[k]) for k in identity) for r in csv.DictReader(f)}
    new = [r for r in rows if tuple(str(r[k]) for k in identity) not in present]
    fresh = not corpus.exists() or corpus.stat().st_size == 0
    with corpus.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CORPUS_COLUMNS, lineterminator="\n")
        if fresh:
            writer.writeheader()
        writer.writerows(new)
    return len(new)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="nccl-tests output, or a meshscale bench collective JSON result")
    parser.add_argument("--system", required=True, help="catalog system (or a system file relative to the corpus)")
    parser.add_argument("--source", required=True, help="where the figures come from: a URL, a paper table, a repo path")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment of the run (repeat): NCCL_ALGO, NCCL_PROTO, NCCL_NVLS_ENABLE, ...")
    parser.add_argument("--gpus", type=int, help="GPU count, when the file does not show it")
    parser.add_argument("--nodes", type=int, default=1, help="nodes of the run (multi-node rows belong in a separate file)")
    parser.add_argument("--nccl-version", help="NCCL version, when the header does not give it")
    parser.add_argument("--collective", help="collective, when the file has no 'Collective test starting' line")
    parser.add_argument("--note", default="", help="anything else worth knowing about the run")
    parser.add_argument("--corpus", type=Path, default=None, help="corpus CSV (default: the one meshscale ships)")
    parser.add_argument("--dry-run", action="store_true", help="print the rows instead of appending them")
    args = parser.parse_args(argv)
    try:
        env = dict(item.split("=", 1) for item in args.env)
    except ValueError:
        parser.error("--env takes NAME=VALUE")
    try:
        measured = parse_meshscale(args.file) if args.file.suffix == ".json" else \
            parse(args.file.read_text(), kind(args.collective).name if args.collective else None)
        rows = corpus_rows(measured, args.system, args.source, env, args.nodes, args.gpus, args.nccl_version, args.note)
        if args.dry_run:
            writer = csv.DictWriter(sys.stdout, fieldnames=CORPUS_COLUMNS, lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
            return 0
        corpus = args.corpus or corpus_path()
        added = append(corpus, rows)
        load_corpus(corpus, multi_node=True)  # the corpus must stay valid: a bad row says which
    except MeshscaleError as exc:
        print(f"corpus_from_nccl_tests: error: {exc}", file=sys.stderr)
        return 2
    print(f"{corpus}: added {added} of {len(rows)} rows from {args.file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
