"""`meshscale bench pairs`: every pair of workers measured once, in O(N) rounds, to find the slow GPU, link or
node of a fleet; `--bisect` halves the group to find a bad worker the way operators do by hand.

Rounds: the circle method of a round-robin tournament (one rank fixed, the others rotate): N-1 rounds of N/2
disjoint pairs for even N (N rounds with one rank idle for odd N), so every pair meets exactly once and the
pairs of a round run at the same time. Each pair times one-way send/recv (`bench p2p`'s timing) and a 2-rank
all_reduce in its own subgroup (busbw = algbw for 2 ranks). Each figure stands beside the model's figure for
that pair (the topology's route bandwidth; for CPU workers an assumed shared-memory rate, so only the fleet
statistic judges them).

Outliers: a worker whose pairs' median is below `OUTLIER_SHARE` of the median of the pairs without it, and
the pairs below that share of the median pair. Half the fleet's typical figure is far outside run-to-run noise (a
few percent on GPUs, tens of percent on shared CPUs) and is what a link trained down (x8 instead of x16, one
NVLink down of two) or a throttled GPU costs; it is a judgment threshold, not a fitted parameter.

A test hook slows one worker: MESHSCALE_SLOW_RANK=RANK:SECONDS adds a sleep before each of that rank's
operations (read by the launching process, or by each rank under torchrun)."""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from meshscale.errors import MeshscaleError
from meshscale.execute import RankContext, launch
from meshscale.execute.world import World
from meshscale.results import Result, measured
from meshscale.topology.multinode import hostname

OUTLIER_SHARE = 0.5
SLOW_RANK_ENV = "MESHSCALE_SLOW_RANK"


@dataclass
class PairsSpec:
    """Messages of ``size_bytes``, ``iters`` timed after ``warmup_iters``, per pair and operation."""

    size_bytes: int = 4 << 20
    iters: int = 10
    warmup_iters: int = 2
    bisect: bool = False


@dataclass(frozen=True)
class SlowRank:
    """The test hook: ``rank`` sleeps ``seconds`` before each operation."""

    rank: int
    seconds: float


