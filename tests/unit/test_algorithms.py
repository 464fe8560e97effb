"""Every algorithm x collective x rank count 2..8 gives a schedule that passes the symbolic check; bad input
gives a one-line MeshscaleError."""
import pytest

from meshscale.collectives.algorithms import ALGORITHMS, build
from meshscale.collectives.kinds import SCHEDULABLE as COLLECTIVES
from meshscale.collectives.schedule import validate
from meshscale.errors import MeshscaleError
from meshscale.topology import from_dict, load_system


def switched(n=8):
    """n GPUs behind one NVSwitch."""
    nodes = [{"name": "sw", "kind": "nvswitch"}] + [{"name": f"g{i}", "kind": "gpu", "index": i} for i in range(n)]
    links = [{"a": f"g{i}", "b": "sw", "kind": "nvlink", "generation": 4, "count": 18} for i in range(n)]
    return from_dict({"name": "switched", "nodes": nodes, "links": links})


DGX1 = load_system("dgx1-p100")
SWITCHED = switched()
CASES = [(a, c, n) for a in ALGORITHMS for c in ALGORITHMS[a].collectives for n in range(2, 9)]


def groupings(n):
    ranks = list(range(n))
    return [[ranks[: n // 2], ranks[n // 2:]], [ranks[::3], [r for r in ranks if r % 3]] if n > 2 else [[0], [1]]]


@pytest.mark.parametrize("algorithm, collective, n", CASES)
def test_every_algorithm_validates(algorithm, collective, n):
    topo = SWITCHED if algorithm in ("one_shot", "two_shot") else DGX1
    ranks = list(range(n))[::-1]  # devices need not be in order
    for root, pieces in sorted({(n - 1, 1), (n // 2, 3)}):
            options = {"root": root, "pieces": pieces}
            for groups in (groupings(n) if algorithm == "hierarchical" else [None]):
                if groups:
                    options["groups"] = [[ranks[i] for i in g] for g in groups]
                s = build(algorithm, collective, ranks, 4 * 3 * n * 8, topo, **options)
                validate(s)  # (build validates as well)
                assert s.collective == collective and s.ranks == ranks
                assert all(t.nbytes == s.chunks[t.chunk].nbytes for _, t in s.transfers())
                if n > 1:
                    assert s.transfers(), "a collective over several ranks moves data"


def test_ring_multichannel_and_bidirectional():
    s = build("ring", "all_reduce", [0, 1, 2, 3], 4 * 64, DGX1, rings=[[0, 1, 2, 3], [0, 2, 1, 3]], bidirectional=True)
    assert s.channels == 4 and {t.channel for _, t in s.transfers()} == {0, 1, 2, 3}
    per_channel = [sum(t.nbytes for _, t in s.transfers() if t.channel == k) for k in range(4)]
    assert len(set(per_channel)) == 1  # channels share the work evenly
    # a ring all_reduce moves 2(n-1)/n of the buffer per rank
    assert sum(per_channel) == 4 * 2 * (4 - 1) * (4 * 64) // 4


def test_ring_traffic_is_bandwidth_optimal():
    n, nbytes = 5, 4 * 5 * 16
    s = build("ring", "all_reduce", list(range(n)), nbytes, DGX1, pieces=2)
    sent = [sum(t.nbytes for _, t in s.transfers() if t.src == r) for r in range(n)]
    assert sent == [2 * (n - 1) * nbytes // n] * n


def test_halving_doubling_log_steps():
    s = build("halving_doubling", "all_reduce", list(range(8)), 4 * 8, DGX1)
    assert len(s.steps) == 6  # log2(8) halving + log2(8) doubling
    s6 = build("halving_doubling", "all_reduce", list(range(6)), 4 * 6, DGX1)
    assert len(s6.steps) == 2 + 2 * 2  # pre + post around 2^2 participants


def test_hierarchical_derives_hosts():
    cluster = from_dict({
        "name": "two-hosts",
        "nodes": [{"name": "sw", "kind": "net_switch"}] +
                 [{"name": f"nic{h}", "kind": "nic"} for h in range(2)] +
                 [{"name": f"g{i}", "kind": "gpu", "index": i} for i in range(4)],
        "links": [{"a": "g0", "b": "g1", "kind": "nvlink", "generation": 2}, {"a": "g2", "b": "g3", "kind": "nvlink", "generation": 2}] +
                 [{"a": f"g{i}", "b": f"nic{i // 2}", "kind": "pcie", "generation": 3, "width": 16} for i in range(4)] +
                 [{"a": f"nic{h}", "b": "sw", "kind": "infiniband", "rate": "edr"} for h in range(2)],
    })
    s = build("hierarchical", "all_reduce", [0, 1, 2, 3], 4 * 64, cluster)
    assert s.meta["groups"] == [[0, 1], [2, 3]]
    with pytest.raises(MeshscaleError, match="two or more hosts"):
        build("hierarchical", "all_reduce", [0, 1, 2, 3], 64, DGX1)


@pytest.mark.parametrize("args, match", [
    (("halving_doubling", "all_to_all", [0, 1, 2, 3], 64, DGX1), "cannot do all_to_all"),
    (("two_shot", "all_reduce", [0, 1, 2, 3], 64, DGX1), "needs ranks that talk through a switch"),
    (("ring", "all_reduce", [0, 1, 9], 48, DGX1), "no gpu 9"),
    (("ring", "all_reduce", [0, 1, 1], 48, DGX1), "repeat"),
    (("ring", "all_gather", [0, 1, 2], 64, DGX1), "does not split"),
    (("ring", "all_reduce", [0, 1, 2], 6, DGX1), "multiple of the 4-byte element"),
    (("ring", "all_reduce", [0, 1, 2, 3], 8, DGX1), "cannot split"),
    (("ring", "all_reduce", [0, 1, 2], 48, DGX1, {"rings": [[0, 1, 3]]}), "not a permutation"),
    (("binomial", "broadcast", [0, 1, 2], 48, DGX1, {"root": 3}), "root rank 3"),
    (("nope", "all_reduce", [0, 1], 48, DGX1), "unknown algorithm"),
    (("ring", "allreduce", [0, 1], 48, DGX1), "unknown collective"),
    (("ring", "all_reduce", [0, 1], 48, DGX1, {"pieces": 0}), "positive integer"),
])
def test_bad_input(args, match):
    *positional, options = args if isinstance(args[-1], dict) else (*args, {})
    with pytest.raises(MeshscaleError, match=match) as info:
        build(*positional, **options)
    assert "\n" not in str(info.value)
