"""`meshscale doctor --level 1..3`, after DCGM's `dcgmi diag -r` levels (DCGM user guide): 1 = configuration and
error counters (`run_doctor`), 2 = plus a short memory and bandwidth check of every GPU, 3 = plus every GPU pair
and a collective sweep. Where `dcgmi` is installed its `diag -r LEVEL` runs and its verdicts are folded in as
lines of their own; where it is not, meshscale does levels 2 and 3 itself:

- level 2, per GPU: a device-to-device copy (bytes read plus written) against the datasheet memory bandwidth of
  the GPU model table, and pinned host->device / device->host copies against the PCIe rate the link can do
  (NVML's maximum generation and width);
- level 3: `bench p2p` between every GPU pair against each route's line rate, and a 256 MiB all_reduce against
  NCCL's cost model on this machine.

Every level watches the corrected-error counters for its own `COUNTER_INTERVAL_S` (1 s, 5 s, DCGM's minute) and
judges their rates (`health.py`).

Each figure is judged by the report's share rule (`share_verdict`: at least 70 % of the bound is healthy, under
50 % a fault); the bounds are datasheet and link-table figures, never a measurement of this machine."""
from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Callable

from meshscale.errors import MeshscaleError
from meshscale.app.doctor import run_doctor
from meshscale.app.doctor_env import COUNTER_INTERVAL_S, Check, DoctorEnv, nvml_gpus
from meshscale.report.verdicts import share_verdict

LEVELS = (1, 2, 3)
DCGMI_TIMEOUT_S = {1: 120, 2: 900, 3: 3600}  # DCGM's guide: level 1 seconds, 2 about two minutes, 3 tens of minutes
COPY_BYTES = 256 << 20
COPY_ITERS = 10
SWEEP_BYTES = 256 << 20
_VERDICT_STATUS = {"good": "pass", "warn": "warn", "bad": "fail", "info": "info"}
_DCGM_STATUS = {"pass": "pass", "fail": "fail", "warn": "warn", "skip": "info", "not run": "info"}
COPY_FIX = {"device copy": "a GPU far below its memory bandwidth is throttled or faulty: check `doctor`'s throttle "
                           "and ECC lines, the clocks (`nvidia-smi -q -d CLOCK`), then `dcgmi diag -r 3`",
            "host->device": "check the PCIe line above (width, generation, replays), the NUMA node of the host buffer "
                            "(bind to the GPU's CPUs) and IOMMU settings",
            "device->host": "check the PCIe line above (width, generation, replays), the NUMA node of the host buffer "
                            "(bind to the GPU's CPUs) and IOMMU settings"}


@dataclass
class CopyFigure:
    """One measured copy of one GPU and the bound it is judged against."""

    gpu: int
    what: str                 # device copy, host->device, device->host
    bytes_per_s: float
    bound_bytes_per_s: float
    bound: str                # what the bound is


def run_levels(level: int, env: DoctorEnv | None = None, which: Callable[[str], str | None] = shutil.which,
               run: Callable[[list[str], float], tuple[int, str]] | None = None,
               measure: Callable[[DoctorEnv], list[CopyFigure]] | None = None,
               pairs: Callable[[], list[Check]] | None = None) -> list[Check]:
    """Doctor's lines at ``level``. ``which``, ``run``, ``measure`` and ``pairs`` are the machine's (tests fake them)."""
    if level not in LEVELS:
        raise MeshscaleError(f"--level {level}: use 1 (configuration and counters), 2 (+ memory and bandwidth per "
                             "GPU) or 3 (+ every GPU pair and a collective sweep)")
    env = env or DoctorEnv.real()
    env.counter_interval_s = COUNTER_INTERVAL_S[level]
    checks = run_doctor(env)
    dcgmi = which("dcgmi")
    if dcgmi:
        return checks + dcgmi_checks(dcgmi, level, run or _run)
    if level >= 2:
        checks += copy_checks(env, measure or measure_copies)
    if level >= 3:
        checks += (pairs or pair_checks)()
    return checks


