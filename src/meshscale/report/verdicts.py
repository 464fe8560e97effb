"""One-line verdicts for the report's figures: how close a measurement came to its bound, and where to look
when it fell short (NCCL knobs that disable fast paths, NVLinks down, narrow PCIe links, CPU fallback)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Callable

from meshscale.report.expected import MODEL_MARGIN, SIZE_CLASSES, SPREAD, Expected
from meshscale.topology.model import Topology
from meshscale.units import is_digits

# Share of the line-rate bound a healthy system reaches: nccl-tests on NVLink machines report 80-90 % busbw
# of the link rate (nccl-tests on 4x H200 here: 355 of 394 GB/s), PCIe systems about 70-80 %.
GOOD_SHARE = 0.70
POOR_SHARE = 0.50
GOOD_EFFICIENCY = 0.85  # weak scaling of ResNet-50 over NVLink stays near 90 % (Goyal et al. 2017)
# Training predictions held within about 15 % of measured throughput (ResNet-50 and GPT-small on 2 H200 and an
# emulated two-node run); a larger gap says the model or the machine is off.
SCALING_KNOWN_ERROR = 0.15
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
        # no NVLink anywhere (one GPU, a VM, a partition): the links have no peer, nothing is down
        linked = any(topology.nvlink_count(g) for g in topology.gpus())
        for gpu in topology.gpus():
            node = topology.nodes[gpu]
            want = expected_nvlinks(str(node.attrs.get("model", "")))
            have = topology.nvlink_count(gpu)
            if want and have < want and linked:
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


def collective_verdict(rows: list[dict[str, Any]], look_at: list[str], cpu: bool = False,
                       references: Callable[[dict[str, Any]], tuple[Expected | None, Expected | None]] | None = None,
                       floor_s: float = 0.0) -> Verdict:
    """Verdict on one collective: each size's measured busbw (its better placement, in- or out-of-place)
    against what healthy hardware reaches there (``references(row)``: the corpus figure, the model's
    prediction), the model's gap beyond its known error as a finding, and the link bound as information.
    ``floor_s``: a per-call cost no message beats on this path (torch's eager launch), which caps expected
    busbw at small sizes. Without references (CPU workers, or none given): the share of the link bound."""
    rows = [r for r in rows if r.get("busbw_bytes_per_s") is not None]
    if not rows:
        return Verdict("info", "no measurement")
    if any(r.get("wrong") for r in rows):
        return Verdict("bad", "wrong results were reported: the collective returned incorrect data — "
                              "check the GPUs (`nvidia-smi -q -d ECC`) and rerun with NCCL_DEBUG=WARN")
    biggest = max(rows, key=lambda r: r["size_bytes"])
    bound = biggest.get("bound_busbw_bytes_per_s") or 0.0
    if cpu or references is None:
        verdict = share_verdict(biggest["busbw_bytes_per_s"], bound, "link bound at the largest size", look_at)
        if cpu and verdict.level in ("warn", "bad"):
            # On CPU workers a low share of an assumed memory bandwidth is the normal state, not a fault.
            return Verdict("info", verdict.text.split(" — ")[0] + " — expected for CPU workers over Gloo "
                           "(the bound is an assumed shared-memory rate, not a measured link)")
        return verdict
    judged, gaps = [], []  # per size: (share of expected, row, expected); (|log gap|, row, model figure)
    for size in sorted({r["size_bytes"] for r in rows}):
        best, closest = None, None
        for r in (r for r in rows if r["size_bytes"] == size):
            reference, model = references(r)
            capped = _capped(model.busbw_bytes_per_s, r, floor_s) if model is not None else 0.0
            if model is not None and r["busbw_bytes_per_s"] > 0 and capped > 0:  # a zero (one rank) has no gap
                gap = abs(math.log(r["busbw_bytes_per_s"] / capped))
                if closest is None or gap < closest[0]:
                    closest = (gap, r, model)
            chosen = reference or model
            expected = _capped(chosen.busbw_bytes_per_s, r, floor_s) if chosen is not None else 0.0
            if chosen is not None and expected > 0:
                if floor_s and r.get("time_s", 0) < 2 * floor_s:  # launch-bound: it moves as small messages do
                    chosen = replace(chosen, floor=min(chosen.floor, 1 - SPREAD[SIZE_CLASSES[0]]))
                share = r["busbw_bytes_per_s"] / expected
                if best is None or share > best[0]:
                    best = (share, r, chosen, expected)
        judged += [best] if best else []
        gaps += [closest] if closest else []
    bound_note = f"link bound {_gbps(bound)} at the largest size, for information" if bound > 0 else ""
    if not judged:
        share = f"{biggest['busbw_bytes_per_s'] / bound:.0%} of the link bound at the largest size; " if bound > 0 else ""
        return Verdict("info", f"{share}no expected figure for this system (no corpus measurement, no model "
                               "prediction), so no judgement")
    short = [j for j in judged if j[0] < j[2].floor]
    share, row, chosen, expected = min(short, key=lambda j: j[0]) if short else judged[-1]
    floored = (f" (floored at the {floor_s * 1e6:.0f} us per-call cost of this run's eager path)"
               if expected < chosen.busbw_bytes_per_s else "")
    figure = (f"at {_size(row['size_bytes'])} expected about {_gbps(expected)} ({chosen.source}){floored}; "
              f"measured {_gbps(row['busbw_bytes_per_s'])} ({share:.0%})")
    if short:
        where = "; ".join(look_at) or "the route of this collective (run `meshscale doctor` and `meshscale bench p2p`)"
        spread = f"below the {1 - chosen.floor:.0%} a healthy run may fall short"
        level = "bad" if share < chosen.floor * 0.6 else "warn"  # far below the healthy spread: a fault, not noise
        return Verdict(level, f"{figure}, {spread} — look at: {where}" + (f". {bound_note}" if bound_note else ""))
    text = f"{figure} — within what healthy hardware reaches at every size"
    finding = _model_gap(gaps, chosen)
    if bound_note:
        text += f". {bound_note}"
    return Verdict("info", f"{text}. {finding}") if finding else Verdict("good", text)


def _capped(expected_bytes_per_s: float, row: dict[str, Any], floor_s: float) -> float:
    """Expected busbw no faster than the per-call floor allows at this row's size (busbw scales as 1 / time)."""
    if floor_s <= 0 or not row.get("time_s"):
        return expected_bytes_per_s
    return min(expected_bytes_per_s, row["busbw_bytes_per_s"] * row["time_s"] / floor_s)


def _model_gap(gaps: list[tuple[float, dict[str, Any], Expected]], reference: Expected) -> str:
    """A gap between the model and the measurement beyond the model's known error (plus its margin) is a
    finding of its own; when the model is the reference itself, only a measurement well above it is."""
    beyond = [g for g in gaps if g[2].error is not None and g[0] > math.log(1 + g[2].error + MODEL_MARGIN)]
    if reference.basis == "model":
        beyond = [g for g in beyond if g[1]["busbw_bytes_per_s"] > g[2].busbw_bytes_per_s]
    if not beyond:
        return ""
    _, row, model = max(beyond, key=lambda g: g[0])
    gap = row["busbw_bytes_per_s"] / model.busbw_bytes_per_s - 1
    return (f"Finding: at {_size(row['size_bytes'])} the model predicts {_gbps(model.busbw_bytes_per_s)} and "
            f"{_gbps(row['busbw_bytes_per_s'])} was measured; the model's known error here is {model.error:.0%}, "
            f"this gap is {gap:+.0%}: the model or the machine is off")


def _gbps(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.3g} GB/s"


def _size(size_bytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size_bytes >= scale and size_bytes % scale == 0:
            return f"{size_bytes // scale} {unit}"
    return f"{size_bytes} B"


# torch.distributed's eager per-call cost on 2 H200 (docs/results/h200x2-2026-11-22-b): above it, a small
# message's time is the host's launch path, not the interconnect
EAGER_CALL_S = 20e-6


def eager_path(meta: dict[str, Any]) -> bool:
    """A GPU run through torch.distributed's eager calls (--impl native over NCCL), whose every call costs the
    host's launch path."""
    impl = (meta.get("spec") or {}).get("impl", "native")
    return impl == "native" and str(meta.get("backend", "")).lower() == "nccl"


def per_call_floor_s(rows: list[dict[str, Any]], meta: dict[str, Any]) -> float:
    """The per-call cost no message of an eager GPU run beats: the run's own fastest call of this collective
    (calibrated in the same run: the host's launch path varies with CPU and torch build), at least the eager
    cost measured on 2 H200. 0 for runs not on torch's eager path."""
    if not eager_path(meta):
        return 0.0
    return max(EAGER_CALL_S, min((r["time_s"] for r in rows if r.get("time_s")), default=0.0))


def small_message_note(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str | None:
    """Why the smallest messages take what they take, when torch's eager path dominates (GPU, --impl native)."""
    small = [r for r in rows if r.get("time_s") and r["size_bytes"] <= 64 << 10]
    if not eager_path(meta) or not small:
        return None
    t = min(r["time_s"] for r in small)
    if t < EAGER_CALL_S:
        return None
    return (f"small messages take {t * 1e6:.0f} us or more: torch.distributed's per-call cost, not the link; "
            "`--impl nccl` times NCCL called directly, as nccl-tests does")


def host_path_rates(rows: list[dict[str, Any]]) -> dict[tuple[Any, Any], float]:
    """Rate of a copy staged through host memory between each two GPUs, from the host<->device copies measured
    in the same result: down to the host, then up, one after the other."""
    down = {r["src"]: r["bandwidth_bytes_per_s"] for r in rows
            if r.get("dst") == "host" and r.get("bandwidth_bytes_per_s") and r.get("mode", "unidirectional") == "unidirectional"}
    up = {r["dst"]: r["bandwidth_bytes_per_s"] for r in rows
          if r.get("src") == "host" and r.get("bandwidth_bytes_per_s") and r.get("mode", "unidirectional") == "unidirectional"}
    return {(a, b): 1 / (1 / down[a] + 1 / up[b]) for a in down for b in up if a != b}


def p2p_verdict(rows: list[dict[str, Any]], rate_of: dict[tuple[int, int], float], look_at: list[str],
                what: str = "line rate") -> Verdict:
    """Verdict on a P2P matrix: the slowest pair against its line rate (when the topology is known; ``what``
    names that rate, e.g. the host path for staged copies), else the spread between the slowest and the
    fastest pair."""
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
                              f"{what} on the slowest pair ({_name(worst['src'])}->{_name(worst['dst'])})", look_at)
            return v
    # no line rate known: the slowest pair against the fastest
    low, high = (min(r["bandwidth_bytes_per_s"] for r in rows), max(r["bandwidth_bytes_per_s"] for r in rows))
    return share_verdict(low, high, "fastest pair's bandwidth on the slowest pair", look_at)


def rank_label(device: Any, kind: str | None = None) -> str:
    """The one name of a rank in plots, notes and the topology drawing alike, as nvidia-smi writes it: "GPU3",
    or "worker1" for a CPU worker process. ``device`` is an index (a GPU unless ``kind`` is "worker") or a node
    name such as gpu3 or worker1."""
    text = str(device)
    if is_digits(text):
        return f"{'worker' if kind == 'worker' else 'GPU'}{int(text)}"
    if re.fullmatch(r"gpu\d+", text):
        return f"GPU{int(text[3:])}"
    return text


_name = rank_label


def scaling_verdict(rows: list[dict[str, Any]], look_at: list[str],
                    predicted: list[dict[str, Any]] | None = None) -> Verdict:
    """Verdict on one scaling mode: parallel efficiency at the largest world size and what dominates. With a
    prediction of the same series (``predicted``), an efficiency within the prediction's known error of the
    predicted one is what this machine is expected to do, however far from linear."""
    rows = [r for r in rows if r.get("efficiency") is not None]
    if not rows:
        return Verdict("info", "no measurement")
    last = max(rows, key=lambda r: r["world_size"])
    first = min(rows, key=lambda r: r["world_size"])
    if first["world_size"] != 1:
        # an efficiency needs the one-rank throughput; against the smallest run it would call that run perfect
        text = "no one-rank baseline measured: efficiency not stated"
        if last["world_size"] > first["world_size"] and first.get("throughput_samples_per_s"):
            grew = last["throughput_samples_per_s"] / first["throughput_samples_per_s"]
            text += (f"; from {first['world_size']} to {last['world_size']} ranks throughput grew {grew:.2f}x "
                     f"({grew * first['world_size'] / last['world_size']:.0%} of linear)")
        return Verdict("info", text)
    eff = last["efficiency"]
    head = f"{eff:.0%} parallel efficiency on {last['world_size']} ranks"
    if eff >= GOOD_EFFICIENCY:
        return Verdict("good", f"{head} — expected")
    want = next((r for r in predicted or [] if r["world_size"] == last["world_size"] and r.get("efficiency")), None)
    if want is not None and eff >= want["efficiency"] / (1 + SCALING_KNOWN_ERROR):
        return Verdict("good", f"{head}; the model predicted {want['efficiency']:.0%} from this run's profile and "
                               f"links (known error about {SCALING_KNOWN_ERROR:.0%}) — expected")
    where = list(look_at)
    comm, data = last.get("comm_share"), last.get("data_s")
    if comm is not None and comm > 0.3:
        where.insert(0, f"communication takes {comm:.0%} of a step: the interconnect (see the busbw figures) "
                        "or too small a batch per rank")
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


def scaling_gap(measured: list[dict[str, Any]], predicted: list[dict[str, Any]]) -> str:
    """A finding when predicted and measured scaling differ beyond the prediction's known error: speedups
    when both have a one-rank point, else throughputs, at the world size where they differ most."""
    def by_world(rows):
        return {r["world_size"]: r for r in rows if r.get("throughput_samples_per_s")}
    have, want = by_world(measured), by_world(predicted)
    key = "speedup" if 1 in have and 1 in want else "throughput_samples_per_s"
    pairs = [(have[w], want[w]) for w in sorted(set(have) & set(want)) if w > 1 and have[w].get(key) and want[w].get(key)]
    if not pairs:
        return ""
    m, p = max(pairs, key=lambda pair: abs(math.log(pair[0][key] / pair[1][key])))
    gap = m[key] / p[key] - 1
    if abs(math.log(1 + gap)) <= math.log(1 + SCALING_KNOWN_ERROR):
        return ""
    what = (f"a {p[key]:.2f}x speedup predicted, {m[key]:.2f}x measured" if key == "speedup" else
            f"{p[key]:.0f} samples/s predicted, {m[key]:.0f} measured")
    return (f"Finding: on {m['world_size']} ranks {what}; the prediction's known error is about "
            f"{SCALING_KNOWN_ERROR:.0%}, this gap is {gap:+.0%}: the model or the machine is off")


def topology_verdict(topology: Topology) -> Verdict:
    """Verdict on the wiring itself: NVLinks missing against the GPU model, or a plain summary."""
    problems = [h for h in hints({}, topology) if "NVLink" in h or "PCIe" in h]
    if problems:
        return Verdict("bad", "; ".join(problems))
    if topology.device_kind == "worker":
        return Verdict("info", f"no GPU: {len(topology.devices())} CPU workers over shared memory")
    n = len(topology.gpus())
    if not any(topology.nvlink_count(g) for g in topology.gpus()) and \
            any(expected_nvlinks(str(topology.nodes[g].attrs.get("model", ""))) for g in topology.gpus()):
        return Verdict("info", f"{n} GPU{'s' if n != 1 else ''} ({topology.gpu_model}): NVLink inactive, no peer visible "
                       "(one GPU, a VM or a partition)")
    return Verdict("good", f"{n} GPU{'s' if n != 1 else ''} ({topology.gpu_model}), every link the model should have is up")
