"""Every algorithm x collective, executed over Gloo with exact integers, equals the native collective.

One launch per rank count runs all the schedules of that count (process start-up is the expensive part)."""
import pytest
import torch
import torch.distributed as dist

from meshscale.collectives.algorithms import ALGORITHMS, build
from meshscale.collectives.schedule import COLLECTIVES, ROOTED
from meshscale.errors import MeshscaleError
from meshscale.execute import launch
from meshscale.execute.schedule_runner import run_schedule, schedule_op
from meshscale.topology.discover import cpu_topology

ELEMS_PER_RANK = 24  # int32 elements per rank segment: splits into pieces and channels


def _native(collective, inp, n, root, rank):
    """The library's answer for this rank (None where the rank has no output)."""
    if collective == "all_reduce":
        out = inp.clone()
        dist.all_reduce(out)
    elif collective == "reduce":
        out = inp.clone()
        dist.reduce(out, root)
        out = out if rank == root else None
    elif collective == "broadcast":
        out = inp.clone() if rank == root else torch.zeros_like(inp)
        dist.broadcast(out, root)
    elif collective == "all_gather":
        parts = [torch.zeros_like(inp) for _ in range(n)]
        dist.all_gather(parts, inp)
        out = torch.cat(parts)
    elif collective == "gather":
        parts = [torch.zeros_like(inp) for _ in range(n)] if rank == root else None
        dist.gather(inp, parts, root)
        out = torch.cat(parts) if rank == root else None
    elif collective == "reduce_scatter":
        out = torch.zeros(inp.numel() // n, dtype=inp.dtype)
        dist.reduce_scatter(out, list(inp.chunk(n)))
    elif collective == "scatter":
        out = torch.zeros(inp.numel() // n, dtype=inp.dtype)
        dist.scatter(out, list(inp.chunk(n)) if rank == root else None, root)
    else:
        out = torch.zeros_like(inp)
        dist.all_to_all_single(out, inp)
    return out


def _sizes(collective, n):
    """(nbytes, input elements, output elements) of the collective for the test size."""
    seg = ELEMS_PER_RANK
    full = n * seg
    return {"all_reduce": (4 * full, full, full), "reduce": (4 * full, full, full), "broadcast": (4 * full, full, full),
            "all_gather": (4 * full, seg, full), "gather": (4 * full, seg, full),
            "reduce_scatter": (4 * full, full, seg), "scatter": (4 * full, full, seg),
            "all_to_all": (4 * full, full, full)}[collective]


def _check_all(ctx, cases):
    """Run every (algorithm, collective, options) case on this rank; return the failures."""
    n, rank = ctx.world_size, ctx.rank
    topo = cpu_topology(n)
    bad, ran = [], 0
    for algorithm, collective, options in cases:
        nbytes, n_in, n_out = _sizes(collective, n)
        root = n - 1 if collective in ROOTED else 0
        try:
            schedule = build(algorithm, collective, list(range(n)), nbytes, topo, root=root, **options)
        except MeshscaleError:
            continue  # not applicable here (e.g. hierarchical on one host); the same on every rank
        ctx.phase(f"{algorithm} {collective} {options}")
        inp = torch.arange(n_in, dtype=torch.int32) * (rank + 1) + 1000 * rank
        out = torch.full((n_out,), -7, dtype=torch.int32)
        run_schedule(schedule, inp, out)
        want = _native(collective, inp, n, root, rank)
        ran += 1
        if want is not None and not torch.equal(out, want):
            bad.append(f"{algorithm} {collective} {options} rank {rank}")
    return ran, bad


def _cases():
    return [(a, c, opts) for a in ALGORITHMS for c in COLLECTIVES if c in ALGORITHMS[a].collectives
            for opts in ({"pieces": 2},)] + [("ring", c, {"bidirectional": True}) for c in COLLECTIVES]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_every_schedule_equals_the_native_collective(n):
    results = launch(_check_all, n, (_cases(),), timeout_s=60, deadline_s=120)
    ran = [r[0] for r in results]
    assert len(set(ran)) == 1 and ran[0] >= 40, ran  # every rank ran the same, and most cases apply
    failures = [f for _, bad in results for f in bad]
    assert not failures, failures


def _op_matches(ctx):
    n = ctx.world_size
    op = schedule_op("all_reduce", list(range(n)), 4 * 64, "ring", cpu_topology(n))
    outs = []
    for k in range(2):  # the plan and buffers are reused: a second call must not see the first's data
        inp = torch.arange(64, dtype=torch.int32) + k * ctx.rank
        out = torch.zeros(64, dtype=torch.int32)
        op(inp, out)
        want = inp.clone()
        dist.all_reduce(want)
        outs.append(torch.equal(out, want))
    return all(outs), op.schedule.algorithm


def test_schedule_op_is_reusable():
    assert launch(_op_matches, 3, timeout_s=60) == [(True, "ring")] * 3
