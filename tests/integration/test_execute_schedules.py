"""Every algorithm x collective, executed over Gloo with exact integers, equals the native collective.

One launch per rank count runs all the schedules of that count (process start-up is the expensive part)."""
import pytest
import torch
import torch.distributed as dist

from meshscale.collectives.algorithms import ALGORITHMS, build
from meshscale.collectives.kinds import SCHEDULABLE as COLLECTIVES
from meshscale.collectives.kinds import kind
from meshscale.errors import MeshscaleError
from meshscale.execute import launch
from meshscale.execute.schedule_runner import run_schedule, schedule_op
from meshscale.topology.discover import cpu_topology

ELEMS_PER_RANK = 24  # int32 elements per rank segment: splits into pieces and channels


def _native(collective, inp, n, root, rank):
    """The library's answer for this rank (None where the rank has no output); tensors on inp's device."""
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
        out = torch.zeros(inp.numel() // n, dtype=inp.dtype, device=inp.device)
        dist.reduce_scatter(out, list(inp.chunk(n)))
    elif collective == "scatter":
        out = torch.zeros(inp.numel() // n, dtype=inp.dtype, device=inp.device)
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


def _check_all(ctx, cases, with_op=False):
    """Run every (algorithm, collective, options) case on this rank; return the count run and the failures.
    ``with_op``: also check that `schedule_op` can be called twice on fresh data (plan and buffers reused)."""
    n, rank, dev = ctx.world_size, ctx.rank, ctx.device
    topo = cpu_topology(n)
    bad, ran = [], 0
    for algorithm, collective, options in cases:
        nbytes, n_in, n_out = _sizes(collective, n)
        root = n - 1 if kind(collective).rooted else 0
        try:
            schedule = build(algorithm, collective, list(range(n)), nbytes, topo, root=root, **options)
        except MeshscaleError:
            continue  # not applicable here (e.g. hierarchical on one host); the same on every rank
        ctx.phase(f"{algorithm} {collective} {options}")
        inp = torch.arange(n_in, dtype=torch.int32, device=dev) * (rank + 1) + 1000 * rank
        out = torch.full((n_out,), -7, dtype=torch.int32, device=dev)
        run_schedule(schedule, inp, out)
        want = _native(collective, inp, n, root, rank)
        ran += 1
        if want is not None and not torch.equal(out, want):
            bad.append(f"{algorithm} {collective} {options} rank {rank}")
    if with_op:
        op = schedule_op("all_reduce", list(range(n)), 4 * 64, "ring", topo)
        for k in range(2):
            inp = torch.arange(64, dtype=torch.int32, device=dev) + k * rank
            out = torch.zeros(64, dtype=torch.int32, device=dev)
            op(inp, out)
            want = inp.clone()
            dist.all_reduce(want)
            if not torch.equal(out, want):
                bad.append(f"schedule_op call {k} rank {rank}")
    return ran, bad


def _cases(algorithms=None):
    """Every registered algorithm (or those named) x the collectives it does, pipelined in 2 pieces; plus
    the bidirectional ring."""
    return [(a, c, {"pieces": 2}) for a in (algorithms or ALGORITHMS) for c in COLLECTIVES
            if c in ALGORITHMS[a].collectives] + [("ring", c, {"bidirectional": True}) for c in COLLECTIVES]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_every_schedule_equals_the_native_collective(n):
    # all algorithms up to 5 ranks; at 8 (8 processes on a 2-core CI machine) the main families only
    algorithms = None if n <= 5 else ["ring", "halving_doubling", "direct", "double_binary_tree"]
    results = launch(_check_all, n, (_cases(algorithms), n == 3), timeout_s=60, deadline_s=120)
    ran = [r[0] for r in results]
    assert len(set(ran)) == 1 and ran[0] >= (40 if n <= 5 else 20), ran  # every rank ran the same; most apply
    failures = [f for _, bad in results for f in bad]
    assert not failures, failures


@pytest.mark.gpu
def test_every_schedule_equals_nccl_on_gpus():
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip(f"schedules exchange between ranks: needs 2 GPUs, found {n}")
    results = launch(_check_all, n, (_cases(), True), backend="nccl", timeout_s=120, deadline_s=600)
    assert results[0][0] >= 40
    failures = [f for _, bad in results for f in bad]
    assert not failures, failures
