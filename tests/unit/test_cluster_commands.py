"""Clusters wherever a system is accepted: stated network rates, cluster files, --nodes/--link/--nics in plan,
sim and topo, NCCL's model across nodes, and the network fitted to a measured multi-node all_reduce."""
import json

import pytest

from meshscale.errors import MeshscaleError
from meshscale.results import Result, load_result
from meshscale.simulate import nccl
from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric
from meshscale.simulate.nccl_env import NcclSettings
from meshscale.simulate.link_fit import fit_network
from meshscale.topology.cluster import net_link, system_or_cluster
from meshscale.topology.links import parse_network_rate


def test_stated_rates_parse_in_bytes_and_bits():
    assert parse_network_rate("25GB/s,5us") == (25e9, pytest.approx(5e-6))
    assert parse_network_rate("100Gb/s,2us") == (12.5e9, pytest.approx(2e-6))
    assert parse_network_rate("100Gbps") == (12.5e9, None)
    assert parse_network_rate("12.5 GB/s, 1 ms")[1] == pytest.approx(1e-3)
    link = net_link("25GB/s,5us")
    assert link.bandwidth_bytes_per_s == 25e9 and link.system_latency_s == pytest.approx(5e-6)
    assert net_link("EDR") is net_link("edr")


@pytest.mark.parametrize("text", ["25XB/s", "fast", "25GB/s,5", "0GB/s", "25GB/s,0us", "1,2,3"])
def test_a_rate_that_does_not_parse_is_an_error(text):
    with pytest.raises(MeshscaleError):
        net_link(text)


def _ranks(topo):
    return [topo.nodes[d].index for d in topo.devices()]


def test_network_bandwidth_and_latency_change_nccl_across_nodes():
    edr = system_or_cluster("dgx1-v100", nodes=4, link="edr")
    ten = system_or_cluster("dgx1-v100", nodes=4, link="10gbe")
    big = Fabric(edr).cost(Call("all_reduce", 256 << 20, tuple(_ranks(edr)))).busbw_bytes_per_s
    small = Fabric(ten).cost(Call("all_reduce", 256 << 20, tuple(_ranks(ten)))).busbw_bytes_per_s
    assert big > 40e9 and small < 2.6e9  # 4 EDR ports vs 2 x 10 GbE per node
    near = system_or_cluster("dgx1-v100", nodes=4, link="12GB/s,1us")
    far = system_or_cluster("dgx1-v100", nodes=4, link="12GB/s,50us")
    t_near = Fabric(near, nccl=NcclSettings(algo="ring")).cost(Call("all_reduce", 4096, tuple(_ranks(near)))).time_s
    t_far = Fabric(far, nccl=NcclSettings(algo="ring")).cost(Call("all_reduce", 4096, tuple(_ranks(far)))).time_s
    assert t_far > t_near + 6 * 40e-6  # 6 network steps of a 4-node ring all_reduce, each ~49 us slower


def test_nic_affinity_and_gpudirect_as_nccl_sees_them():
    on = nccl.analyse(system_or_cluster("dgx1-v100", nodes=2), _ranks(system_or_cluster("dgx1-v100", nodes=2)))
    assert [n.path_type for n in on.nics] == ["PIX"] * 4 and all(n.gdr for n in on.nics)
    assert len({n.gpu for n in on.nics}) == 4  # each NIC serves its own GPU
    off_topo = system_or_cluster("dgx1-v100", nodes=2, gpudirect=False)
    off = nccl.analyse(off_topo, _ranks(off_topo))
    assert not any(n.gdr for n in off.nics) and {n.path_type for n in off.nics} == {"PHB"}
    eth_topo = system_or_cluster("dgx1-v100", nodes=2, link="10gbe")
    eth = nccl.analyse(eth_topo, _ranks(eth_topo))
    assert not any(n.gdr for n in eth.nics)  # the 10 GbE ports hang off a CPU: no GPUDirect RDMA
    assert eth.inter_gbps == pytest.approx(2.5)


