"""Predicting one collective: by NCCL's cost model (`predict_collective`'s default, see `simulate.nccl`) or by
meshscale's schedules. The `auto` schedule simulates every algorithm that applies (with a few pipeline depths)
and takes the fastest. Latency-bound algorithms (one step, few hops: direct, binomial, halving-doubling) win
for small messages; bandwidth-optimal ones (rings over disjoint links, packed trees) for large ones."""
from __future__ import annotations

from dataclasses import dataclass, field

from meshscale.collectives.algorithms import ALGORITHMS, build
from meshscale.collectives.kinds import kind, schedulable
from meshscale.collectives.schedule import Schedule
from meshscale.errors import MeshscaleError
from meshscale.simulate.nccl_env import NcclEnv
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


def nccl_result(topology: Topology, collective: str, ranks: list[int], nbytes: int, params: SimParams | None = None,
                root: int = 0, *, nccl_version: str | None = None, nccl_algo: str | None = None,
                proto: str | None = None, nvls: bool | None = None, gpus_per_thread: int = 1,
                nccl_env: NcclEnv | None = None) -> SimResult:
    """NCCL's cost model (`nccl.predict`) as a `SimResult`, in NCCL's environment ``nccl_env``. Calibrated
    ``params`` scale its bandwidth by the measured link efficiency over the default one, for the link kind its
    rings use."""
    from meshscale.simulate import nccl
    from meshscale.simulate.params import DEFAULT_EFFICIENCY

    scale = 1.0
    if params is not None:
        link = nccl.analyse(topology, list(ranks), nccl_version).ring.link
        kind_name = "nvlink" if link == "nvlink" else "pcie"
        scale = params.efficiency_of(kind_name) / DEFAULT_EFFICIENCY[kind_name]
    p = nccl.predict(topology, collective, ranks, nbytes, nccl_version=nccl_version, nccl_algo=nccl_algo,
                           proto=proto, nvls=nvls, root=root, gpus_per_thread=gpus_per_thread,
                           bandwidth_scale=scale, env=nccl_env)
    alg, bus = kind(p.collective).algbw_busbw(nbytes, p.time_s, len(ranks))
    return SimResult(p.collective, f"nccl-{p.algo}", list(ranks), nbytes, p.time_s, alg, bus, channels=p.channels,
                     params_source=params.source if params else "defaults", detail=p.detail)


def predict_collective(topology: Topology, collective: str, ranks: list[int], nbytes: int, algorithm: str = "nccl",
                       params: SimParams | None = None, root: int = 0, *, nccl_version: str | None = None,
                       nccl_algo: str | None = None, proto: str | None = None, nvls: bool | None = None,
                       gpus_per_thread: int = 1, nccl_env: NcclEnv | None = None, **options) -> SimResult:
    """Predicted time and bandwidth of one collective. ``algorithm`` "nccl" (default): NCCL's cost model, what
    NCCL would pick and how long it takes (``nccl_version``, default 2.28; ``nccl_algo`` (ring, tree, nvls,
    nvls_tree, collnet_direct, collnet_chain, pat) and ``proto`` (LL, LL128, Simple) forced as NCCL_ALGO /
    NCCL_PROTO force them; ``nvls`` False as NCCL_NVLS_ENABLE=0; ``gpus_per_thread``: GPUs one host thread
    drives, as nccl-tests -g; ``nccl_env``: NCCL's environment, `nccl_env.parse_nccl_env`). "auto": the fastest
    meshscale schedule by flow simulation; any other name: that
    schedule. GPU-less topologies (CPU workers) fall back to "auto". Sizes as nccl-tests takes them
    (`cost.call_bytes`)."""
    from meshscale.simulate.cost import call_bytes

    nbytes = call_bytes(collective, nbytes, len(ranks))
    if algorithm == "nccl" and topology.device_kind == "gpu":
        return nccl_result(topology, collective, ranks, nbytes, params, root, nccl_version=nccl_version,
                           nccl_algo=nccl_algo, proto=proto, nvls=nvls, gpus_per_thread=gpus_per_thread,
                           nccl_env=nccl_env)
    algorithm = "auto" if algorithm == "nccl" else algorithm
    return choose_and_simulate(topology, collective, ranks, nbytes, algorithm, params, root, **options).result
