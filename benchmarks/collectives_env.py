"""NCCL's environment, measured against the model: `meshscale bench collective --impl nccl` on this machine's GPUs
under each setting (NCCL_MAX_NCHANNELS 1, 2, 8; NCCL_P2P_DISABLE=1; defaults) for all_reduce, all_gather and
broadcast from 1 MiB to 1 GiB, beside `meshscale sim --nccl-env` with the same setting. Prints measured and
predicted busbw per setting, collective and size with the error (predicted / measured - 1) and a summary per
setting, and writes every result under --out.

  PYTHONPATH=src python3 benchmarks/collectives_env.py --out $OUT/collectives-env          # GPU machine, 2+ GPUs
  PYTHONPATH=src python3 benchmarks/collectives_env.py --out /tmp/ce --dry-run --gpus 4    # anywhere: sims only
  PYTHONPATH=src python3 benchmarks/collectives_env.py --out $OUT/ce-sockets --sockets     # NCCL over TCP sockets

Every process runs with NVLink SHARP off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1), and the model is told so (--nccl-env NCCL_NVLS_ENABLE=0). The prediction is for the
catalog board of this machine's GPUs (an H200 -> hgx-h200, an H100 -> hgx-h100, first N GPUs: on those boards GPUs
0-1 share a PCIe switch, 0-3 a CPU), since a VM's discovered PCIe tree is not the board's; --system this uses the
discovered topology instead. The bench times out-of-place calls (nccl-tests' first columns), which the model
prices, 3 warm-up and 10 timed calls per size, no result check; the whole run takes under 4 minutes on 4 GPUs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

SETTINGS: dict[str, list[str]] = {
    "default": [],
    "MAX_NCHANNELS=1": ["NCCL_MAX_NCHANNELS=1"],
    "MAX_NCHANNELS=2": ["NCCL_MAX_NCHANNELS=2"],
    "MAX_NCHANNELS=8": ["NCCL_MAX_NCHANNELS=8"],
    "P2P_DISABLE=1": ["NCCL_P2P_DISABLE=1"],
}
# --sockets: NCCL's socket transport between the GPUs of this host (each GPU a node of NCCL's, over loopback):
# NCCL's default (no helper thread), 4 helper threads, 4 threads x 4 sockets
_NET_SOCKET = ["NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1", "NCCL_NET=Socket"]
SOCKET_SETTINGS: dict[str, list[str]] = {
    "SOCKET": _NET_SOCKET,
    "SOCKET_4x1": [*_NET_SOCKET, "NCCL_SOCKET_NTHREADS=4"],
    "SOCKET_4x4": [*_NET_SOCKET, "NCCL_SOCKET_NTHREADS=4", "NCCL_NSOCKS_PERTHREAD=4"],
}
COLLECTIVES = ("all_reduce", "all_gather", "broadcast")
SIZES = ["-b", "1M", "-e", "1G", "-f", "4"]
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CATALOG = (("H200", "hgx-h200"), ("H100", "hgx-h100"))  # GPU name -> the catalog board it sits on
BOUND = 0.10  # the bound: predicted busbw within 10 % of measured
BUDGET_S = 230.0  # stop starting new bench runs past this (the whole run must stay under 4 minutes)


@dataclass(frozen=True)
class Row:
    setting: str
    collective: str
    size_bytes: int
    measured_gbps: float | None
    predicted_gbps: float | None
    chosen: str = ""

    @property
    def error(self) -> float | None:
        if not self.measured_gbps or not self.predicted_gbps:
            return None
        return self.predicted_gbps / self.measured_gbps - 1


def catalog_for(gpu_name: str) -> str | None:
    """The catalog system of a GPU model name (nvidia-smi's), None for one the catalog has no board for."""
    return next((system for key, system in CATALOG if key in gpu_name.upper()), None)


def slug(settings_name: str) -> str:
    """A file-name part for a setting (letters, digits, '-' and '_' only)."""
    return "".join(ch for ch in settings_name.lower().replace("=", "") if ch.isalnum() or ch in "-_")


def bench_command(settings_name: str, gpus: int, json_path: Path) -> list[str]:
    return [sys.executable, "-m", "meshscale", "bench", "collective", *COLLECTIVES, "--impl", "nccl", "-g", str(gpus),
            *SIZES, "--place", "out", "--no-check", "-w", "3", "-n", "10", "--json", str(json_path)]


def sim_command(settings_name: str, collective: str, system: str | None, gpus: int, json_path: Path) -> list[str]:
    where = ["--system", system, "--gpus", str(gpus)] if system else ["--gpus", str(gpus)]
    env = [x for s in [*SETTINGS[settings_name], "NCCL_NVLS_ENABLE=0"] for x in ("--nccl-env", s)]
    return [sys.executable, "-m", "meshscale", "sim", collective, *where, *SIZES, *env, "--json", str(json_path)]


def process_env(settings_name: str) -> dict[str, str]:
    """The environment of a bench run: this one, NVLink SHARP off in every layer, and the setting."""
    return dict(os.environ, **NVLS_OFF, **dict(s.split("=", 1) for s in SETTINGS[settings_name]))


def measured_rows(result: dict) -> dict[tuple[str, int], float]:
    """(collective, size) -> busbw GB/s of a `bench collective --json` result's out-of-place rows."""
    return {(r["collective"], int(r["size_bytes"])): r["busbw_bytes_per_s"] / 1e9 for r in result.get("rows", [])
            if not r.get("inplace") and r.get("busbw_bytes_per_s")}


def predicted_rows(result: dict) -> dict[tuple[str, int], tuple[float, str]]:
    """(collective, size) -> (busbw GB/s, what NCCL runs) of a `sim --json` result."""
    return {(r["collective"], int(r["size_bytes"])): (r["busbw_bytes_per_s"] / 1e9, r.get("algorithm", ""))
            for r in result.get("rows", [])}


def join(settings_name: str, measured: dict, predicted: dict) -> list[Row]:
    keys = sorted(set(measured) | set(predicted), key=lambda k: (COLLECTIVES.index(k[0]) if k[0] in COLLECTIVES
                                                                else len(COLLECTIVES), k[1]))
    return [Row(settings_name, c, size, measured.get((c, size)), predicted.get((c, size), (None, ""))[0],
                predicted.get((c, size), (None, ""))[1]) for c, size in keys]


def summary(rows: list[Row]) -> dict[str, dict]:
    """Per setting: rows compared, geomean |error| (exp(mean |ln(predicted / measured)|) - 1), the worst error,
    and whether every row is within `BOUND`."""
    out: dict[str, dict] = {}
    for name in dict.fromkeys(r.setting for r in rows):
        errors = [r.error for r in rows if r.setting == name and r.error is not None]
        if not errors:
            out[name] = {"rows": 0}
            continue
        logs = [abs(math.log1p(e)) for e in errors]
        out[name] = {"rows": len(errors), "geomean_abs_error": math.exp(sum(logs) / len(logs)) - 1,
                     "worst_error": max(errors, key=abs), "within_bound": all(abs(e) <= BOUND for e in errors)}
    return out


def _size(n: int) -> str:
    return f"{n >> 30}G" if n >= 1 << 30 else f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"


def table(rows: list[Row]) -> str:
    lines = [f"{'setting':16} {'collective':11} {'size':>5} {'measured':>9} {'predicted':>9} {'error':>7}  model's pick",
             "-" * 86]
    for r in rows:
        m = f"{r.measured_gbps:9.1f}" if r.measured_gbps else f"{'-':>9}"
        p = f"{r.predicted_gbps:9.1f}" if r.predicted_gbps else f"{'-':>9}"
        e = f"{r.error:+7.1%}" if r.error is not None else f"{'-':>7}"
        lines.append(f"{r.setting:16} {r.collective:11} {_size(r.size_bytes):>5} {m} {p} {e}  {r.chosen}")
    lines.append("")
    lines.append(f"busbw GB/s, PREDICTED by `meshscale sim --nccl-env` beside `meshscale bench collective --impl nccl`; "
                 f"error = predicted / measured - 1; bound {BOUND:.0%}")
    for name, s in summary(rows).items():
        if s["rows"]:
            lines.append(f"{name:16} {s['rows']:3} rows  geomean |error| {s['geomean_abs_error']:6.1%}  worst "
                         f"{s['worst_error']:+7.1%}  {'within' if s['within_bound'] else 'OUTSIDE'} {BOUND:.0%}")
        else:
            lines.append(f"{name:16}   0 rows (no measurement)")
    return "\n".join(lines)


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _gpus_here() -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                          text=True, timeout=60)
    return [x.strip() for x in done.stdout.splitlines() if x.strip()] if done.returncode == 0 else []