def test_sim_and_plan_take_a_cluster(cli):
    r = cli("sim", "all_reduce", "-s", "dgx1-v100", "--nodes", "2", "--link", "25GB/s,3us", "-b", "64M", "-e", "64M")
    assert r.exit_code == 0, r.output
    assert "dgx1-v100x2-25GBps-3us" in r.stdout and "15]" in r.stdout and "nccl" in r.stdout
    assert "bound: not computed across a cluster's nodes" in r.stdout  # the bound column's "-" is explained
    r = cli("plan", "all_reduce", "-s", "dgx1-v100", "--nodes", "2", "--gpus", "4", "--bytes", "1M")
    assert r.exit_code == 0, r.output  # the first 4 GPUs: one node
    assert "NCCL" in next(l for l in r.stdout.splitlines() if l.startswith(("predicted:", "versus:")))


def test_a_cluster_file_is_a_system(cli, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("cluster:\n  node: dgx1-p100\n  nodes: 8\n  nics: 2\n  link: {rate: 100Gb/s, latency: 2us}\n"
                    "  gpudirect: false\n")
    r = cli("topo", "-s", path)
    assert r.exit_code == 0, r.output
    assert "8 x dgx1-p100 (64 GPUs), 2x" in r.stdout and "GPUDirect RDMA off" in r.stdout and "GPU0" in r.stdout
    r = cli("topo", "-s", path, "--nodes", "16")  # options override the file
    assert "16 x dgx1-p100" in r.stdout
    r = cli("sim", "all_gather", "-s", path, "-b", "1M", "-e", "1M")
    assert r.exit_code == 0 and "64 devices" in r.stdout
    r = cli("predict", "--model", "resnet50", "-s", path)
    assert r.exit_code == 0, r.output
    assert "64" in r.stdout


def test_cluster_sizes_a_cluster_file(cli, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("cluster:\n  node: dgx1-p100\n  nodes: 124\n  nics: 4\n  link: edr\n  oversubscription: 2\n")
    r = cli("cluster", "-s", path, "--json", tmp_path / "c.json")
    assert r.exit_code == 0, r.output
    assert "124 x dgx1-p100 (992 GPUs), 4x EDR" in r.stdout
    meta = load_result(tmp_path / "c.json").meta
    assert meta["oversubscription"] == 2 and meta["nics"] == 4
    named = cli("cluster", "--node", "dgx1-p100", "--nodes", "124", "--nics", "4", "--link", "edr",
                "--oversubscription", "2")
    assert named.stdout == r.stdout.replace(f"wrote {tmp_path / 'c.json'}\n", "")  # one spec, however it is given
    r = cli("cluster", "-s", path, "--nodes", "16", "--oversubscription", "1")  # options override the file
    assert r.exit_code == 0 and "16 x dgx1-p100 (128 GPUs)" in r.stdout


@pytest.mark.parametrize("text, words", [
    ("cluster:\n  node: dgx1-p100\n  switches: 3\n", "unknown cluster key"),
    ("cluster:\n  nodes: 4\n", "needs a mapping with at least 'node"),
    ("cluster: [1, 2\n", "c.yaml"),
    ("cluster:\n  node: no-such-system\n  nodes: 2\n", "no-such-system"),
    # each field through the command line's checks: the file and field named
    ("cluster:\n  node: dgx1-p100\n  nodes: abc\n", "cluster: nodes"),
    ("cluster:\n  node: dgx1-p100\n  nodes: .nan\n", "cluster: nodes"),
    ("cluster:\n  node: dgx1-p100\n  nodes: 2.5\n", "cluster: nodes"),
    ("cluster:\n  node: dgx1-p100\n  nodes: 100000000\n", "cluster: nodes"),
    ("cluster:\n  node: dgx1-p100\n  nics: many\n", "cluster: nics"),
    ("cluster:\n  node: [a]\n", "cluster: node"),
    ("cluster:\n  node: dgx1-p100\n  oversubscription: .inf\n", "cluster: oversubscription"),
    ("cluster:\n  node: dgx1-p100\n  gpudirect: 'no'\n", "cluster: gpudirect"),
    ("cluster:\n  node: dgx1-p100\n  radix: 0\n", "cluster: radix"),
    ("cluster:\n  node: dgx1-p100\n  nodes_per_leaf: 0\n", "cluster: nodes_per_leaf"),
    ("cluster:\n  node: dgx1-p100\n  network: torus\n", "cluster: network"),
])
def test_cluster_with_a_bad_file_is_one_line_exit_2(cli, tmp_path, text, words):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    r = cli("cluster", "-s", path)
    assert r.exit_code == 2, r.output
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, words", [
    (("sim", "all_reduce", "-s", "dgx1-p100", "--nodes", "100000"), "exceed"),
    (("sim", "all_reduce", "-s", "dgx1-p100", "--nodes", "2", "--nics", "0"), "--nics: 0 is out of range"),
    (("sim", "all_reduce", "-s", "dgx1-p100", "--nodes", "2", "--link", "25XB/s"), "unknown unit"),
    (("sim", "all_reduce", "-s", "dgx1-p100", "--link", "edr"), "add --nodes"),
    (("topo", "--nodes", "2"), "add --system"),
    (("plan", "all_reduce", "-s", "dgx1-p100", "--nodes", "2", "--link", "x"), "unknown network link"),
    (("cluster", "--link", "10Gb/s,"), "latency"),
    (("cluster", "-s", "dgx1-p100", "--node", "dgx1-v100"), "once"),
])
def test_bad_cluster_input_is_one_line_exit_2(cli, args, words):
    r = cli(*args)
    assert r.exit_code == 2, r.output
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1


