"""What `meshscale plan` and `meshscale sim` compute: the chosen schedule of one collective with its
prediction, bottleneck and bound; and a predicted size sweep in the same rows as `bench collective`."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from meshscale.collectives.algorithms.base import check_root
from meshscale.collectives.bounds import busbw_bound
from meshscale.collectives.kinds import kind
from meshscale.collectives.schedule import Schedule
from meshscale.errors import MeshscaleError
from meshscale.results import Result
from meshscale.simulate.auto import choose_and_simulate
from meshscale.simulate.cost import Call, Prediction, call_bytes
from meshscale.simulate.fabric import Fabric
from meshscale.simulate.nccl.model import predict as nccl_predict
from meshscale.simulate.params import SimParams
from meshscale.simulate.sim import SimResult
from meshscale.topology import Topology
from meshscale.units import format_bytes, gbps


@dataclass
class Plan:
    """One collective planned on a topology: the schedule, its prediction, the alternatives and the bound."""

    topology: Topology
    schedule: Schedule
    result: SimResult
    candidates: list[SimResult]
    bound_busbw_bytes_per_s: float | None
    pruned: list[str] = field(default_factory=list)  # candidates that could not win (not fully simulated)
    skipped: dict[str, str] = field(default_factory=dict)  # algorithms that do not apply, and why
    nccl: Prediction | None = None  # what NCCL would pick and take (GPU systems)
    nccl_settings: str = ""  # NCCL's environment the prediction used (KEY=VALUE ...), "" for its defaults


MAX_PLAN_RANKS = 32  # ranks whose schedules `plan` simulates transfer by transfer within seconds


def plan(fabric: Fabric, collective: str, ranks: list[int], nbytes: int, root: int = 0) -> Plan:
    """Choose (``fabric.algo`` "auto") or build meshscale's schedule and predict it, and say what NCCL would do
    (the fabric's NCCL settings); raises one-line errors on bad input."""
    topology, params = fabric.topology, fabric.params or SimParams()
    if fabric.algo == "nccl":
        raise MeshscaleError("plan shows NCCL's pick beside meshscale's schedule; --algo picks the schedule: auto or "
                             "a meshscale schedule name (force NCCL's algorithm with --nccl-algo)")
    if len(ranks) > MAX_PLAN_RANKS:
        raise MeshscaleError(f"plan simulates every transfer of meshscale's schedules: at most {MAX_PLAN_RANKS} ranks, "
                             f"got {len(ranks)}; use sim (NCCL's model, any size) or fewer --devices")
    choice = choose_and_simulate(topology, collective, ranks, nbytes, fabric.algo, params, root)
    if topology.device_kind == "gpu":
        choice.result = with_call_costs(choice.result, len(choice.schedule.steps), step_call_s(topology, ranks))
    bound = _bound(topology, collective, ranks, root)
    theirs = replace(fabric, algo="nccl").cost(Call(collective, nbytes, tuple(ranks), root)) \
        if topology.device_kind == "gpu" else None
    return Plan(topology, choice.schedule, choice.result, choice.candidates, bound, choice.pruned, choice.skipped, theirs,
                " ".join(fabric.nccl.env.settings))


def step_call_s(topology: Topology, ranks: list[int]) -> float:
    """What one step of a meshscale schedule costs beyond its bytes when it runs on GPUs: the executor issues each
    step as one grouped NCCL send/recv call (`execute.schedule_runner`), which pays NCCL's launch and per-call
    latency; NCCL's model prices that call (a send of 4 bytes between two of the ranks)."""
    return nccl_predict(topology, "send_recv", list(ranks[:2]), 4).time_s


def with_call_costs(result: SimResult, steps: int, per_step_s: float) -> SimResult:
    """``result`` with ``steps`` calls of ``per_step_s`` added to its time (and its bandwidths recomputed)."""
    time_s = result.time_s + steps * per_step_s
    alg, bus = kind(result.collective).algbw_busbw(result.nbytes, time_s, len(result.ranks))
    return replace(result, time_s=time_s, algbw_bytes_per_s=alg, busbw_bytes_per_s=bus)


def _bound(topology: Topology, collective: str, ranks: list[int], root: int) -> float | None:
    if topology.cluster is not None:  # the bound routes every pair of GPUs: too many across a cluster's nodes
        return None
    try:
        return busbw_bound(topology, collective, ranks, root) if len(ranks) > 1 else None
    except MeshscaleError:
        return None


def above_bound_reason(detail: str, busbw_bytes_per_s: float, bound_busbw_bytes_per_s: float | None) -> str:
    """Why a prediction may stand above the links' bound ("" when it does not): NVLS reduces inside the NVSwitch,
    so each GPU's links carry the data about once each way where the bound counts 2(n-1)/n; a meshscale schedule
    may add a second fabric (PCIe beside NVLink) the bound leaves out."""
    if not bound_busbw_bytes_per_s or busbw_bytes_per_s <= bound_busbw_bytes_per_s * 1.001:
        return ""
    if "nvls" in detail:
        return ("above the bound: NVLS reduces in the NVSwitch, so a GPU's links carry the data about once each "
                "way, not the 2(n-1)/n times the bound counts")
    if not detail.startswith("nccl"):
        return "above the bound: the bound counts one fabric; this schedule adds another"
    return "above the bound: NCCL's rates here exceed the links' line rate; please report it"


def _comparison(p: Plan) -> tuple[SimResult | Prediction, str, str]:
    """The faster of NCCL's choice and meshscale's schedule, its name, and a line on the other."""
    mine, theirs = p.result, p.nccl
    mine_name = f"meshscale's {mine.detail or mine.algorithm} (flow simulation of its transfers, one NCCL call a step)"
    if theirs is None:
        return mine, mine_name, ""
    theirs_name = f"NCCL's choice, {theirs.chosen} (NCCL's cost model)"
    if theirs.time_s <= mine.time_s:
        slower = mine.time_s / theirs.time_s - 1
        why = ("NCCL reduces inside the NVSwitch (NVLS), which no meshscale schedule does" if "nvls" in theirs.detail
               else f"NCCL runs {theirs.channels} channels, the schedule {p.schedule.channels}"
               if theirs.channels > p.schedule.channels else "by the links' model of each")
        return theirs, theirs_name, (f"meshscale's own schedule ({mine.detail or mine.algorithm}) is slower here: "
                                     f"busbw {gbps(mine.busbw_bytes_per_s):.2f} GB/s, {slower:.0%} more time; {why}")
    faster = theirs.time_s / mine.time_s - 1
    n = len(mine.ranks)
    ring_steps = 2 * (n - 1) if mine.collective == "all_reduce" else n - 1
    why = (f"its {len(p.schedule.steps)} steps against the {ring_steps} of a ring pay less latency"
           if len(p.schedule.steps) < ring_steps else "its transfers spread over links NCCL's channels leave idle")
    return mine, mine_name, (f"NCCL would run {theirs.chosen}: busbw "
                             f"{gbps(theirs.busbw_bytes_per_s):.2f} GB/s, {faster:.0%} more time than this schedule; "
                             + why)


def format_plan(p: Plan, max_candidates: int = 8) -> str:
    """The plan as text: header, one headline (the faster of NCCL's choice and meshscale's schedule, the other
    explained beside it), the schedule with its channels, bottleneck and bound, then the alternatives."""
    s, r = p.schedule, p.result
    root = f", root rank {s.root}" if s.root is not None else ""
    best, name, other = _comparison(p)
    lines = [f"{s.collective} of {format_bytes(s.nbytes)} over {p.topology.name} devices {s.ranks}{root}",
             f"parameters: {r.params_source}" + (f"; NCCL with {p.nccl_settings}" if p.nccl_settings else ""),
             f"predicted:  time {best.time_s * 1e6:.1f} us, algbw {gbps(best.algbw_bytes_per_s):.2f} GB/s, "
             f"busbw {gbps(best.busbw_bytes_per_s):.2f} GB/s: {name}"]
    if other:
        lines.append(f"versus:     {other}")
    lines.append(f"algorithm:  meshscale's {r.detail or s.algorithm}; {len(s.steps)} steps, {r.transfers} transfers, "
                 f"time {r.time_s * 1e6:.1f} us, busbw {gbps(r.busbw_bytes_per_s):.2f} GB/s")
    for key, value in s.meta.items():
        if key != "elem_bytes":
            lines.append(f"  {key}: {value}")
    if r.bottleneck:
        b = r.bottleneck
        lines.append(f"bottleneck: {b.name}: {format_bytes(b.bytes)} at {gbps(b.capacity_bytes_per_s):.1f} GB/s "
                     f"effective, busy {100 * b.utilization:.0f}% of the time (meshscale's schedule)")
    if p.bound_busbw_bytes_per_s:
        share = best.busbw_bytes_per_s / p.bound_busbw_bytes_per_s
        reason = above_bound_reason(_label(best), best.busbw_bytes_per_s, p.bound_busbw_bytes_per_s)
        lines.append(f"bound:      busbw <= {gbps(p.bound_busbw_bytes_per_s):.2f} GB/s at line rate (injection and cuts "
                     f"of the topology); the headline reaches {100 * share:.0f}%" + (f" ({reason})" if reason else ""))
    lines.append("candidates (meshscale's schedules, simulated, fastest first):")
    for c in p.candidates[:max_candidates]:
        lines.append(f"  {c.detail:<45} {c.time_s * 1e6:12.1f} us  busbw {gbps(c.busbw_bytes_per_s):8.2f} GB/s")
    if p.pruned:
        lines.append(f"  {len(p.pruned)} more could not beat the best (lower bound or partial simulation): "
                     + "; ".join(p.pruned[:6]) + ("; ..." if len(p.pruned) > 6 else ""))
    for name, why in p.skipped.items():
        lines.append(f"  not applicable: {why}")
    return "\n".join(lines)


def sim_sweep(fabric: Fabric, collective: str, ranks: list[int], sizes: list[int], root: int = 0) -> Result:
    """Predicted rows for every size, keyed like `bench collective`'s (Result kind "sim", predicted=True), by the
    model ``fabric.algo`` names: "nccl", NCCL's cost model (its pick per size, in the fabric's NCCL settings);
    "auto" or a schedule's name, meshscale's schedule as `plan` predicts it (one NCCL call a step, and its
    bottleneck). Sizes as nccl-tests takes them (`call_bytes`)."""
    given = fabric.nccl.given()
    if given and fabric.algo != "nccl":
        raise MeshscaleError(f"{', '.join(given)} describe NCCL's run; they go with --algo nccl, not {fabric.algo}")
    check_root(collective, root, len(ranks))  # before any size: the NCCL model and the bound index by it
    topology, params = fabric.topology, fabric.params or SimParams()
    rows = []
    k, n = kind(collective), len(ranks)
    for size in sizes:
        nbytes = call_bytes(collective, size, n)
        if fabric.algo == "nccl":  # NCCL's model prices the call; meshscale's schedules also show what they built
            r, bound = fabric.cost(Call(collective, nbytes, tuple(ranks), root)), _bound(topology, collective, ranks, root)
        else:
            p = plan(fabric, collective, ranks, nbytes, root)
            r, bound = p.result, p.bound_busbw_bytes_per_s
        rows.append({"collective": k.name, "size_bytes": nbytes, "count": k.count(nbytes, n, 4),
                     "dtype": "float32", "redop": "sum" if k.reducing else "none",
                     "root": root if k.rooted else -1, "time_s": r.time_s,
                     "algbw_bytes_per_s": r.algbw_bytes_per_s, "busbw_bytes_per_s": r.busbw_bytes_per_s,
                     "algorithm": " ".join(x for x in (_label(r), _bracket(above_bound_reason(
                         _label(r), r.busbw_bytes_per_s, bound))) if x),
                     "bound_busbw_bytes_per_s": bound,
                     "bottleneck": r.bottleneck.name if getattr(r, "bottleneck", None) else None})
    meta = {"system": topology.name, "ranks": list(ranks), "world_size": len(ranks),
            "algorithm": fabric.algo, "params": params.source,
            **{k: v for k, v in given.items() if k != "nccl_env"}}
    if "nccl_env" in given:
        meta["nccl_env"] = list(fabric.nccl.env.settings)
    return Result("sim", rows, predicted=True, meta=meta)


def _label(r: SimResult | Prediction) -> str:
    """What ran, as rows and headlines name it: NCCL's "nccl <algorithm/protocol, channels>" or the schedule."""
    return r.detail if isinstance(r, Prediction) else r.detail or r.algorithm


def _bracket(text: str) -> str:
    return f"({text})" if text else ""


def plan_result(p: Plan) -> Result:
    """The plan as a Result (kind "plan", predicted): one row, plus the schedule's channels in meta."""
    r = p.result
    row = {"collective": r.collective, "size_bytes": r.nbytes, "time_s": r.time_s, "algbw_bytes_per_s": r.algbw_bytes_per_s,
           "busbw_bytes_per_s": r.busbw_bytes_per_s, "algorithm": r.detail or r.algorithm,
           "bound_busbw_bytes_per_s": p.bound_busbw_bytes_per_s,
           "bottleneck": r.bottleneck.name if r.bottleneck else None,
           "bottleneck_utilization": r.bottleneck.utilization if r.bottleneck else None}
    best, name, other = _comparison(p)
    meta = {"system": p.topology.name, "ranks": r.ranks, "params": r.params_source,
            "headline": {"by": name, "time_s": best.time_s, "busbw_bytes_per_s": best.busbw_bytes_per_s,
                         "versus": other},
            "nccl": {"algorithm": p.nccl.detail, "time_s": p.nccl.time_s, "busbw_bytes_per_s": p.nccl.busbw_bytes_per_s,
                     "settings": p.nccl_settings}
            if p.nccl else None,
            "schedule_meta": {k: v for k, v in p.schedule.meta.items() if k != "elem_bytes"},
            "candidates": [{"algorithm": c.detail, "time_s": c.time_s, "busbw_bytes_per_s": c.busbw_bytes_per_s}
                           for c in p.candidates]}
    return Result("plan", [row], predicted=True, meta=meta)
