"""One interface over the cost models: a `Call` priced on a `Fabric` (`Fabric.cost`), the model the fabric's
``algo`` names; the interface module imports none of its implementations; a fabric re-sized to N nodes keeps its
network and settings, and each of them moves the price."""
import ast
from pathlib import Path

import pytest

from meshscale.errors import MeshscaleError
from meshscale.simulate.auto import FlowCostModel
from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric, resolve_fabric
from meshscale.simulate.nccl.cost_model import NcclCostModel
from meshscale.simulate.nccl_env import NcclSettings, nccl_settings, parse_nccl_env
from meshscale.topology import load_system
from meshscale.topology.cluster import system_or_cluster

SRC = Path(__file__).resolve().parents[2] / "src" / "meshscale"


def test_the_interface_module_imports_none_of_its_implementations():
    tree = ast.parse((SRC / "simulate" / "cost.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if m and m.startswith("meshscale.simulate")}, imported


def test_the_fabric_builds_the_model_its_algo_names():
    topo = load_system("dgx1-p100")
    call = Call("all_reduce", 16 << 20, (0, 1, 2, 3))
    assert isinstance(Fabric(topo).model, NcclCostModel)
    assert isinstance(Fabric(topo, algo="auto").model, FlowCostModel)
    assert Fabric(topo).cost(call).time_s == NcclCostModel().predict(call, topo).time_s
    ring = Fabric(topo, algo="ring").cost(call)
    assert ring.model == "flow" and ring.chosen.startswith("ring")
    forced = Fabric(topo, nccl=NcclSettings(algo="ring")).cost(Call("all_reduce", 1 << 10, tuple(range(8))))
    assert forced.chosen.startswith("ring/")
    with pytest.raises(MeshscaleError, match="--algo"):
        resolve_fabric("dgx1-p100", algo="fastest")


def _cluster(**options) -> Fabric:
    cluster = {"nodes": 2, "link": "ndr", "nics": 8, "gpudirect": None, "network": None, "oversubscription": None}
    nccl = options.pop("nccl", None)
    return resolve_fabric("hgx-h100", {**cluster, **options}, nccl=nccl)


def _gather_s(fabric: Fabric, nodes: int, nbytes: int = 1 << 28) -> float:
    sized = fabric.at_nodes(nodes)
    return sized.cost(Call("all_gather", nbytes, tuple(range(sized.world_size)))).time_s


def test_a_fabric_at_n_nodes_is_the_same_network_re_sized_and_built_once():
    fabric = _cluster()
    one, four = fabric.at_nodes(1), fabric.at_nodes(4)
    assert (one.nodes, one.world_size, one.network_latency_s()) == (1, 8, 0.0)
    assert (four.nodes, four.gpus_per_node, four.world_size) == (4, 8, 32)
    assert four is fabric.at_nodes(4) and four.cluster.link == fabric.cluster.link
    assert four.network_latency_s() > 0 and fabric.at_nodes(2) is fabric
    assert _gather_s(fabric, 1) < _gather_s(fabric, 4) < _gather_s(fabric, 16)
    with pytest.raises(MeshscaleError, match="one system"):
        resolve_fabric("hgx-h100").at_nodes(2)


def test_channels_gpudirect_and_oversubscription_each_move_the_price():
    base = _cluster()
    fewer = _cluster(nccl=nccl_settings(nccl_env=["NCCL_MAX_NCHANNELS=1"]))
    assert _gather_s(fewer, 4) > _gather_s(base, 4)
    staged = _cluster(gpudirect=False)  # staged through host memory: each message crosses it at both ends
    assert _gather_s(staged, 4, 1 << 16) > _gather_s(base, 4, 1 << 16)
    assert staged.at_nodes(4).network_latency_s() > base.at_nodes(4).network_latency_s()
    blocking = _cluster(oversubscription=16.0)  # leaves fewer than 16 nodes: the ring climbs their up-links
    assert _gather_s(blocking, 16) > _gather_s(base, 16)


def test_groups_on_a_cluster_tensor_parallel_inside_a_node_data_parallel_across():
    """A TP group of a node's 8 GPUs runs over NVLink; a DP group of one GPU per node over the network: slower
    for the same bytes."""
    fabric = Fabric(system_or_cluster("hgx-h100", 16, "ndr", 8))
    tp = fabric.cost(Call("all_reduce", 64 << 20, tuple(range(8))))
    dp = fabric.cost(Call("all_reduce", 64 << 20, tuple(range(0, 128, 8))))
    assert dp.time_s > tp.time_s
    one = Fabric(fabric.topology, nccl=NcclSettings(parse_nccl_env(["NCCL_MAX_NCHANNELS=1"])))
    gathered = one.cost(Call("all_gather", 64 << 20, tuple(range(0, 128, 8))))
    assert gathered.settings == ("NCCL_MAX_NCHANNELS=1",)


def test_bad_input_is_one_line():
    fabric = resolve_fabric("hgx-h100")
    with pytest.raises(MeshscaleError):
        fabric.cost(Call("allreduce", 1 << 20, tuple(range(8))))
    with pytest.raises(MeshscaleError):
        fabric.cost(Call("all_reduce", 1 << 20, (0, 99)))
    with pytest.raises(MeshscaleError):
        parse_nccl_env(["NCCL_NOPE=1"])


def test_no_caller_prices_through_an_algorithm_string():
    """The string dispatch (``algorithm="nccl"|"auto"|name`` through predict_collective, or NCCL's model called
    beside the interface) is gone: callers hold a `Fabric` and call ``fabric.cost``."""
    allowed = {"__init__.py"}  # the public API's sweep of the same name (a `sim_sweep` on a Fabric)
    found = []
    for path in sorted(SRC.rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        text = path.read_text()
        if name not in allowed and ("predict_collective(" in text or "import predict_collective" in text):
            found.append(f"{name}: predict_collective")
        if "nccl_result" in text:
            found.append(f"{name}: nccl_result")
    assert not found, found