# ---- dcgmi ---------------------------------------------------------------------------------------------------
def _run(command: list[str], timeout_s: float) -> tuple[int, str]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout_s:.0f} s"
    except OSError as exc:
        return 127, str(exc)
    return done.returncode, done.stdout or done.stderr


def dcgmi_checks(dcgmi: str, level: int, run: Callable[[list[str], float], tuple[int, str]]) -> list[Check]:
    """`dcgmi diag -r LEVEL -j`, one line per test and GPU; a dcgmi that fails or prints no JSON is one warn line."""
    code, text = run([dcgmi, "diag", "-r", str(level), "-j"], DCGMI_TIMEOUT_S[level])
    try:
        tests = parse_dcgmi(json.loads(text))
    except (ValueError, TypeError):
        first = (text.strip().splitlines() or ["no output"])[0][:200]
        return [Check("warn", "dcgmi", f"`dcgmi diag -r {level}` gave no JSON (exit {code}): {first}",
                      "check that the DCGM host engine runs (`nv-hostengine`, `systemctl status nvidia-dcgm`)")]
    if not tests:
        return [Check("warn", "dcgmi", f"`dcgmi diag -r {level}` reported no test")]
    return tests


def parse_dcgmi(data: Any) -> list[Check]:
    """The tests of `dcgmi diag -j` output: every object with a "name" and a list of "results" (the layout of
    DCGM 3's "DCGM GPU Diagnostic" -> test_categories -> tests, and of DCGM 4's flatter one), each result's
    status, GPU and warnings."""
    out: list[Check] = []

    def walk(node: Any, category: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("results"), list) and "name" in node:
                for r in node["results"]:
                    if isinstance(r, dict):
                        out.append(_dcgm_result(category, str(node["name"]), r))
                return
            category = str(node.get("category", category))
            for value in node.values():
                walk(value, category)
        elif isinstance(node, list):
            for value in node:
                walk(value, category)

    walk(data, "")
    return out


def _dcgm_result(category: str, name: str, result: dict) -> Check:
    status = _DCGM_STATUS.get(str(result.get("status", "")).lower(), "info")
    gpu = result.get("gpu_ids", result.get("gpu_id", result.get("entity_id", "")))
    warnings = result.get("warnings") or result.get("errors") or []
    said = "; ".join(str(w.get("warning", w.get("error", w))) if isinstance(w, dict) else str(w) for w in warnings)
    where = f" GPU{gpu}" if gpu not in ("", None) else ""
    message = f"{category + ': ' if category else ''}{result.get('status', '?')}" + (f": {said}" if said else "")
    if result.get("info"):
        message += f" ({result['info']})" if isinstance(result["info"], str) else f" ({'; '.join(map(str, result['info']))})"
    return Check(status, f"dcgmi {name}{where}", message,
                 "see the DCGM user guide's diagnostic section for this test" if status in ("warn", "fail") else "")


# ---- level 2: copies per GPU ---------------------------------------------------------------------------------
def copy_checks(env: DoctorEnv, measure: Callable[[DoctorEnv], list[CopyFigure]]) -> list[Check]:
    if env.nvml is None:
        return [Check("info", "copies", "no GPU: the level 2 memory and PCIe copy checks need one")]
    try:
        figures = measure(env)
    except MeshscaleError as exc:
        return [Check("warn", "copies", f"could not measure: {exc}")]
    out = []
    for f in figures:
        verdict = share_verdict(f.bytes_per_s, f.bound_bytes_per_s, f.bound, [])
        status = _VERDICT_STATUS[verdict.level]
        text = f"{f.bytes_per_s / 1e9:.1f} GB/s: {verdict.text.split(' — ')[0]} ({f.bound_bytes_per_s / 1e9:.1f} GB/s)"
        out.append(Check(status, f"{f.what} GPU{f.gpu}", text, COPY_FIX[f.what] if status != "pass" else ""))
    return out