def _measured(tmp_path, world_size, rows):
    path = tmp_path / "inter.json"
    factor = 2 * (world_size - 1) / world_size  # nccl-tests' all_reduce busbw factor
    Result("bench-collective", [{"collective": "all_reduce", "size_bytes": s, "time_s": t,
                                 "busbw_bytes_per_s": s / t * factor if t > 0 else 0.0} for s, t in rows],
           meta={"world_size": world_size}).save(path)
    return path


def test_network_fit_from_a_measured_multi_node_all_reduce(tmp_path, cli):
    # 2 DGX-1 nodes (16 ranks): algbw 8 GB/s for large sizes, 500 us at size 0 (a slow network)
    sizes = [1 << 20, 16 << 20, 64 << 20, 256 << 20]
    path = _measured(tmp_path, 16, [(s, 500e-6 + s / 8e9) for s in sizes])
    topo = system_or_cluster("dgx1-v100", nodes=2)
    fitted, fit = fit_network(topo, load_result(path))
    assert fit.rate_bytes_per_s == pytest.approx(8e9 * 2 * 15 / 16 / 4, rel=1e-6)  # per NIC, 4 NICs
    assert fit.latency_s > 10 * nccl.REFERENCE_NET_LATENCY_S
    fast = _measured(tmp_path, 16, [(s, 1e-6 + s / 8e9) for s in sizes])
    assert fit_network(topo, load_result(fast))[1].latency_s == nccl.REFERENCE_NET_LATENCY_S  # never below
    assert fitted.cluster.net == net_link(fit.link)
    r = cli("sim", "all_reduce", "-s", "dgx1-v100", "--nodes", "4", "--bench", path, "-b", "1M", "-e", "1M")
    assert r.exit_code == 0, r.output
    assert "calibrated" in r.stdout and "calibrated" in r.stderr
    fitted_for_sim = r.stderr.strip().splitlines()[-1]
    r = cli("predict", "--model", "resnet50", "-s", "dgx1-v100", "--nodes", "2,4", "--bench", path)
    assert r.exit_code == 0, r.output
    assert "calibrated" in r.stdout
    assert fitted_for_sim in r.stderr  # one resolution of --bench for sim and predict: the same network


def test_network_fit_refuses_a_single_node_or_non_positive_result(tmp_path, cli):
    single = _measured(tmp_path, 8, [(1 << 20, 1e-4), (64 << 20, 1e-2)])
    r = cli("sim", "all_reduce", "-s", "dgx1-v100", "--nodes", "2", "--bench", single)
    assert r.exit_code == 2 and "multi-node" in r.stderr
    bad = _measured(tmp_path, 16, [(1 << 20, 1e-4), (64 << 20, 0.0)])
    r = cli("sim", "all_reduce", "-s", "dgx1-v100", "--nodes", "2", "--bench", bad)
    assert r.exit_code == 2 and "not positive" in r.stderr
    data = json.loads(bad.read_text())
    assert data["kind"] == "bench-collective"


def test_one_gpu_per_node_rings_run_over_the_nics(tmp_path):
    """Nodes of one GPU (the emulated two-node run): NCCL's channels go GPU -> NIC, so the ring runs at the
    network's rate, not at the node's (absent) intra-node bandwidth."""
    from meshscale.topology import dumps, load_system, subset
    node = subset(load_system("hgx-h200"), [0])
    path = tmp_path / "one-gpu.json"
    path.write_text(dumps(node))
    slow = system_or_cluster(str(path), nodes=2, link="3GB/s,5us", nics=1)
    fast = system_or_cluster(str(path), nodes=2, link="25GB/s,5us", nics=1)
    size = 256 << 20
    t_slow, t_fast = (Fabric(t).cost(Call("all_reduce", size, tuple([0, 1]))).time_s for t in (slow, fast))
    assert size / t_slow < 3e9 < size / t_fast  # busbw = algbw on 2 ranks: below the 3 GB/s network, and far above it
    assert t_slow / t_fast > 5


