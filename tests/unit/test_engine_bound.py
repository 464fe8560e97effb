"""The critical-path bound the flow engine skips hopeless runs with: never above the simulated end (on several
schedules and systems, contended or not), and equal to it for one chain of transfers alone on its links."""
import numpy as np
import pytest

from meshscale.collectives.algorithms import build
from meshscale.simulate.engine import FINISH_SLACK, critical_path_s, resources, solo_rates
from meshscale.simulate.params import SimParams
from meshscale.simulate.sim import flow_inputs, simulate
from meshscale.topology import load_system


def bound_s(schedule, topo):
    """The bound as the engine takes it: latency plus the bytes at each transfer's rate alone, along chains."""
    src, dst, nbytes, reduce, deps = flow_inputs(schedule, topo)
    res = resources(topo, SimParams())
    keys = [-1 if s is None else res.key(s, d, bool(r)) for s, d, r in zip(src, dst, reduce)]
    rows = np.array(res.rows)
    solo = solo_rates(rows, res.capacity)
    duration = np.array([0.0 if k < 0 else res.latency[k] + (1 - FINISH_SLACK) * b / solo[k]
                         for k, b in zip(keys, nbytes)])
    successors = [[] for _ in deps]
    for i, ds in enumerate(deps):
        for d in ds:
            successors[d].append(i)
    return critical_path_s(duration, deps, successors)


@pytest.mark.parametrize("system, algorithm, pieces", [
    ("dgx1-v100", "tree_packing", 4), ("dgx1-v100", "ring", 1), ("pcie-4gpu", "double_binary_tree", 4),
    ("hgx-h100", "packed_ring", 1), ("pcie-4gpu", "binomial", 1)])
def test_critical_path_never_exceeds_the_simulated_end(system, algorithm, pieces):
    topo = load_system(system)
    ranks = [topo.nodes[d].index for d in topo.devices()]
    schedule = build(algorithm, "all_reduce", ranks, 16 << 20, topo, pieces=pieces)
    assert 0 < bound_s(schedule, topo) <= simulate(schedule, topo).time_s * (1 + 1e-9)


def test_critical_path_is_the_end_of_a_lone_chain():
    topo = load_system("pcie-4gpu")
    schedule = build("chain", "broadcast", [0, 1, 2, 3], 8 << 20, topo, pieces=1)
    assert bound_s(schedule, topo) == pytest.approx(simulate(schedule, topo).time_s, rel=FINISH_SLACK * 1.01)
