"""What `meshscale plan` and `meshscale sim` compute: the chosen schedule of one collective with its
prediction, bottleneck and bound; and a predicted size sweep in the same rows as `bench collective`."""
from __future__ import annotations

from dataclasses import dataclass, field

from meshscale.collectives.algorithms.base import check_root
from meshscale.collectives.bounds import busbw_bound
from meshscale.collectives.kinds import kind
from meshscale.collectives.schedule import Schedule
from meshscale.errors import MeshscaleError
from meshscale.results import Result
from meshscale.simulate.auto import choose_and_simulate, nccl_result
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
    nccl: SimResult | None = None  # what NCCL would pick and take (GPU systems)


def plan(topology: Topology, collective: str, ranks: list[int], nbytes: int, algorithm: str = "auto",
         root: int = 0, params: SimParams | None = None, **nccl) -> Plan:
    """Choose (``algorithm`` "auto") or build the schedule and predict it, and say what NCCL would do
    (``nccl``: `nccl_result`'s keywords); raises one-line errors on bad input."""
    choice = choose_and_simulate(topology, collective, ranks, nbytes, algorithm, params or SimParams(), root)
    bound = _bound(topology, collective, ranks, root)
    theirs = nccl_result(topology, collective, ranks, nbytes, params, root, **nccl) \
        if topology.device_kind == "gpu" else None
    return Plan(topology, choice.schedule, choice.result, choice.candidates, bound, choice.pruned, choice.skipped, theirs)


def _bound(topology: Topology, collective: str, ranks: list[int], root: int) -> float | None:
    if "cluster" in topology.attrs:  # the bound routes every pair of GPUs: too many across a cluster's nodes
        return None
    try:
        return busbw_bound(topology, collective, ranks, root) if len(ranks) > 1 else None
    except MeshscaleError:
        return None


def format_plan(p: Plan, max_candidates: int = 8) -> str:
    """The plan as text: header, algorithm and its channels, prediction, bottleneck, bound, alternatives."""
    s, r = p.schedule, p.result
    root = f", root rank {s.root}" if s.root is not None else ""
    lines = [f"{s.collective} of {format_bytes(s.nbytes)} over {p.topology.name} devices {s.ranks}{root}",
             f"parameters: {r.params_source}",
             f"algorithm:  {r.detail or s.algorithm}; {len(s.steps)} steps, {r.transfers} transfers"]
    for key, value in s.meta.items():
        if key != "elem_bytes":
            lines.append(f"  {key}: {value}")
    lines.append(f"predicted:  time {r.time_s * 1e6:.1f} us, algbw {gbps(r.algbw_bytes_per_s):.2f} GB/s, "
                 f"busbw {gbps(r.busbw_bytes_per_s):.2f} GB/s")
    if r.bottleneck:
        b = r.bottleneck
        lines.append(f"bottleneck: {b.name}: {format_bytes(b.bytes)} at {gbps(b.capacity_bytes_per_s):.1f} GB/s "
                     f"effective, busy {100 * b.utilization:.0f}% of the time")
    if p.bound_busbw_bytes_per_s:
        share = r.busbw_bytes_per_s / p.bound_busbw_bytes_per_s
        lines.append(f"bound:      busbw <= {gbps(p.bound_busbw_bytes_per_s):.2f} GB/s at line rate (injection and cuts of "
                     f"the topology); this plan reaches {100 * share:.0f}%"
                     + (" (the bound counts one fabric; this plan adds another)" if share > 1.001 else ""))
    if p.nccl:
        n = p.nccl
        lines.append(f"NCCL:       {n.detail}: time {n.time_s * 1e6:.1f} us, algbw {gbps(n.algbw_bytes_per_s):.2f} GB/s, "
                     f"busbw {gbps(n.busbw_bytes_per_s):.2f} GB/s (NCCL's cost model)")
    lines.append("candidates (simulated, fastest first):")
    for c in p.candidates[:max_candidates]:
        lines.append(f"  {c.detail:<45} {c.time_s * 1e6:12.1f} us  busbw {gbps(c.busbw_bytes_per_s):8.2f} GB/s")
    if p.pruned:
        lines.append(f"  {len(p.pruned)} more could not beat the best (lower bound or partial simulation): "
                     + "; ".join(p.pruned[:6]) + ("; ..." if len(p.pruned) > 6 else ""))
    for name, why in p.skipped.items():
        lines.append(f"  not applicable: {why}")
    return "\n".join(lines)


