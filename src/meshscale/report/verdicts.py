"""One-line verdicts for the report's figures: how close a measurement came to its bound, and where to look
when it fell short (NCCL knobs that disable fast paths, NVLinks down, narrow PCIe links, CPU fallback)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshscale.topology.model import Topology

# Share of the line-rate bound a healthy system reaches: nccl-tests on NVLink machines report 80-90 % busbw
# of the link rate (nccl-tests on 4x H200 here: 355 of 394 GB/s), PCIe systems about 70-80 %.
GOOD_SHARE = 0.70
POOR_SHARE = 0.50
GOOD_EFFICIENCY = 0.85  # weak scaling of ResNet-50 over NVLink stays near 90 % (Goyal et al. 2017)
POOR_EFFICIENCY = 0.60

# NVLinks per GPU of the SXM parts (NVIDIA datasheets); PCIe cards only have optional bridges.
EXPECTED_NVLINKS = (("P100", 4), ("V100", 6), ("A100", 12), ("H100", 18), ("H200", 18))

# NCCL knobs that switch off a fast path, and what that costs.
SLOW_KNOBS = {
    "NCCL_P2P_DISABLE": "NCCL_P2P_DISABLE is set: GPU peer-to-peer (NVLink/PCIe) is off and data goes through host memory; unset it",
    "NCCL_SHM_DISABLE": "NCCL_SHM_DISABLE is set: intra-node traffic without P2P falls back to the network; unset it",
    "NCCL_IB_DISABLE": "NCCL_IB_DISABLE is set: NCCL uses TCP sockets instead of InfiniBand across nodes; unset it",
    "NCCL_ALGO": "NCCL_ALGO forces one algorithm; unset it to let NCCL choose",
    "NCCL_PROTO": "NCCL_PROTO forces one protocol; unset it to let NCCL choose",
}


@dataclass
class Verdict:
    """``level`` is good, warn, bad or info; ``text`` is the sentence shown under the figure."""

    level: str
    text: str


def expected_nvlinks(model: str) -> int | None:
    """NVLinks a GPU model should have (SXM parts), or None when unknown or a PCIe card."""
    upper = model.upper()
    if "PCIE" in upper:
        return None
    return next((n for key, n in EXPECTED_NVLINKS if key in upper), None)


def is_cpu_run(meta: dict[str, Any], machine: dict[str, Any], topology: Topology | None = None) -> bool:
    """True when a result came from CPU workers over Gloo rather than GPUs."""
    if topology is not None and topology.device_kind == "worker":
        return True
    if str(meta.get("backend", "")).lower() == "gloo" or str(meta.get("device", "")).lower() == "cpu":
        return True
    return bool(machine) and not machine.get("gpus") and "backend" not in meta


def hints(env: dict[str, str], topology: Topology | None = None, cpu: bool = False) -> list[str]:
    """Concrete places to look when a figure falls short, most specific first."""
    out = [text for var, text in SLOW_KNOBS.items() if env.get(var, "0") not in ("", "0")]
    if topology is not None:
        for gpu in topology.gpus():
            node = topology.nodes[gpu]
            want = expected_nvlinks(str(node.attrs.get("model", "")))
            have = topology.nvlink_count(gpu)
            if want and have < want:
                out.append(f"GPU{node.index} has {have} of its {want} NVLinks: a link is down "
                           "(check `nvidia-smi nvlink -s`, reseat or RMA)")
            # discovery records the current and the maximum PCIe width; the generation drops when idle, the
            # width does not, so only a narrower width is a finding
            width, widest = node.attrs.get("pcie_width"), node.attrs.get("pcie_max_width")
            if isinstance(width, int) and isinstance(widest, int) and width < widest:
                out.append(f"GPU{node.index}'s PCIe link runs x{width} of x{widest}: reseat the card or use a "
                           "full-width slot (`nvidia-smi -q | grep -A3 'Link Width'`)")
    if cpu:
        out.append("CPU fallback: these ranks are CPU processes over Gloo, which copies through host memory "
                   "and reduces on one thread per rank")
    return out


def share_verdict(measured: float, bound: float, what: str, look_at: list[str]) -> Verdict:
    """'92% of the link bound — expected' or '41% of the link bound — look at: ...'."""
    if not bound > 0:
        return Verdict("info", f"no bound to compare {what} with")
    share = measured / bound
    head = f"{share:.0%} of the {what}"
    if share >= GOOD_SHARE:
        return Verdict("good", f"{head} — expected")
    where = "; ".join(look_at) or "the route of this collective (run `meshscale doctor` and `meshscale bench p2p`)"
    return Verdict("warn" if share >= POOR_SHARE else "bad", f"{head} — look at: {where}")


def collective_verdict(rows: list[dict[str, Any]], look_at: list[str], cpu: bool = False) -> Verdict:
    """Verdict on one collective: measured busbw at its largest size against the link bound of that row."""
    rows = [r for r in rows if r.get("busbw_bytes_per_s") is not None]
    if not rows:
        return Verdict("info", "no measurement")
    biggest = max(rows, key=lambda r: r["size_bytes"])
    bound = biggest.get("bound_busbw_bytes_per_s") or 0.0
    if any(r.get("wrong") for r in rows):
        return Verdict("bad", "wrong results were reported: the collective returned incorrect data — "
                              "check the GPUs (`nvidia-smi -q -d ECC`) and rerun with NCCL_DEBUG=WARN")
    verdict = share_verdict(biggest["busbw_bytes_per_s"], bound, "link bound at the largest size", look_at)
    if cpu and verdict.level in ("warn", "bad"):
        # On CPU workers a low share of an assumed memory bandwidth is the normal state, not a fault.
        return Verdict("info", verdict.text.split(" — ")[0] + " — expected for CPU workers over Gloo "
                       "(the bound is an assumed shared-memory rate, not a measured link)")
    return verdict


# torch.distributed's eager per-call cost on 2 H200 (docs/results/h200x2-2026-11-22-b): above it, a small
# message's time is the host's launch path, not the interconnect
EAGER_CALL_S = 20e-6


def small_message_note(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str | None:
    """Why the smallest messages take what they take, when torch's eager path dominates (GPU, --impl native)."""
    impl = (meta.get("spec") or {}).get("impl", "native")
    small = [r for r in rows if r.get("time_s") and r["size_bytes"] <= 64 << 10]
    if impl != "native" or str(meta.get("backend", "")).lower() != "nccl" or not small:
        return None
    t = min(r["time_s"] for r in small)
    if t < EAGER_CALL_S:
        return None
    return (f"small messages take {t * 1e6:.0f} us or more: torch.distributed's per-call cost, not the link; "
            "`--impl nccl` times NCCL called directly, as nccl-tests does")


