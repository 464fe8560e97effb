"""Flow-level, event-driven simulation of transfers on a topology.

Each transfer is a flow from one device to another along its route (`meshscale.topology.route`), spread over
the route's paths in proportion to their bandwidth. Flows that are in flight at the same time share every
directed link max-min fairly (progressive filling); a reduction also uses its receiver's reduce unit, a
resource of its own. A flow becomes ready when the flows it depends on have finished, then waits its latency
(route hops + per-message overhead) and moves its bytes. Between two events (a flow becomes ready or one
finishes) rates are constant, so time jumps from event to event.

Speed: flows of one route key (route, reduce or not) always get the same rate, so the rate computation works
on the distinct keys of the active set, and its answer is memoized on that set (a pipelined schedule repeats
the same few sets thousands of times).
"""
from __future__ import annotations

import heapq
import re
from dataclasses import dataclass

import numpy as np

from meshscale.errors import MeshscaleError

from meshscale.simulate.params import (DEFAULT_CPU_REDUCE_BYTES_PER_S, DEFAULT_GPU_REDUCE_BYTES_PER_S,
                                       INTEL_P2P_OVERHEAD, SimParams)
from meshscale.topology import Topology, route

# A flow with less than this share of its bytes left finishes at the current event: flows of parallel channels
# that would end a hair apart end together, which saves events and rate computations (error <= 0.5%).
FINISH_SLACK = 5e-3
MEMO_LIMIT = 200_000  # rate computations remembered per topology and parameters
GIVE_UP_MARGIN = 1e-6  # a run stops early only when its lower bound passes the time to beat by more than rounding


@dataclass
class FlowRun:
    """What `run_flows` found: per-transfer start (data begins to move) and finish times, and per-resource use."""

    start_s: np.ndarray
    finish_s: np.ndarray
    time_s: float
    resource_names: list[str]  # "gpu0->gpu1 (NVLink1 x1)" per directed link, then "reduce@gpu0" per device
    resource_kinds: list[str]
    capacity_bytes_per_s: np.ndarray  # effective (after efficiency)
    line_rate_bytes_per_s: np.ndarray
    resource_bytes: np.ndarray  # bytes carried over the whole run


class _Resources:
    """Directed links and reduce units of a topology, with effective capacities and per-key weights."""

    def __init__(self, topo: Topology, params: SimParams):
        self.topo, self.params = topo, params
        names, kinds, line = [], [], []
        for link in topo.links:
            for u, v in ((link.a, link.b), (link.b, link.a)):
                names.append(f"{u}->{v} ({link.label})")
                kinds.append(link.kind)
                line.append(link.bandwidth_bytes_per_s)
        self.reduce_index = {}
        for dev in topo.devices():
            self.reduce_index[dev] = len(names)
            names.append(f"reduce@{dev}")
            kinds.append("reduce")
            line.append(_reduce_rate(topo, dev, params))
        self.names, self.kinds = names, kinds
        self.line = np.array(line, dtype=float)
        eff = np.array([1.0 if k == "reduce" else params.efficiency_of(k) for k in kinds])
        self.capacity = self.line * eff
        self.keys: dict[tuple[str, str, bool], int] = {}
        self.rows: list[np.ndarray] = []
        self.latency: list[float] = []
        self.rate_memo: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}  # see _rates

    def key(self, src: str, dst: str, reduce: bool) -> int:
        """Index of the (src, dst, reduce) key, building its weight row (load per unit of flow rate)."""
        k = (src, dst, reduce)
        if k in self.keys:
            return self.keys[k]
        r = route(self.topo, src, dst)
        row = np.zeros(len(self.names))
        for path in r.paths:
            share = path.bandwidth_bytes_per_s / r.bandwidth_bytes_per_s * p2p_overhead(self.topo, path.nodes)
            # parallel links of one hop split the path's flow by their bandwidth
            for u, v in zip(path.nodes, path.nodes[1:]):
                hop = [(i, d) for i, d in path.directed_links if {self.topo.links[i].a, self.topo.links[i].b} == {u, v}]
                total = sum(self.topo.links[i].bandwidth_bytes_per_s for i, _ in hop)
                for i, d in hop:
                    row[2 * i + d] += share * self.topo.links[i].bandwidth_bytes_per_s / total
        if reduce:
            row[self.reduce_index[dst]] += 1.0
        slowest = min((self.topo.links[i] for p in r.paths for i, _ in p.directed_links),
                      key=lambda link: link.bandwidth_bytes_per_s)
        self.latency.append(r.latency_s * self.params.hop_latency_scale + self.params.message_latency_of(slowest.kind))
        self.keys[k] = len(self.rows)
        self.rows.append(row)
        return self.keys[k]


