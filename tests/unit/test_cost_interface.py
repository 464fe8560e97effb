"""One interface over the cost models: a `Call` priced on a fabric; `collective_time_s` for groups on a cluster."""
import pytest

from meshscale.errors import MeshscaleError
from meshscale.simulate import predict_collective
from meshscale.simulate.cost import Call, FlowCostModel, NcclCostModel, collective_time_s
from meshscale.topology import load_system
from meshscale.topology.cluster import system_or_cluster


def test_nccl_model_through_the_interface_is_what_sim_predicts():
    topo = load_system("hgx-h100")
    p = NcclCostModel().predict(Call("all_reduce", 64 << 20, tuple(range(8))), topo)
    assert p.time_s == predict_collective(topo, "all_reduce", list(range(8)), 64 << 20).time_s
    assert p.model == "nccl" and "/" in p.chosen


def test_flow_model_prices_the_same_call():
    topo = load_system("dgx1-p100")
    call = Call("all_reduce", 16 << 20, (0, 1, 2, 3))
    flow, nccl = FlowCostModel().predict(call, topo), NcclCostModel().predict(call, topo)
    assert flow.model == "flow" and flow.time_s > 0 and nccl.time_s > 0


def test_groups_on_a_cluster_tensor_parallel_inside_a_node_data_parallel_across():
    """A TP group of a node's 8 GPUs runs over NVLink; a DP group of one GPU per node over the network: slower
    for the same bytes, and a tree (not a ring) across many nodes."""
    cluster = system_or_cluster("hgx-h100", 16, "ndr", 8)
    tp = collective_time_s("all_reduce", 64 << 20, range(8), cluster)
    dp = collective_time_s("all_reduce", 64 << 20, range(0, 128, 8), cluster)
    assert dp.time_s > tp.time_s
    gathered = collective_time_s("all_gather", 64 << 20, range(0, 128, 8), cluster, ["NCCL_MAX_NCHANNELS=1"])
    assert gathered.settings == ("NCCL_MAX_NCHANNELS=1",)
    assert collective_time_s("all_reduce", 64 << 20, None, "dgx1-p100").call.ranks == tuple(range(8))


def test_bad_input_is_one_line():
    with pytest.raises(MeshscaleError):
        collective_time_s("allreduce", 1 << 20, None, "hgx-h100")
    with pytest.raises(MeshscaleError):
        collective_time_s("all_reduce", 1 << 20, [0, 99], "hgx-h100")
    with pytest.raises(MeshscaleError):
        collective_time_s("all_reduce", 1 << 20, None, "hgx-h100", ["NCCL_NOPE=1"])
