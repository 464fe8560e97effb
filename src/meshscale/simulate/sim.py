"""Time a `Schedule` on a topology with the flow-level engine, and report it as nccl-tests would."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from meshscale.collectives.kinds import kind
from meshscale.collectives.schedule import Schedule, dependencies
from meshscale.errors import MeshscaleError
from meshscale.simulate.engine import FlowRun, resources, run_flows, solo_rates
from meshscale.simulate.params import SimParams
from meshscale.topology import Topology


@dataclass
class LinkUse:
    """How busy one resource (a directed link or a rank's reduce unit) was over the run."""

    name: str
    kind: str
    bytes: float
    capacity_bytes_per_s: float  # effective
    utilization: float  # share of the run's time the resource would need at full effective rate
    busy_s: float  # bytes / capacity: the time it must be busy at least


@dataclass
class SimResult:
    """The predicted time of one collective and its figures; ``links`` sorted busiest first."""

    collective: str
    algorithm: str
    ranks: list[int]
    nbytes: int
    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    links: list[LinkUse] = field(default_factory=list)
    transfers: int = 0
    channels: int = 1
    params_source: str = "defaults"
    detail: str = ""  # how the candidate was built (algorithm, channels, pipeline depth)

    @property
    def bottleneck(self) -> LinkUse | None:
        return self.links[0] if self.links else None



def flow_inputs(schedule: Schedule, topo: Topology) -> tuple[list, list, np.ndarray, np.ndarray, list[list[int]]]:
    """The engine's view of a schedule: device names, sizes, reduce flags and dependencies. Besides the data
    dependencies (`dependencies`), each rank works through its steps in order on each channel, as an executor
    does: its transfers of a step (sends and receives) wait for all its transfers of its previous step on that
    channel, and transfers on one connection (channel, src, dst) go one after another. That is what makes a
    tree's root send to its children in turn and pipelines a ring chunk by chunk. The first entries are the
    schedule's transfers in order; joins (src None) follow, one per (channel, rank, step) with several."""
    names = [topo.device(r) for r in schedule.ranks]  # raises a one-line TopologyError for unknown devices
    if len(set(names)) != len(names):
        raise MeshscaleError(f"device list {schedule.ranks} repeats a device; give each GPU once")
    data_deps = dependencies(schedule)
    flat = [t for step in schedule.steps for t in step.transfers]
    deps: list[list[int]] = []
    src: list = [names[t.src] for t in flat]
    dst: list = [names[t.dst] for t in flat]
    gate: dict[tuple[int, int], int] = {}  # (channel, rank) -> what its next step waits for
    last_on: dict[tuple[int, int, int], int] = {}
    joins: list[list[int]] = []
    i = 0
    for step in schedule.steps:
        mine: dict[tuple[int, int], list[int]] = {}
        for t in step.transfers:
            need = set(data_deps[i])
            for rank in (t.src, t.dst):
                if (t.channel, rank) in gate:
                    need.add(gate[(t.channel, rank)])
                mine.setdefault((t.channel, rank), []).append(i)
            conn = (t.channel, t.src, t.dst)
            if conn in last_on:
                need.add(last_on[conn])
            last_on[conn] = i
            deps.append(sorted(need))
            i += 1
        for who, members in mine.items():
            if len(members) == 1:
                gate[who] = members[0]
            else:
                gate[who] = len(flat) + len(joins)
                joins.append(members)
    deps.extend(joins)
    src += [None] * len(joins)
    dst += [None] * len(joins)
    nbytes = np.array([t.nbytes for t in flat] + [0] * len(joins), dtype=float)
    reduce = np.array([t.op == "reduce" for t in flat] + [False] * len(joins), dtype=bool)
    return src, dst, nbytes, reduce, deps


def simulate(schedule: Schedule, topo: Topology, params: SimParams | None = None,
             give_up_s: float = float("inf")) -> SimResult:
    """Predict the time of ``schedule`` on ``topo``; algbw and busbw use the schedule's nccl-tests size.
    Past ``give_up_s`` the simulation stops and the result has an infinite time."""
    params = params or SimParams()
    run = run_flows(topo, *flow_inputs(schedule, topo), params, give_up_s)
    return _result(schedule, run, params)


def estimates_s(schedule: Schedule, topo: Topology, params: SimParams | None = None) -> tuple[float, float]:
    """Two quick figures without simulating: (load bound, step estimate). The load bound is a true lower
    bound: the busiest resource moving all its bytes at full effective rate. The step estimate adds up, step
    by step, the slowest transfer of the step as if it ran alone (latency + bytes at its solo rate); it is no
    bound, but it ranks candidates well. `auto` skips on the first and orders by the larger of the two."""
    res = resources(topo, params or SimParams())
    names = [topo.device(r) for r in schedule.ranks]
    keys: dict[tuple[int, int, bool], int] = {}
    per_key_bytes: dict[int, float] = {}
    step_keys: list[list[tuple[int, int]]] = []
    for step in schedule.steps:
        mine = []
        for t in step.transfers:
            pair = (t.src, t.dst, t.op == "reduce")
            k = keys.get(pair)
            if k is None:
                k = keys[pair] = res.key(names[t.src], names[t.dst], pair[2])
            per_key_bytes[k] = per_key_bytes.get(k, 0.0) + t.nbytes
            mine.append((k, t.nbytes))
        step_keys.append(mine)
    if not per_key_bytes:
        return 0.0, 0.0
    used = list(per_key_bytes)
    rows = np.array([res.rows[k] for k in used])  # only the keys this schedule uses
    load_s = float(np.max((np.array([per_key_bytes[k] for k in used]) @ rows) / res.capacity))
    solo_rate = dict(zip(used, solo_rates(rows, res.capacity)))
    latency = res.latency
    estimate_s = sum(max(latency[k] + b / solo_rate[k] for k, b in mine) for mine in step_keys if mine)
    return load_s, float(estimate_s)


def _result(schedule: Schedule, run: FlowRun, params: SimParams) -> SimResult:
    time_s = run.time_s
    links = []
    for j in np.argsort(-run.resource_bytes / run.capacity_bytes_per_s):
        if run.resource_bytes[j] <= 0:
            break
        busy = float(run.resource_bytes[j] / run.capacity_bytes_per_s[j])
        links.append(LinkUse(run.resource_names[j], run.resource_kinds[j], float(run.resource_bytes[j]),
                             float(run.capacity_bytes_per_s[j]), busy / time_s if time_s > 0 else 0.0, busy))
    alg, bus = kind(schedule.collective).algbw_busbw(schedule.nbytes, time_s, schedule.n)
    return SimResult(schedule.collective, schedule.algorithm, list(schedule.ranks), schedule.nbytes, time_s, alg, bus,
                     links, sum(len(s.transfers) for s in schedule.steps), schedule.channels, params.source)
