"""``bench collective -J FILE``: the sweep in nccl-tests' own JSON (its src/util.cu, JSON_FILE_VERSION 3 in
2.19.6), so that tools written for nccl-tests' files read meshscale's too, its tools/analyze_perf_json.py (the
per-iteration figures of ``-I 1``, ``--straggler``, ``--spikes``) among them.

Where meshscale differs, the file says it the nccl-tests way: one rank per process (``nthreads`` 1, ``ngpus`` 1,
each rank's per-iteration times as its process's row); one entry per size of each collective, type and op, its
``experiment_name`` the collective (nccl-tests runs one collective per binary); with ``-N`` the median cycle's
figures. Of the environment, only the NCCL_* and GLOO_* variables are written (nccl-tests writes all of it, which
may hold secrets).
"""
from __future__ import annotations

import json
import os
import sys
import time
from itertools import groupby
from pathlib import Path
from typing import Any

from meshscale.bench.cases import DTYPE_LABELS
from meshscale.results import Result
from meshscale.safe_io import atomic_write
from meshscale.units import gbps

NCCL_TESTS_JSON_VERSION = 3
_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # nccl-tests' TIME_STRING_FORMAT


def nccl_tests_document(result: Result, argv: list[str], started_s: float) -> dict[str, Any]:
    """The nccl-tests JSON document of a bench-collective ``result``, its command line ``argv``, started at
    ``started_s`` (seconds since the epoch)."""
    spec = result.meta.get("spec") or {}
    sizes = spec.get("sizes_bytes") or [0]
    step = ({"step_factor": sizes[1] // sizes[0]} if len(sizes) > 1 and sizes[1] == sizes[0] * (sizes[1] // sizes[0])
            and (len(sizes) < 3 or sizes[2] - sizes[1] != sizes[1] - sizes[0]) else
            {"step_bytes": sizes[1] - sizes[0] if len(sizes) > 1 else 0})
    config = {"nthreads": 1, "ngpus": 1, "minimum_bytes": sizes[0], "maximum_bytes": sizes[-1], **step,
              "warmup_iters": spec.get("warmup_iters"), "iterations": spec.get("iters"),
              "aggregated_iterations": 1, "validation": int(bool(spec.get("check"))),
              "graph": int(bool(spec.get("cuda_graph"))), "blocking_collectives": bool(spec.get("blocking")),
              "per_iter_timing": bool(spec.get("per_iter")), "per_iter_skip": spec.get("per_iter_skip", 0),
              "parallel_init": True, "devices": _devices(result)}
    entries = [_entry(list(rows), spec) for _, rows in
               groupby(result.rows, key=lambda r: (r["collective"], r["dtype"], r["redop"], r["size_bytes"]))]
    wrong = sum(r.get("wrong") or 0 for r in result.rows)
    busbw = [gbps(r["busbw_bytes_per_s"]) for r in result.rows]
    return {"version": NCCL_TESTS_JSON_VERSION, "start_time": time.strftime(_TIME_FORMAT, time.localtime(started_s)),
            "args": list(argv), "env": [f"{k}={v}" for k, v in sorted(os.environ.items())
                                        if k.startswith(("NCCL_", "GLOO_"))],
            "nccl_version": _nccl_version(result), "config": config, "results": entries,
            "out_of_bounds": {"count": wrong, "okay": wrong == 0},
            "average_bus_bandwidth": {"bandwidth": sum(busbw) / len(busbw) if busbw else 0.0, "okay": "unchecked"},
            "end_time": time.strftime(_TIME_FORMAT)}


def _entry(rows: list[dict], spec: dict) -> dict[str, Any]:
    """One size's line: out-of-place and in-place figures (null where torch has no such form), each with its
    per-iteration summary under ``-I 1``."""
    first = rows[0]
    entry: dict[str, Any] = {"size": first["size_bytes"], "count": first["count"],
                             "type": DTYPE_LABELS.get(first["dtype"], first["dtype"]), "redop": first["redop"],
                             "root": f"{first['root']:6d}"}
    by_place = {r["inplace"]: r for r in rows}
    for inplace, key in ((False, "out_of_place"), (True, "in_place")):
        r = by_place.get(inplace)
        entry[key] = None if r is None else {
            "cpu_time" if spec.get("cpu_time") else "time": r["time_s"] * 1e6, "alg_bw": gbps(r["algbw_bytes_per_s"]),
            "bus_bw": gbps(r["busbw_bytes_per_s"]), "nwrong": r.get("wrong")}
        if r is not None and "iter_times_s" in r:
            entry[f"{key}_per_iter"] = _per_iter(r)
    entry.update(actual_iterations=spec.get("iters"), experiment_name=first["collective"])
    return entry


def _per_iter(r: dict) -> dict[str, Any]:
    """nccl-tests' ``*_per_iter`` object: the summary, the slowest rank's time of each call, each rank's times."""
    out = {"skipped_iterations": r.get("iter_skip", 0)}
    for key in ("min", "max", "avg", "p50", "p95", "p99", "stdev"):
        out[f"{key}_us"] = r[f"iter_{'mean' if key == 'avg' else key}_s"] * 1e6
    out["cv_pct"] = r["iter_cv_pct"]
    out["times_us"] = [t * 1e6 for t in r["iter_times_s"]]
    if len(r.get("rank_iter_times_s") or []) > 1:
        out["per_process_max_times_us"] = [[t * 1e6 for t in times] for times in r["rank_iter_times_s"]]
    return out


def _devices(result: Result) -> list[dict[str, Any]]:
    """One entry per rank, as nccl-tests' "#  Rank N Group 0 Pid P on HOST device D [bus] NAME" lines say it."""
    nodes = (result.meta.get("topology") or {}).get("nodes") or []  # `topology.to_dict`: a node's attributes inline
    devices = sorted((n for n in nodes if n.get("kind") in ("gpu", "worker")), key=lambda n: n.get("index", 0))
    host = result.machine.get("hostname", "")
    out = []
    for rank in range(int(result.meta.get("world_size") or 0)):
        node = devices[rank] if rank < len(devices) else {}
        out.append({"rank": rank, "group": 0, "pid": None, "hostname": node.get("hostname", host),
                    "device": node.get("index", rank), "device_hex": node.get("bus_id", ""),
                    "device_info": node.get("model", "")})
    return out


def _nccl_version(result: Result) -> int | None:
    """NCCL's version as nccl-tests writes it (major * 10000 + minor * 100 + patch): the library torch loaded, on
    a GPU run; None on CPU workers."""
    if result.meta.get("backend") != "nccl":
        return None
    try:
        import torch
        major, minor, patch = torch.cuda.nccl.version()[:3]
    except Exception:  # a build without NCCL, or a version torch cannot read: the field says unknown
        return None
    return major * 10000 + minor * 100 + patch


def write_nccl_tests_json(result: Result, path: Path, started_s: float, argv: list[str] | None = None) -> Path:
    """Write ``result`` as nccl-tests' JSON to ``path`` (atomically); returns the path."""
    document = nccl_tests_document(result, argv if argv is not None else sys.argv, started_s)
    return atomic_write(Path(path), json.dumps(document, indent=1, allow_nan=False) + "\n")