def measure_copies(env: DoctorEnv) -> list[CopyFigure]:
    """Every GPU's device copy and pinned host copies, each beside its bound (CUDA events, `COPY_ITERS` copies)."""
    import torch

    from meshscale.bench.host_copy import host_copy, seconds_per_copy
    from meshscale.topology.links import pcie_bandwidth
    from meshscale.topology.nvml_discovery import model_facts

    if not torch.cuda.is_available():
        raise MeshscaleError("torch sees no CUDA GPU (a CPU build, or CUDA_VISIBLE_DEVICES hides them)")
    out = []
    for i, handle, name in nvml_gpus(env):
        if i >= torch.cuda.device_count():
            break
        facts, known = model_facts(name)
        with torch.cuda.device(i):
            src = torch.ones(COPY_BYTES, dtype=torch.uint8, device=i)
            dst = torch.empty_like(src)
            seconds = seconds_per_copy(dst, src, COPY_ITERS, 2)
            del src, dst
        memory = facts["memory_bandwidth_bytes_per_s"]
        out.append(CopyFigure(i, "device copy", 2 * COPY_BYTES / seconds, memory,
                              f"{facts['name']} datasheet memory bandwidth (read + write)" if known
                              else "memory bandwidth of an unknown model (the table's default)"))
        gen = env.nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)
        width = env.nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)
        rows = host_copy(COPY_BYTES, COPY_ITERS, 2, i).rows
        for row in rows:
            if row["memory"] == "pinned":
                out.append(CopyFigure(i, row["direction"], row["bandwidth_bytes_per_s"], pcie_bandwidth(gen, width),
                                      f"PCIe gen {gen} x{width} rate per direction"))
    return out


# ---- level 3: pairs and a collective ---------------------------------------------------------------------------
def pair_checks() -> list[Check]:
    """Every GPU pair (`bench p2p`) against its route's line rate, and an all_reduce against NCCL's cost model."""
    from meshscale.bench.collective import CollectiveSpec, bench_collectives
    from meshscale.bench.p2p import P2PSpec, bench_p2p
    from meshscale.execute.world_topology import world_topology
    from meshscale.execute.world import World, gpu_count
    from meshscale.report.expected import model_expected
    from meshscale.report.verdicts import p2p_verdict
    from meshscale.topology.queries import pair_bandwidth

    n = gpu_count()
    if n < 2:
        return [Check("info", "pairs", f"{n} GPU(s) visible: level 3's pair and collective checks need two or more")]
    world = World(n, "nccl")
    topology = world_topology(world)
    p2p = bench_p2p(P2PSpec(size_bytes=COPY_BYTES), world)
    rows = [r for r in p2p.rows if r["mode"] == "unidirectional" and r["src"] != "host" and r["dst"] != "host"]
    index = {f"gpu{i}": i for i in range(n)}
    rate_of = {(r["src"], r["dst"]): pair_bandwidth(topology, index[r["src"]], index[r["dst"]]) for r in rows} if topology else {}
    verdict = p2p_verdict(rows, rate_of, [])
    out = [Check(_VERDICT_STATUS[verdict.level], "pairs", f"{len(rows)} GPU pairs, one-way copies: {verdict.text}",
                 "`meshscale bench pairs` names the slow GPU or link" if verdict.level in ("warn", "bad") else "")]
    sweep = bench_collectives(CollectiveSpec(["all_reduce"], [SWEEP_BYTES], places=("out",)), world)
    busbw = max(r["busbw_bytes_per_s"] for r in sweep.rows)
    expected = model_expected(topology, n, "all_reduce", SWEEP_BYTES) if topology else None
    if expected is None:
        out.append(Check("info", "all_reduce", f"{busbw / 1e9:.1f} GB/s busbw at 256 MiB (no model for this machine)"))
    else:
        share = busbw / expected.busbw_bytes_per_s
        status = "pass" if share >= expected.floor else "warn" if share >= expected.floor / 2 else "fail"
        out.append(Check(status, "all_reduce", f"{busbw / 1e9:.1f} GB/s busbw at 256 MiB = {share:.0%} of "
                         f"{expected.busbw_bytes_per_s / 1e9:.1f} GB/s ({expected.source}; healthy from "
                         f"{expected.floor:.0%})", "" if status == "pass" else
                         "run `meshscale bench collective all_reduce` and `meshscale bench pairs`"))
    return out