def p2p_verdict(rows: list[dict[str, Any]], rate_of: dict[tuple[int, int], float], look_at: list[str]) -> Verdict:
    """Verdict on a P2P matrix: the slowest pair against its line rate (when the topology is known),
    else the spread between the slowest and the fastest pair."""
    rows = [r for r in rows if r.get("bandwidth_bytes_per_s")]
    if not rows:
        return Verdict("info", "no measurement")
    if rate_of:
        def share(r):
            rate = rate_of.get((r["src"], r["dst"]))
            return r["bandwidth_bytes_per_s"] / rate if rate else float("inf")
        worst = min(rows, key=share)
        if share(worst) != float("inf"):
            v = share_verdict(worst["bandwidth_bytes_per_s"], rate_of[(worst["src"], worst["dst"])],
                              f"line rate on the slowest pair ({_name(worst['src'])}->{_name(worst['dst'])})", look_at)
            return v
    # no line rate known: the slowest pair against the fastest
    low, high = (min(r["bandwidth_bytes_per_s"] for r in rows), max(r["bandwidth_bytes_per_s"] for r in rows))
    return share_verdict(low, high, "fastest pair's bandwidth on the slowest pair", look_at)


def _name(device: Any) -> str:
    return f"GPU{device}" if isinstance(device, int) else str(device)


def scaling_verdict(rows: list[dict[str, Any]], look_at: list[str]) -> Verdict:
    """Verdict on one scaling mode: parallel efficiency at the largest world size and what dominates."""
    rows = [r for r in rows if r.get("efficiency") is not None]
    if not rows:
        return Verdict("info", "no measurement")
    last = max(rows, key=lambda r: r["world_size"])
    eff = last["efficiency"]
    head = f"{eff:.0%} parallel efficiency on {last['world_size']} ranks"
    if eff >= GOOD_EFFICIENCY:
        return Verdict("good", f"{head} — expected")
    where = list(look_at)
    comm, data = last.get("comm_share"), last.get("data_s")
    if comm is not None and comm > 0.3:
        where.insert(0, f"communication takes {comm:.0%} of a step: the interconnect (see the busbw figures) "
                        "or too small a batch per rank")
    first = min(rows, key=lambda r: r["world_size"])
    if last.get("mode") == "weak" and first.get("compute_s") and (last.get("compute_s") or 0) > 1.3 * first["compute_s"]:
        where.insert(0, f"compute per step grew from {first['compute_s'] * 1e3:.0f} to {last['compute_s'] * 1e3:.0f} ms "
                        "at the same batch per rank: the ranks compete for CPU cores or memory bandwidth, or GPUs throttle")
    if data and last.get("step_time_s") and data / last["step_time_s"] > 0.2:
        where.insert(0, "input loading takes over 20% of a step: more loader workers")
    if last.get("mode") == "strong":
        where.append("strong scaling shrinks the batch per rank, so compute per step falls while the gradient "
                     "all-reduce stays the same size")
    level = "warn" if eff >= POOR_EFFICIENCY else "bad"
    return Verdict(level, f"{head} — look at: {'; '.join(where) or 'the step-time breakdown'}")


def topology_verdict(topology: Topology) -> Verdict:
    """Verdict on the wiring itself: NVLinks missing against the GPU model, or a plain summary."""
    problems = [h for h in hints({}, topology) if "NVLink" in h or "PCIe" in h]
    if problems:
        return Verdict("bad", "; ".join(problems))
    if topology.device_kind == "worker":
        return Verdict("info", f"no GPU: {len(topology.devices())} CPU workers over shared memory")
    n = len(topology.gpus())
    return Verdict("good", f"{n} GPU{'s' if n != 1 else ''} ({topology.gpu_model}), every link the model should have is up")