def _ring_busbw(**shape) -> float:
    from meshscale.topology.cluster import ClusterSpec, build_cluster, plan_cluster
    topo = build_cluster(plan_cluster(ClusterSpec(node="dgx1-v100", nics=4, link="edr", **shape)))
    return Fabric(topo, nccl=NcclSettings(algo="ring")).cost(Call("all_reduce", 1 << 30, tuple(_ranks(topo)))).busbw_bytes_per_s


def test_an_oversubscribed_tree_slows_a_ring_only_where_it_climbs():
    # one node per leaf: the ring's every hop climbs, through half as many up-links as NIC ports at 2:1
    blocking = _ring_busbw(nodes=2, nodes_per_leaf=1, oversubscription=2)
    assert blocking == pytest.approx(_ring_busbw(nodes=2, nodes_per_leaf=1) / 2, rel=0.05)
    # packed four nodes per leaf: the ring leaves each leaf once, and two nodes' worth of up-links carry one
    # node's traffic; spread over busy leaves (the default), every node's traffic climbs at 1/k
    assert _ring_busbw(nodes=8, oversubscription=2, placement="packed") == pytest.approx(_ring_busbw(nodes=8))
    assert _ring_busbw(nodes=8, oversubscription=2) == pytest.approx(_ring_busbw(nodes=8) / 2, rel=0.05)


def test_sim_of_an_oversubscribed_cluster_file(cli, tmp_path):
    runs = {}
    for k in (1, 2):
        path = tmp_path / f"c{k}.yaml"
        path.write_text(f"cluster:\n  node: dgx1-v100\n  nodes: 2\n  nodes_per_leaf: 1\n  oversubscription: {k}\n")
        r = cli("sim", "all_reduce", "-s", path, "-b", "1G", "-e", "1G", "--algo", "nccl", "--json", tmp_path / f"s{k}.json")
        assert r.exit_code == 0, r.output
        runs[k] = load_result(tmp_path / f"s{k}.json").rows[0]["busbw_bytes_per_s"]
    assert runs[2] == pytest.approx(runs[1] / 2, rel=0.05)


def test_an_exponent_without_a_dot_is_a_number_in_yaml(cli, tmp_path):
    """PyYAML reads 25e9 as a string (YAML 1.1); meshscale's files read it as the number it is."""
    system = tmp_path / "two.yaml"
    system.write_text("name: two\nnodes:\n  - {name: gpu0, kind: gpu, index: 0}\n  - {name: gpu1, kind: gpu, index: 1}\n"
                      "links:\n  - {a: gpu0, b: gpu1, kind: nvlink, bandwidth_bytes_per_s: 25e9}\n")
    r = cli("topo", "--system", str(system), "--format", "json")
    assert r.exit_code == 0, r.output
    assert "25000000000" in r.stdout


def test_predict_takes_a_cluster_file_and_its_overriding_options_as_sim_does(tmp_path, cli):
    """A cluster file's fields, overridden by the options given (--link here), are the cluster predict prices,
    as sim and plan resolve them: the same rows as the cluster named by options alone."""
    path = tmp_path / "c.yaml"
    path.write_text("cluster:\n  node: dgx1-p100\n  nodes: 2\n  nics: 2\n  link: edr\n")
    args = ("predict", "--model", "resnet50", "--nodes", "2", "--json")
    overridden, named, filed = (tmp_path / f"{k}.json" for k in ("o", "n", "f"))
    assert cli(*args, overridden, "-s", path, "--link", "10gbe").exit_code == 0
    assert cli(*args, named, "-s", "dgx1-p100", "--nics", "2", "--link", "10gbe").exit_code == 0
    assert cli(*args, filed, "-s", path).exit_code == 0
    rate = [[r["throughput_samples_per_s"] for r in load_result(p).rows] for p in (overridden, named, filed)]
    assert rate[0] == rate[1] and rate[0][-1] < rate[2][-1]
