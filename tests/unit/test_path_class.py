"""Path classes (PIX, PXB, PHB, NODE, SYS) come from one function, `queries.path_class`."""
from __future__ import annotations

from meshscale.topology import load_system, route
from meshscale.topology.shipped import system_names
from meshscale.topology.nics import RELATIONS
from meshscale.topology.queries import path_class, relation
from meshscale.topology.text import host_view


def _pcie_pairs(topo):
    for a in topo.devices():
        for b in topo.devices():
            if a != b and route(topo, a, b).fabric == "pcie":
                yield a, b, route(topo, a, b).paths[0].nodes


def test_the_relation_of_every_pcie_pair_is_its_path_class_and_nccl_folds_node_into_phb():
    seen = set()
    for name in system_names():
        topo = host_view(load_system(name))  # a rack: one compute tray (every tray is wired alike)
        for a, b, nodes in _pcie_pairs(topo):
            smi, nccl = path_class(topo, nodes), path_class(topo, nodes, nccl=True)
            assert relation(topo, a, b) == smi and smi in RELATIONS
            assert nccl == ("PHB" if smi == "NODE" else smi)
            seen.add(smi)
    assert {"PIX", "SYS"} <= seen  # the catalog holds near and far pairs: the check is not empty


def test_a_class_grows_with_what_the_path_crosses():
    """Farther along RELATIONS as the path crosses more: one switch, then a CPU, then two CPUs."""
    topo = load_system("pcie-8gpu-2socket")
    order = {name: i for i, name in enumerate(RELATIONS)}
    by_cpus = {}
    for a, b, nodes in _pcie_pairs(topo):
        cpus = sum(topo.nodes[n].kind == "cpu" for n in nodes)
        by_cpus.setdefault(cpus, set()).add(order[path_class(topo, nodes)])
    assert max(by_cpus[0]) < min(by_cpus[1]) <= max(by_cpus[1]) < min(by_cpus[2])