def p2p_overhead(topo: Topology, nodes: tuple[str, ...]) -> float:
    """Link load per byte of a peer-to-peer path: through an Intel CPU (root complex, and QPI/UPI to the other
    socket) GPU P2P traffic moves in 64-byte TLPs, which costs 1.2x the bandwidth (NCCL's INTEL_P2P_OVERHEAD,
    src/graph/topo.h)."""
    intel = any(topo.nodes[n].kind == "cpu" and re.search(r"intel|xeon", str(topo.nodes[n].attrs.get("model", "")),
                                                          re.IGNORECASE) for n in nodes[1:-1])
    return INTEL_P2P_OVERHEAD if intel else 1.0


def _reduce_rate(topo: Topology, dev: str, params: SimParams) -> float:
    if params.reduce_bytes_per_s:
        return params.reduce_bytes_per_s
    node = topo.nodes[dev]
    if node.kind == "gpu":
        mem = node.attrs.get("memory_bandwidth_bytes_per_s")
        return float(mem) / 3 if mem else DEFAULT_GPU_REDUCE_BYTES_PER_S
    return DEFAULT_CPU_REDUCE_BYTES_PER_S


def max_min_rates(weights: np.ndarray, counts: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rate per flow for ``counts[k]`` flows of each key ``k`` whose unit load on the resources
    is ``weights[k]`` (progressive filling: raise all unfrozen rates together until a resource saturates)."""
    cols = np.flatnonzero(weights.any(axis=0))  # only the resources these keys touch
    load = weights[:, cols] * counts[:, None]
    touched_by = np.ascontiguousarray((load > 0).T)  # resource -> keys (rows: picking saturated ones is cheap)
    cap = capacity[cols].astype(float)
    full = 1e-9 * cap
    left = cap.copy()
    rate = np.zeros(len(counts))
    free = np.ones(len(counts))  # 1.0 for keys still rising
    ratio = np.empty(len(cols))
    for _ in range(len(counts) + 1):  # every pass freezes at least one key; a bound, not a hope, for odd input
        rising = free > 0
        if not rising.any():
            break
        demand = free @ load
        used = demand > 0
        if not used.any():  # keys that use no resource (cannot happen with real routes): give them infinity
            rate[rising] = np.inf
            break
        ratio.fill(np.inf)
        np.divide(left, demand, out=ratio, where=used)
        step = ratio.min()
        if not np.isfinite(step):
            raise MeshscaleError("simulation: a link capacity is not a finite number; check the system's bandwidths")
        rate[rising] += step
        left -= step * demand
        free[touched_by[used & (left <= full)].any(axis=0)] = 0.0
    return rate


def resources(topo: Topology, params: SimParams) -> "_Resources":
    """The directed links and reduce units of ``topo`` with their effective capacities and the weight rows of
    the keys seen so far; memoized beside the topology's routes (same lifetime, same read-only topology)."""
    memo = ("meshscale.simulate.resources", repr(params))
    if memo not in topo.route_cache:
        topo.route_cache[memo] = _Resources(topo, params)
    return topo.route_cache[memo]


def run_flows(topo: Topology, src: list[str | None], dst: list[str | None], nbytes: np.ndarray, reduce: np.ndarray,
              deps: list[list[int]], params: SimParams | None = None, give_up_s: float = np.inf) -> FlowRun:
    """Simulate transfers ``i`` from device ``src[i]`` to ``dst[i]`` of ``nbytes[i]`` bytes (``reduce[i]``: the
    receiver reduces them), each starting after all transfers in ``deps[i]`` have finished. A ``src[i]`` of
    None makes ``i`` a join: it moves nothing and finishes the moment its dependencies have (it keeps the
    number of dependency edges small when many transfers wait for many others). A run that passes
    ``give_up_s`` of simulated time stops there and reports an infinite time (a candidate that cannot win)."""
    res = resources(topo, params or SimParams())
    key, rows, latency, nbytes = _flow_inputs(res, src, dst, nbytes, reduce)
    flows = _Schedule(nbytes, latency, deps)
    # no transfer goes faster than alone, so the longest chain of dependent ones at that pace is a lower bound of
    # the end: a run that cannot beat ``give_up_s`` even so is not simulated
    if give_up_s < np.inf and len(rows):
        with np.errstate(divide="ignore", invalid="ignore"):
            alone_s = np.where(nbytes > 0, (1 - FINISH_SLACK) * nbytes / solo_rates(rows, res.capacity)[key], 0.0)
        if critical_path_s(latency + alone_s, deps, flows.successors) > give_up_s * (1 + GIVE_UP_MARGIN):
            return FlowRun(flows.start, flows.finish, np.inf, res.names, res.kinds, res.capacity, res.line,
                           np.zeros(len(res.names)))
    return _events(res, key, rows, flows, give_up_s)


def _flow_inputs(res: "_Resources", src: list[str | None], dst: list[str | None], nbytes: np.ndarray,
                 reduce: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each transfer's route key (-1 for a join), the keys' weight rows, each transfer's latency and bytes
    (0 for a join); refused when a number would keep the event loop from ever reaching an end."""
    n = len(src)
    nbytes = np.asarray(nbytes, dtype=float)
    key = np.array([-1 if s is None else res.key(s, d, bool(r)) for s, d, r in zip(src, dst, reduce)], dtype=np.int64)
    rows = np.array(res.rows) if res.rows else np.zeros((0, len(res.names)))
    latency = np.where(key >= 0, np.array(res.latency + [0.0])[key], 0.0) if n else np.zeros(0)
    nbytes = np.where(key >= 0, nbytes, 0.0)
    if not (np.isfinite(nbytes).all() and np.isfinite(latency).all() and np.isfinite(res.capacity).all()
            and (res.capacity >= 0).all() and (nbytes >= 0).all() and (latency >= 0).all()):
        raise MeshscaleError("simulation: a size, bandwidth or latency is not a finite non-negative number; "
                             "check the system file and the sizes")
    return key, rows, latency, nbytes


class _Schedule:
    """Which transfers wait on which, when each became ready, started and finished."""

    def __init__(self, nbytes: np.ndarray, latency: np.ndarray, deps: list[list[int]]):
        n = len(nbytes)
        self.nbytes, self.latency = nbytes, latency
        self.waiting = np.array([len(d) for d in deps], dtype=np.int64)
        self.successors: list[list[int]] = [[] for _ in range(n)]
        for i, ds in enumerate(deps):
            for d in ds:
                self.successors[d].append(i)
        self.start = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.done = 0
        self.ready: list[tuple[float, int]] = [(float(latency[i]), i) for i in range(n) if self.waiting[i] == 0]
        heapq.heapify(self.ready)

    def due(self, limit: float) -> list[int]:
        """The transfers whose latency has passed by ``limit``, taken off the ready queue."""
        starting: list[int] = []
        while self.ready and self.ready[0][0] <= limit:
            starting.append(heapq.heappop(self.ready)[1])
        return starting

    def release(self, starting: list[int], finished: list[int], now: float) -> list[int]:
        """Start ``starting`` and finish ``finished`` at ``now``; joins and empty transfers finish at once and may
        release others. Returns the transfers that start moving bytes."""
        moving: list[int] = []
        while starting or finished:
            for i in starting:
                self.start[i] = now
                (moving if self.nbytes[i] > 0 else finished).append(i)
            starting = []
            for i in finished:
                self.finish[i] = now
                self.done += 1
                for s in self.successors[i]:
                    self.waiting[s] -= 1
                    if self.waiting[s] == 0:
                        if self.latency[s] <= 0:
                            starting.append(s)
                        else:
                            heapq.heappush(self.ready, (now + float(self.latency[s]), s))
            finished = []
        return moving


def _events(res: "_Resources", key: np.ndarray, rows: np.ndarray, flows: _Schedule, give_up_s: float) -> FlowRun:
    """Jump from event to event (a transfer becomes ready or one finishes), rates constant in between."""
    nbytes = flows.nbytes
    # work each resource must still do (bytes x its load per byte), less each transfer's finishing slack: no
    # resource moves more than its capacity, so `now` + the largest (work - done) / capacity is a lower bound of
    # the end; once it passes ``give_up_s`` the run can only end past it, and stops there
    capacity = np.where(res.capacity > 0, res.capacity, np.inf)
    work = np.bincount(key[key >= 0], weights=(1 - FINISH_SLACK) * nbytes[key >= 0], minlength=len(rows)) @ rows \
        if give_up_s < np.inf and len(rows) else None
    act_ids = np.zeros(0, dtype=np.int64)
    act_left = np.zeros(0)
    act_rate = np.zeros(0)
    act_load = np.zeros(len(res.names))
    counts = np.zeros(len(rows), dtype=np.int64)  # active flows per key
    used_bytes = np.zeros(len(res.names))
    now = 0.0
    while flows.done < len(nbytes):
        t_ready = flows.ready[0][0] if flows.ready else np.inf
        t_finish = now + float(np.min(act_left / act_rate)) if len(act_ids) else np.inf
        t_next = min(t_ready, t_finish)
        if t_next == np.inf:
            raise RuntimeError("simulation stalled: a transfer depends on one that never finishes (a cycle)")
        dt = t_next - now
        if len(act_ids) and dt > 0:
            act_left -= act_rate * dt
            used_bytes += act_load * dt
        now = t_next
        if now > give_up_s or (work is not None and now + float(np.max((work - used_bytes) / capacity))
                               > give_up_s * (1 + GIVE_UP_MARGIN)):
            return FlowRun(flows.start, flows.finish, np.inf, res.names, res.kinds, res.capacity, res.line, used_bytes)
        starting = flows.due(now + 1e-12 * max(now, 1e-9))
        finished: list[int] = []
        changed = False
        if len(act_ids):
            over = act_left <= np.maximum(FINISH_SLACK * nbytes[act_ids], act_rate * 1e-12 * max(now, 1e-9))
            if over.any():
                gone = act_ids[over]
                finished.extend(gone.tolist())
                np.subtract.at(counts, key[gone], 1)
                act_ids, act_left = act_ids[~over], act_left[~over]
                changed = True
        moving = flows.release(starting, finished, now)
        if moving:
            new = np.array(moving, dtype=np.int64)
            act_ids = np.concatenate([act_ids, new])
            act_left = np.concatenate([act_left, nbytes[new]])
            np.add.at(counts, key[new], 1)
            changed = True
        if changed:
            rate_of_key, act_load = _rates(counts, rows, res.capacity, res.rate_memo)
            act_rate = rate_of_key[key[act_ids]]
    return FlowRun(flows.start, flows.finish, now, res.names, res.kinds, res.capacity, res.line, used_bytes)


def solo_rates(rows: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Rate of one flow of each key (weight row) alone on the resources: its tightest capacity / load."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.min(np.where(rows > 0, capacity / np.where(rows > 0, rows, 1.0), np.inf), axis=1)


def critical_path_s(duration_s: np.ndarray, deps: list[list[int]], successors: list[list[int]]) -> float:
    """The end of the longest chain of dependent transfers, transfer ``i`` taking ``duration_s[i]`` once all of
    ``deps[i]`` have finished (``successors``: the same edges the other way)."""
    begin = [0.0] * len(deps)
    end = duration_s.tolist()
    waiting = [len(d) for d in deps]
    todo = [i for i, w in enumerate(waiting) if w == 0]
    while todo:
        i = todo.pop()
        end[i] += begin[i]
        for s in successors[i]:
            begin[s] = max(begin[s], end[i])
            waiting[s] -= 1
            if waiting[s] == 0:
                todo.append(s)
    return max(end, default=0.0)


def _rates(counts: np.ndarray, rows: np.ndarray, capacity: np.ndarray, memo: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per-key rates for ``counts`` active flows of each key, and the load per resource. Memoized on the
    active keys and their counts, across runs on one topology (candidates of `auto` share most states)."""
    live = np.flatnonzero(counts)
    tag = live.tobytes() + counts[live].tobytes()
    hit = memo.get(tag)
    if hit is None:
        rate = max_min_rates(rows[live], counts[live].astype(float), capacity) if len(live) else np.zeros(0)
        hit = (rate, (rate * counts[live]) @ rows[live] if len(live) else np.zeros(len(capacity)))
        if len(memo) < MEMO_LIMIT:
            memo[tag] = hit
    rate_of_key = np.zeros(len(counts))
    rate_of_key[live] = hit[0]
    return rate_of_key, hit[1]
