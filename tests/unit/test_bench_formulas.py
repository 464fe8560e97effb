"""bench: busbw factors, size sweeps, time reduction, exact inputs, input validation and the topology bound."""
import pytest
import torch

from meshscale.bench.cases import DTYPES, OPS, count_wrong, make_case, reduced, values
from meshscale.bench.collective import CollectiveSpec, validate
from meshscale.bench.harness import reduce_times
from meshscale.execute.world import World
from meshscale.collectives.bounds import busbw_bound
from meshscale.collectives.kinds import NAMES as COLLECTIVES
from meshscale.collectives.kinds import kind
from meshscale.errors import MeshscaleError
from meshscale.topology import load_system, pair_bandwidth
from meshscale.units import sweep_sizes


@pytest.mark.parametrize("n", [2, 4, 8])
def test_busbw_factors_match_nccl_tests(n):
    assert kind("all_reduce").busbw_factor(n) == pytest.approx(2 * (n - 1) / n)
    for c in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        assert kind(c).busbw_factor(n) == pytest.approx((n - 1) / n)
    for c in ("broadcast", "reduce", "send_recv"):
        assert kind(c).busbw_factor(n) == 1.0


def test_bandwidths_reproduce_a_reference_line():
    # nccl-tests 4x H200 all_reduce, 1 GiB in 4535.96 us -> algbw 236.72, busbw 355.08 GB/s
    algbw, busbw = kind("all_reduce").algbw_busbw(1073741824, 4535.96e-6, 4)
    assert algbw / 1e9 == pytest.approx(236.72, abs=0.01)
    assert busbw / 1e9 == pytest.approx(355.08, abs=0.01)


def test_collective_names():
    assert kind("alltoall").name == "all_to_all"
    assert kind("All-Reduce").name == "all_reduce"
    with pytest.raises(MeshscaleError, match="unknown collective"):
        kind("allreduce2")


def test_sweep_sizes():
    assert sweep_sizes("1K", "16K", 4) == [1024, 4096, 16384]
    assert sweep_sizes(8, 8) == [8]
    assert sweep_sizes("1K", "3K") == [1024, 2048]
    with pytest.raises(MeshscaleError, match="smaller than"):
        sweep_sizes("2M", "1M")
    with pytest.raises(MeshscaleError, match="factor"):
        sweep_sizes("1K", "2K", 1)


def test_reduce_times_follows_nccl_tests_codes():
    times = [3.0, 1.0, 2.0]
    assert [reduce_times(times, a) for a in (0, 1, 2, 3)] == [3.0, 2.0, 1.0, 3.0]
    with pytest.raises(MeshscaleError):
        reduce_times(times, 4)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", OPS)
def test_reduced_values_are_exact(dtype, op):
    world, count = 8, 50
    want = torch.zeros(count, dtype=torch.float64)
    per_rank = [values(r, count, world, DTYPES[dtype], op, torch.device("cpu")).double() for r in range(world)]
    if op in ("sum", "avg"):
        want = sum(per_rank) / (world if op == "avg" else 1)
    elif op == "prod":
        want = torch.stack(per_rank).prod(0)
    else:
        want = getattr(torch.stack(per_rank), "amin" if op == "min" else "amax")(0)
    got = reduced(count, world, DTYPES[dtype], op, torch.device("cpu"))
    assert torch.equal(got.double(), want)
    assert got.dtype == DTYPES[dtype]


def test_count_wrong_sees_a_misplaced_element():
    case = make_case("all_gather", 64, "bfloat16", "sum", 0, False, 0, 2, torch.device("cpu"))
    case.out.copy_(case.expected())
    assert count_wrong(case, "sum", 2) == 0
    case.out[3] += 1
    assert count_wrong(case, "sum", 2) == 1
    # the chunks of two ranks differ, so swapping them is caught too
    case.out.copy_(case.expected().view(2, -1).flip(0).reshape(-1))
    assert count_wrong(case, "sum", 2) > 0


def _spec(**kw):
    return CollectiveSpec(**{"collectives": ["all_gather"], "sizes_bytes": [64], **kw})


@pytest.mark.parametrize("spec, world, message", [
    (_spec(sizes_bytes=[24]), World(4, "gloo"), "does not split into 4 ranks"),
    (_spec(collectives=["all_reduce"], sizes_bytes=[6]), World(2, "gloo"), "multiples of 4 B"),
    (_spec(dtypes=("float8",)), World(2, "gloo"), "unknown dtype"),
    (_spec(ops=("xor",)), World(2, "gloo"), "unknown reduction op"),
    (_spec(collectives=["all_reduce"], ops=("avg",)), World(2, "gloo"), "--op avg needs NCCL"),
    (_spec(collectives=["all_reduce"], dtypes=("uint8",), ops=("avg",)), World(8, "nccl"), "overflows"),
    (_spec(blocking=True, cuda_graph=True), World(2, "nccl"), "drop one of --blocking and --cuda-graph"),
    (_spec(cuda_graph=True), World(2, "gloo"), "needs GPUs"),
    (_spec(collectives=["broadcast"], root=5), World(2, "gloo"), "not a rank"),
    (_spec(collectives=["send_recv"]), World(1, "gloo"), "at least 2 ranks"),
    (_spec(collectives=["all_to_all"], places=("in",)), World(2, "gloo"), "only out-of-place"),
    (_spec(average=7), World(2, "gloo"), "average 7"),
])
def test_validate_rejects_with_a_fix(spec, world, message):
    with pytest.raises(MeshscaleError, match=message):
        validate(spec, world)


def test_bound_is_injection_on_nvlink_systems():
    dgx1 = load_system("dgx1-p100")
    # 8 GPUs x 4 NVLink 1 links of 20 GB/s: each GPU can push 80 GB/s into the cube-mesh
    assert busbw_bound(dgx1, "all_reduce", list(range(8))) == pytest.approx(80e9, rel=0.01)
    # GPUs 0-3 are fully linked to each other with one link each: 3 x 20 GB/s
    assert busbw_bound(dgx1, "all_gather", [0, 1, 2, 3]) == pytest.approx(60e9, rel=0.01)
    # 0 and 5 share no NVLink: the bound falls to their PCIe/QPI route
    assert busbw_bound(dgx1, "all_reduce", [0, 5]) == pytest.approx(pair_bandwidth(dgx1, 0, 5), rel=0.01)


def test_bound_all_to_all_is_limited_by_the_bisection():
    pcie = load_system("pcie-4gpu")
    ring = busbw_bound(pcie, "all_reduce", [0, 1, 2, 3])
    a2a = busbw_bound(pcie, "all_to_all", [0, 1, 2, 3])
    assert a2a < ring  # the uplink between the two PCIe switches carries a quarter of all blocks each way
    with pytest.raises(MeshscaleError, match="at least 2"):
        busbw_bound(pcie, "all_reduce", [0])


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_bound_exists_for_every_collective_of_even_blocks(collective):
    if kind(collective).variable:  # all_to_allv's blocks differ pair to pair: no bound is claimed
        with pytest.raises(MeshscaleError, match="no bound"):
            busbw_bound(load_system("hgx-h200"), collective, [0, 1])
        return
    assert busbw_bound(load_system("hgx-h200"), collective, [0, 1]) > 0