def _run(cmd: list[str], env: dict[str, str], timeout_s: float, log: Path) -> int:
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log.write_text(f"{' '.join(cmd)}\ntimed out after {timeout_s:.0f} s\n")
        return 124
    log.write_text(f"{' '.join(cmd)}\nexit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
    return done.returncode


def run_sims(out: Path, system: str | None, gpus: int) -> None:
    """Every setting's `meshscale sim` per collective, four at a time (CPU only, beside the GPU runs)."""
    jobs = [(name, c) for name in SETTINGS for c in COLLECTIVES]

    def one(job):
        name, c = job
        path = out / f"sim-{slug(name)}-{c}.json"
        _run(sim_command(name, c, system, gpus, path), dict(os.environ, **NVLS_OFF), 300, path.with_suffix(".log"))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, jobs))


def run_benches(out: Path, gpus: int, started: float) -> dict[str, str]:
    """Each setting's bench, one after another on the GPUs; returns the settings not measured and why."""
    missing = {}
    for name in SETTINGS:
        if time.monotonic() - started > BUDGET_S:
            missing[name] = "skipped: over the time budget"
            continue
        path = out / f"bench-{slug(name)}.json"
        code = _run(bench_command(name, gpus, path), process_env(name), 150, path.with_suffix(".log"))
        if code:
            missing[name] = f"bench exit {code} (see {path.with_suffix('.log').name})"
        print(f"[{time.monotonic() - started:5.0f} s] bench {name}: {'ok' if not code else missing[name]}", flush=True)
    return missing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for every result (created)")
    ap.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all; --dry-run: 2)")
    ap.add_argument("--system", default=None, help="catalog system or file for the prediction; 'this': this machine "
                    "(default: the catalog board of this machine's GPUs)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU work: the predictions only")
    ap.add_argument("--sockets", action="store_true", help="the socket transport's settings instead (P2P and SHM "
                    "disabled, NCCL_NET=Socket; default, 4 threads, 4 x 4 sockets)")
    args = ap.parse_args(argv)
    global SETTINGS
    if args.sockets:
        SETTINGS = SOCKET_SETTINGS
    started = time.monotonic()
    names = [] if args.dry_run else _gpus_here()
    if not args.dry_run and len(names) < 2:
        print("collectives_env: error: needs 2 or more GPUs (nvidia-smi found "
              f"{len(names)}); use --dry-run for the predictions alone", file=sys.stderr)
        return 2
    gpus = args.gpus or (len(names) if names else 2)
    if gpus < 2 or (names and gpus > len(names)):
        print(f"collectives_env: error: --gpus {gpus}: use 2 to {len(names) or 'the GPU count'}", file=sys.stderr)
        return 2
    system = None if args.system == "this" else args.system or catalog_for(names[0] if names else "H200")
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(1) as pool:
        sims = pool.submit(run_sims, args.out, system, gpus)
        missing = {} if args.dry_run else run_benches(args.out, gpus, started)
        sims.result()
    rows = _rows(args.out)
    print(table(rows))
    report = {"gpus": gpus, "gpu_names": names, "system": system or "this machine", "settings": SETTINGS,
              "collectives": COLLECTIVES, "nvls_off": NVLS_OFF, "bound": BOUND, "not_measured": missing,
              "wall_s": time.monotonic() - started, "rows": [dict(asdict(r), error=r.error) for r in rows],
              "summary": summary(rows)}
    (args.out / "collectives_env.json").write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.out / 'collectives_env.json'} ({time.monotonic() - started:.0f} s)")
    return 0


def _rows(out: Path) -> list[Row]:
    rows: list[Row] = []
    for name in SETTINGS:
        measured = measured_rows(_load(out / f"bench-{slug(name)}.json"))
        predicted: dict = {}
        for c in COLLECTIVES:
            predicted.update(predicted_rows(_load(out / f"sim-{slug(name)}-{c}.json")))
        rows += join(name, measured, predicted)
    return rows


if __name__ == "__main__":
    sys.exit(main())
