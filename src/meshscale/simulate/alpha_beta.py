"""The alpha-beta cost model as a `CostModel`: a ring over the fabric's widest order, alpha the slowest hop's
latency plus a per-message software cost, beta the ring's bottleneck rate (Thakur, Rabenseifner and Gropp,
"Optimization of Collective Communication Operations in MPICH", 2005: ring all-reduce 2(p-1) alpha +
2(p-1)/p n beta, ring all-gather and reduce-scatter (p-1) alpha + (p-1)/p n beta).

It knows nothing of NCCL's choices: a baseline independent of NCCL's tuning model and of meshscale's
schedules, priced on the same `Topology`.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from meshscale.collectives.kinds import kind
from meshscale.errors import MeshscaleError
from meshscale.simulate.cost import Call, Prediction
from meshscale.simulate.params import SimParams
from meshscale.topology import Topology, route

# steps of a ring collective in units of (alpha, n beta / p): all-reduce is a reduce-scatter then an all-gather
RING_STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}


@dataclass(frozen=True)
class AlphaBetaCalibration:
    """What the alpha-beta model takes from a calibration: each link kind's achieved share of its line rate and
    the per-message software latency (a `SimParams` fitted by `calibrate`, or its defaults)."""

    params: SimParams = field(default_factory=SimParams)

    def link_bytes_per_s(self, topo: Topology, index: int) -> float:
        link = topo.links[index]
        return link.bandwidth_bytes_per_s * self.params.efficiency_of(link.kind)

    @property
    def message_latency_s(self) -> float:
        return self.params.message_latency_of("default")


@dataclass(frozen=True)
class AlphaBetaCostModel:
    """Ring collectives by alpha-beta on the widest ring order of the ranks (all orders up to 8 ranks, else
    greedy), one ring per NVLink when the ring is all NVLink (NCCL runs a ring per link)."""

    calibration: AlphaBetaCalibration = field(default_factory=AlphaBetaCalibration)

    @classmethod
    def from_params(cls, params: SimParams | None) -> AlphaBetaCostModel:
        """The model under a link calibration (`calibrate`'s `SimParams`), or its defaults."""
        return cls(AlphaBetaCalibration(params or SimParams()))

    def predict(self, call: Call, fabric: Topology) -> Prediction:
        steps = RING_STEPS.get(call.collective)
        if steps is None:
            raise MeshscaleError(f"the alpha-beta model prices ring collectives ({', '.join(RING_STEPS)}), "
                                 f"not {call.collective}; use NCCL's model")
        nbytes = call.sized_bytes
        time_s = ring_time_s(fabric, list(call.ranks), nbytes, steps, self.calibration)
        alg, bus = kind(call.collective).algbw_busbw(nbytes, time_s, len(call.ranks))
        return Prediction(call, time_s, alg, bus, "ring", "alpha-beta", (), 1)


def _edge_bandwidth(topo: Topology, u: int, v: int, calibration: AlphaBetaCalibration) -> float:
    """Effective bytes/s from device u to v: per path of the route, its rate capped by every link's line rate
    x that link kind's efficiency (a PCIe path across QPI runs at QPI's achieved rate); paths add up."""
    r = route(topo, topo.device(u), topo.device(v))
    return sum(min([path.bandwidth_bytes_per_s] + [calibration.link_bytes_per_s(topo, i) for i, _ in path.directed_links])
               for path in r.paths)


def ring_time_s(topo: Topology, ranks: list[int], nbytes: float, steps: int,
                calibration: AlphaBetaCalibration) -> float:
    """``steps`` ring passes of (p-1) hops each over ``ranks``: steps (p-1) alpha + steps (p-1)/p n beta."""
    p = len(ranks)
    if p < 2:
        return 0.0
    edge = {(u, v): _edge_bandwidth(topo, u, v, calibration) for u in ranks for v in ranks if u != v}
    first, rest = ranks[0], ranks[1:]
    if p <= 8:
        orders = [[first, *perm] for perm in itertools.permutations(rest)]
    else:
        order = [first]
        while len(order) < p:
            order.append(max((r for r in ranks if r not in order), key=lambda r: edge[(order[-1], r)]))
        orders = [order]
    best, bandwidth = orders[0], 0.0
    for order in orders:
        b = min(edge[(u, v)] for u, v in zip(order, order[1:] + order[:1]))
        if b > bandwidth:
            best, bandwidth = order, b
    hops = list(zip(best, best[1:] + best[:1]))
    if all(any(l.kind == "nvlink" for l in topo.links_between(topo.device(u), topo.device(v))) for u, v in hops):
        # an all-NVLink ring: NCCL runs one ring per link (DGX-1 P100: 4 rings, "over 60 GB/s"), bounded by
        # the NVLinks each GPU has to the other ranks
        names = {topo.device(r) for r in ranks}
        bandwidth = max(bandwidth, min(sum(l.bandwidth_bytes_per_s * calibration.params.efficiency_of("nvlink")
                                           for l in topo.links_of(n, "nvlink") if l.other(n) in names) for n in names))
    alpha = max(route(topo, topo.device(u), topo.device(v)).latency_s for u, v in hops) + calibration.message_latency_s
    return steps * (p - 1) * alpha + steps * (p - 1) / p * nbytes / bandwidth