def sim_sweep(topology: Topology, collective: str, ranks: list[int], sizes: list[int], algorithm: str = "nccl",
              root: int = 0, params: SimParams | None = None, **nccl) -> Result:
    """Predicted rows for every size, keyed like `bench collective`'s (Result kind "sim", predicted=True).
    ``algorithm`` "nccl": NCCL's cost model (its pick per size; ``nccl``: `nccl_result`'s keywords); "auto" or
    an algorithm name: meshscale's schedule by flow simulation. Sizes that do not split over the ranks are
    rounded down to a multiple of 4 bytes per rank."""
    if nccl and algorithm != "nccl":
        raise MeshscaleError(f"{', '.join(nccl)} describe NCCL's run; they go with --algo nccl, not {algorithm}")
    check_root(collective, root, len(ranks))  # before any size: the NCCL model and the bound index by it
    params = params or SimParams()
    rows = []
    k, n = kind(collective), len(ranks)
    step = 4 * n if k.segmented else 4
    for size in sizes:
        nbytes = max(step, size // step * step)
        if algorithm == "nccl":
            r, bound = nccl_result(topology, collective, ranks, nbytes, params, root, **nccl), _bound(topology, collective, ranks, root)
        else:
            p = plan(topology, collective, ranks, nbytes, algorithm, root, params)
            r, bound = p.result, p.bound_busbw_bytes_per_s
        rows.append({"collective": k.name, "size_bytes": nbytes, "count": k.count(nbytes, n, 4),
                     "dtype": "float32", "redop": "sum" if k.reducing else "none",
                     "root": root if k.rooted else -1, "time_s": r.time_s,
                     "algbw_bytes_per_s": r.algbw_bytes_per_s, "busbw_bytes_per_s": r.busbw_bytes_per_s,
                     "algorithm": r.detail or r.algorithm, "bound_busbw_bytes_per_s": bound,
                     "bottleneck": r.bottleneck.name if r.bottleneck else None})
    meta = {"system": topology.name, "ranks": list(ranks), "world_size": len(ranks),
            "algorithm": algorithm, "params": params.source,
            **{k: v for k, v in nccl.items() if v is not None}}
    return Result("sim", rows, predicted=True, meta=meta)


def plan_result(p: Plan) -> Result:
    """The plan as a Result (kind "plan", predicted): one row, plus the schedule's channels in meta."""
    r = p.result
    row = {"collective": r.collective, "size_bytes": r.nbytes, "time_s": r.time_s, "algbw_bytes_per_s": r.algbw_bytes_per_s,
           "busbw_bytes_per_s": r.busbw_bytes_per_s, "algorithm": r.detail or r.algorithm,
           "bound_busbw_bytes_per_s": p.bound_busbw_bytes_per_s,
           "bottleneck": r.bottleneck.name if r.bottleneck else None,
           "bottleneck_utilization": r.bottleneck.utilization if r.bottleneck else None}
    meta = {"system": p.topology.name, "ranks": r.ranks, "params": r.params_source,
            "nccl": {"algorithm": p.nccl.detail, "time_s": p.nccl.time_s, "busbw_bytes_per_s": p.nccl.busbw_bytes_per_s}
            if p.nccl else None,
            "schedule_meta": {k: v for k, v in p.schedule.meta.items() if k != "elem_bytes"},
            "candidates": [{"algorithm": c.detail, "time_s": c.time_s, "busbw_bytes_per_s": c.busbw_bytes_per_s}
                           for c in p.candidates]}
    return Result("plan", [row], predicted=True, meta=meta)