def slow_rank_from_env(environ: dict[str, str] | None = None) -> SlowRank | None:
    value = (os.environ if environ is None else environ).get(SLOW_RANK_ENV, "")
    if not value:
        return None
    rank, _, seconds = value.partition(":")
    try:
        hook = SlowRank(int(rank), float(seconds))
    except ValueError:
        raise MeshscaleError(f"{SLOW_RANK_ENV}={value!r}: use RANK:SECONDS, e.g. 2:0.01") from None
    if hook.rank < 0 or not 0 <= hook.seconds <= 10:
        raise MeshscaleError(f"{SLOW_RANK_ENV}={value!r}: the rank must be >= 0 and the delay 0..10 s")
    return hook


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs (a < b) that together hold every pair of 0..n-1 exactly once."""
    ranks = list(range(n)) + ([None] if n % 2 else [])
    m = len(ranks)
    rounds = []
    for _ in range(m - 1):
        pairs = [(ranks[i], ranks[m - 1 - i]) for i in range(m // 2)]
        rounds.append([tuple(sorted(p)) for p in pairs if None not in p])
        ranks = [ranks[0], ranks[-1], *ranks[1:-1]]  # rotate all but the first
    return rounds


@dataclass
class Outliers:
    """The workers and pairs the statistic flags, each with the figures that flag it."""

    workers: list[str]
    pairs: list[str]
    median_pair_bytes_per_s: float


def bench_pairs(spec: PairsSpec, world: World, timeout_s: float = 120.0) -> Result:
    """A "bench-pairs" Result: one row per pair (p2p and all_reduce bandwidth, the model's figure, the round),
    the outliers in meta, and with ``spec.bisect`` the halving's steps."""
    if world.size < 2:
        raise MeshscaleError(f"bench pairs needs at least 2 workers, got {world.size}; use --cpus 2 or more "
                             "(or more GPUs/nodes under torchrun)")
    if spec.size_bytes < 4 or spec.iters < 1 or spec.warmup_iters < 0:
        raise MeshscaleError("pairs need --size >= 4 bytes, --iters >= 1 and --warmup-iters >= 0")
    from meshscale.execute.world_topology import world_topology
    topology = world_topology(world)
    hook = slow_rank_from_env()
    rows, places, steps = launch(_rank, world.size, (spec, hook), backend=world.backend, timeout_s=timeout_s)[0]
    names = [_worker_name(r, places, world) for r in range(world.size)]
    for row in rows:
        row["a"], row["b"] = names[row["rank_a"]], names[row["rank_b"]]
        row["expected_bytes_per_s"] = _expected(topology, row["rank_a"], row["rank_b"])
        row["path"] = pair_path(topology, row["rank_a"], row["rank_b"])
    found = outliers(rows, names)
    return measured("bench-pairs", rows, spec=asdict(spec), workers=names, backend=world.backend,
                    world_size=world.size, outlier_workers=found.workers, outlier_pairs=found.pairs,
                    median_pair_bytes_per_s=found.median_pair_bytes_per_s, bisect=steps,
                    slow_rank_hook=asdict(hook) if hook else None)


def _worker_name(rank: int, places: list[tuple[str, int]], world: World) -> str:
    host, local = places[rank]
    device = f"gpu{local}" if world.backend == "nccl" else f"worker{rank}"
    several_hosts = len({h for h, _ in places}) > 1
    return f"{host}/{device}" if several_hosts else device


def _expected(topology, a: int, b: int) -> float | None:
    if topology is None:
        return None
    from meshscale.topology.queries import pair_bandwidth
    try:
        return pair_bandwidth(topology, a, b)
    except (MeshscaleError, IndexError, KeyError):
        return None


def pair_path(topology, a: int, b: int) -> str | None:
    """What joins workers ``a`` and ``b``: the `nvidia-smi topo -m` relation (NV18, PIX, SYS...), and across hosts
    the NICs the route leaves and enters by ("NET via n0/ib0, n1/ib0"), so a slow pair names its link or NIC."""
    if topology is None:
        return None
    from meshscale.topology.queries import relation, route
    try:
        kind = relation(topology, a, b)
        if kind != "NET":
            return kind
        hops = route(topology, topology.device(a), topology.device(b)).paths[0].nodes
        return "NET via " + ", ".join(n for n in hops if topology.nodes[n].kind == "nic")
    except (MeshscaleError, IndexError, KeyError):
        return None


def outliers(rows: list[dict[str, Any]], names: list[str]) -> Outliers:
    """Workers whose pairs' median is below `OUTLIER_SHARE` of the median of the pairs without them (a slow
    worker drags down all its pairs and none of the others'), and pairs below that share of the median pair.
    Figures are each pair's p2p bandwidth."""
    figure = {(r["rank_a"], r["rank_b"]): r["p2p_bytes_per_s"] for r in rows}
    typical_pair = statistics.median(figure.values())
    workers = []
    for w, name in enumerate(names):
        mine = [v for pair, v in figure.items() if w in pair]
        others = [v for pair, v in figure.items() if w not in pair]
        if mine and others and statistics.median(mine) < OUTLIER_SHARE * statistics.median(others):
            m, o = statistics.median(mine), statistics.median(others)
            nics = sorted({nic for r in rows if w in (r["rank_a"], r["rank_b"])
                           for nic in _nics(r.get("path"), w == r["rank_a"])})
            workers.append(f"{name} (median of its {len(mine)} pairs {m / 1e9:.3g} GB/s = {m / o:.0%} of the "
                           f"median of the {len(others)} pairs without it, {o / 1e9:.3g} GB/s"
                           + (f"; its NIC {', '.join(nics)}" if nics else "") + ")")
    path = {(r["rank_a"], r["rank_b"]): r.get("path") for r in rows}
    pairs = [f"{names[a]}-{names[b]}" + (f" over {path[a, b]}" if path.get((a, b)) else "")
             + f" ({v / 1e9:.3g} GB/s = {v / typical_pair:.0%} of the median pair)"
             for (a, b), v in sorted(figure.items()) if v < OUTLIER_SHARE * typical_pair]
    return Outliers(workers, pairs, typical_pair)


# ---- inside every rank -------------------------------------------------------------------------------------
def _nics(path: str | None, first: bool) -> list[str]:
    """The NIC on one end of a "NET via A, B" path: A for the pair's first worker, B for its second."""
    if not path or not path.startswith("NET via "):
        return []
    ends = path.removeprefix("NET via ").split(", ")
    return [ends[0] if first else ends[-1]]


def _rank(ctx: RankContext, spec: PairsSpec, hook: SlowRank | None):
    """(rows, [(host, local rank)] of every rank, bisection steps): all on every rank."""
    if hook is None and os.environ.get(SLOW_RANK_ENV):  # under torchrun each rank reads its own environment
        hook = slow_rank_from_env()
    delay = hook.seconds if hook and hook.rank == ctx.rank else 0.0
    send = torch.ones(spec.size_bytes // 4, dtype=torch.float32, device=ctx.device)
    recv = torch.empty_like(send)
    rows = []
    for number, pairs in enumerate(round_robin(ctx.world_size)):
        ctx.phase(f"pairs round {number + 1}")
        groups = _subgroups(pairs, ctx)
        mine = next(((a, b) for a, b in pairs if ctx.rank in (a, b)), None)
        ctx.barrier()
        if mine is None:
            continue
        a, b = mine
        p2p_s = _time_in_group(lambda: dist.send(send, b) if ctx.rank == a else dist.recv(recv, a), groups, ctx,
                               spec, delay)
        reduce_s = _time_in_group(lambda: dist.all_reduce(send, group=groups), groups, ctx, spec, delay)
        if ctx.rank == a:
            rows.append({"rank_a": a, "rank_b": b, "round": number + 1, "size_bytes": spec.size_bytes,
                         "p2p_bytes_per_s": spec.size_bytes / p2p_s,
                         "all_reduce_busbw_bytes_per_s": spec.size_bytes / reduce_s})  # 2(n-1)/n = 1 for 2 ranks
    steps = bisect(ctx, spec, send, delay) if spec.bisect else []
    ctx.phase("pairs gathering results")
    every: list = [None] * ctx.world_size
    dist.all_gather_object(every, (rows, (hostname(), ctx.local_rank)))
    merged = sorted((r for part, _ in every for r in part), key=lambda r: (r["rank_a"], r["rank_b"]))
    return merged, [place for _, place in every], steps


def _slowed(step: Callable[[], None], delay: float) -> Callable[[], None]:
    if not delay:
        return step

    def slow() -> None:
        time.sleep(delay)
        step()
    return slow


def _subgroups(pairs: list[tuple[int, int]], ctx: RankContext):
    """This rank's subgroup among ``pairs`` (every rank creates them all, as new_group requires), or None."""
    mine, _ = dist.new_subgroups_by_enumeration([list(p) for p in pairs], backend=ctx.backend)
    return mine


def _time_in_group(run: Callable[[], None], group, ctx: RankContext, spec: PairsSpec, delay: float) -> float:
    """Seconds per ``run`` (this rank's part of one operation within ``group``): each member's median
    iteration (an iteration preempted on a shared machine does not count), the slowest member's (an operation
    is over when its last rank is)."""
    step = _slowed(run, delay)
    for _ in range(spec.warmup_iters):
        step()
    dist.barrier(group=group)
    _sync(ctx)
    times = []
    for _ in range(spec.iters):
        start = time.perf_counter()
        step()
        _sync(ctx)
        times.append(time.perf_counter() - start)
    seconds = torch.tensor([statistics.median(times)], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=group)
    return float(seconds.item())


def _sync(ctx: RankContext) -> None:
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def bisect(ctx: RankContext, spec: PairsSpec, tensor: torch.Tensor, delay: float) -> list[dict[str, Any]]:
    """Halve the suspect group while one half's all_reduce is below `OUTLIER_SHARE` of the other's bus
    bandwidth; the halves run at once, a half of one worker with a worker already cleared. Returns the steps
    (the same list on every rank); the last step's suspects are the answer."""
    suspects, cleared, steps = list(range(ctx.world_size)), [], []
    while len(suspects) >= 2:
        left, right = suspects[:len(suspects) // 2], suspects[len(suspects) // 2:]
        spare = iter(cleared)
        groups = [h if len(h) >= 2 else h + [next(spare, None)] for h in (left, right)]
        step = {"suspects": suspects, "groups": [[r for r in g if r is not None] for g in groups]}
        if any(None in g for g in groups):
            steps.append({**step, "verdict": "stop: a half of one worker needs a cleared worker to pair with"})
            break
        ctx.phase(f"pairs bisect {suspects}")
        group = _subgroups([tuple(g) for g in groups], ctx)
        busbw = torch.zeros(2, dtype=torch.float64, device=ctx.device)
        for k, g in enumerate(groups):
            if ctx.rank in g:
                seconds = _time_in_group(lambda: dist.all_reduce(tensor, group=group), group, ctx, spec, delay)
                busbw[k] = spec.size_bytes / seconds * 2 * (len(g) - 1) / len(g)
        dist.all_reduce(busbw, op=dist.ReduceOp.MAX)
        values = busbw.tolist()
        slow = 0 if values[0] < values[1] else 1
        step["busbw_bytes_per_s"] = values
        if values[slow] >= OUTLIER_SHARE * values[1 - slow]:
            steps.append({**step, "verdict": "stop: neither half is slow"})
            break
        steps.append({**step, "verdict": f"{(left, right)[slow]} is slow"})
        cleared += (left, right)[1 - slow]
        suspects = (left, right)[slow]
    return steps
