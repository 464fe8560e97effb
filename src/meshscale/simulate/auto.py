"""Predicting one collective by meshscale's schedules (NCCL's model is `nccl.cost_model`). The `auto` schedule
simulates every algorithm that applies (with a few pipeline depths) and takes the fastest. Latency-bound algorithms (one step, few hops: direct, binomial, halving-doubling) win
for small messages; bandwidth-optimal ones (rings over disjoint links, packed trees) for large ones."""
from __future__ import annotations

from dataclasses import dataclass, field

from meshscale.collectives.algorithms import ALGORITHMS, build
from meshscale.collectives.kinds import schedulable
from meshscale.collectives.schedule import Schedule
from meshscale.errors import MeshscaleError
from meshscale.simulate.cost import Call, Prediction
from meshscale.simulate.params import SimParams
from meshscale.simulate.sim import SimResult, estimates_s, simulate
from meshscale.topology import Topology
from meshscale.topology.shared_routes import share_routes

PIECES = (1, 4, 16)  # pipeline depths tried (pieces per block and channel)
MIN_PIECE_BYTES = 256 << 10  # deeper pipelines only while each piece stays this big: below, latency dominates
MAX_TRANSFERS = 20_000  # deeper pipelines whose schedules would take long to simulate are not tried


@dataclass
class Choice:
    """The chosen schedule, its prediction, and the predictions of the candidates simulated (fastest first;
    candidates whose lower bound could not beat the best so far are not simulated)."""

    schedule: Schedule
    result: SimResult
    candidates: list[SimResult] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # algorithm -> why it does not apply
    pruned: list[str] = field(default_factory=list)  # candidates whose lower bound could not beat the best


def _pieces_for(nbytes: int, n: int) -> list[int]:
    return [p for p in PIECES if p == 1 or nbytes / (n * p) >= MIN_PIECE_BYTES]


def choose(topology: Topology, collective: str, ranks: list[int], nbytes: int, params: SimParams | None = None,
           root: int = 0, algorithms: list[str] | None = None) -> Choice:
    """Simulate the candidates for ``collective`` of ``nbytes`` over ``ranks`` (device indices) and return the
    fastest. ``algorithms`` limits the candidates (default: every registered one that does the collective)."""
    collective = schedulable(collective).name
    params = params or SimParams()
    share_routes(topology, ranks)  # candidates route every pair of ranks: one max-flow per kind of pair
    names = algorithms or [a for a, algo in ALGORITHMS.items() if collective in algo.collectives]
    skipped: dict[str, str] = {}
    results: list[tuple[SimResult, Schedule]] = []
    load_of: dict[str, float] = {}  # the load bound does not depend on the pipeline depth
    pruned: list[str] = []
    best = float("inf")
    for pieces in _pieces_for(nbytes, len(ranks)):  # shallow pipelines first: they set the bar to beat
        built = []
        for name in names:
            if name in skipped:
                continue
            if load_of.get(name, 0.0) >= best:
                pruned.append(f"{name}, {pieces} piece(s)")
                continue
            try:
                schedule = build(name, collective, ranks, nbytes, topology, root=root, pieces=pieces)
            except MeshscaleError as exc:
                skipped[name] = str(exc)
                continue
            except Exception as exc:  # a bug in one candidate must not take `auto` down: report it, go on
                skipped[name] = f"{name} failed to build ({type(exc).__name__}: {exc}); please report it"
                continue
            if pieces > 1 and sum(len(s.transfers) for s in schedule.steps) > MAX_TRANSFERS:
                continue
            load_s, estimate_s = estimates_s(schedule, topology, params)
            load_of[name] = load_s
            built.append((max(load_s, estimate_s), load_s, name, schedule))
        # most promising first; a candidate whose load bound cannot beat the best is skipped, one that falls
        # behind it while simulating is stopped there
        for _, load_s, name, schedule in sorted(built, key=lambda b: b[0]):
            if load_s >= best:
                pruned.append(f"{name}, {schedule.channels} channel(s), {pieces} piece(s)")
                continue
            result = simulate(schedule, topology, params, give_up_s=best)
            if result.time_s == float("inf"):
                pruned.append(f"{name}, {schedule.channels} channel(s), {pieces} piece(s)")
                continue
            result.detail = f"{name}, {schedule.channels} channel(s), {pieces} piece(s)"
            results.append((result, schedule))
            best = min(best, result.time_s)
    if not results:
        first = next(iter(skipped.values()), "no algorithm does it")
        raise MeshscaleError(f"no algorithm applies to {collective} over {list(ranks)} with {nbytes} bytes: {first}")
    results.sort(key=lambda rs: rs[0].time_s)
    return Choice(results[0][1], results[0][0], [r for r, _ in results], skipped, pruned)


def choose_and_simulate(topology: Topology, collective: str, ranks: list[int], nbytes: int,
                        algorithm: str = "auto", params: SimParams | None = None, root: int = 0, **options) -> Choice:
    """The schedule of ``algorithm`` with its prediction; "auto": the fastest candidate (`choose`)."""
    if algorithm == "auto":
        return choose(topology, collective, ranks, nbytes, params, root)
    schedule = build(algorithm, collective, ranks, nbytes, topology, root=root, **options)
    result = simulate(schedule, topology, params)
    result.detail = f"{algorithm}, {schedule.channels} channel(s)"
    return Choice(schedule, result, [result])


@dataclass(frozen=True)
class FlowCostModel:
    """meshscale's schedule (``algorithm``: "auto" for the fastest, or a schedule's name) timed by the flow
    simulator, behind the cost interface (`simulate.cost`)."""

    algorithm: str = "auto"
    params: SimParams | None = None

    def predict(self, call: Call, fabric: Topology) -> Prediction:
        r = choose_and_simulate(fabric, call.collective, list(call.ranks), call.sized_bytes, self.algorithm,
                                self.params, call.root).result
        return Prediction(call, r.time_s, r.algbw_bytes_per_s, r.busbw_bytes_per_s, r.detail or r.algorithm, "flow")
