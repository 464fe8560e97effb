"""NCCL's socket transport by mechanism (`simulate/nccl/net_socket.py`): helper threads and sockets as NCCL settles
them, threads that add up until a core's copies, the cores or the link set the pace, never faster than RDMA on
the same link, and a host's GPUs cut into NCCL's nodes when neither P2P nor SHM joins them. Each test states a
property, not a figure."""
import importlib.util
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from meshscale.errors import MeshscaleError
from meshscale.simulate import nccl
from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric
from meshscale.simulate.nccl import net_socket
from meshscale.simulate.nccl.net_socket import MIN_TASK_BYTES, SocketSetup, socket_setup, tcp_host
from meshscale.simulate.nccl_env import NcclSettings, parse_nccl_env
from meshscale.topology import Node, Topology, load_system
from meshscale.topology.cluster import system_or_cluster

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def h200():
    return load_system("hgx-h200")


@pytest.fixture(scope="module")
def pcie_cluster():
    """Two 4-GPU PCIe nodes: one 400 GbE (RoCE) port each, fast enough that the socket path's copies show."""
    return system_or_cluster("pcie-4gpu", 2, "400gbe", 1)


@pytest.fixture(scope="module")
def wide():
    """Two HGX H200 nodes of eight 400 GbE (RoCE) ports; its rank 0 and 8 (one GPU a node) run over links wider
    than a core's copies."""
    return system_or_cluster("hgx-h200", 2, "400gbe", 8)


def _ranks(topo):
    return [topo.nodes[d].index for d in topo.devices()]


def _time(topo, settings, collective="all_reduce", nbytes=GIB, ranks=None):
    call = Call(collective, nbytes, tuple(ranks or _ranks(topo)))
    return Fabric(topo, nccl=NcclSettings(env=parse_nccl_env(settings))).cost(call).time_s


def _with_nic_attrs(topo: Topology, **attrs) -> Topology:
    nodes = {k: Node(n.name, n.kind, dict(n.attrs, **attrs) if n.kind == "nic" else dict(n.attrs))
             for k, n in topo.nodes.items()}
    return Topology(f"{topo.name}-{'-'.join(map(str, attrs.values()))}", nodes, list(topo.links), topo.title,
                    dict(topo.attrs), topo.cluster)


@pytest.mark.parametrize("vendor, expected", [(None, (0, 1)), ("0x8086", (0, 1)), ("0x1d0f", (2, 8)),
                                              ("0x1ae0", (4, 1))])
def test_the_defaults_per_nic_vendor_are_nccls_table(pcie_cluster, vendor, expected):
    """net_socket.cc ncclNetSocketGetNsockNthread: AWS (0x1d0f) 2 threads x 8 sockets, GCP (0x1ae0) 4 x 1, any
    other NIC no helper thread and one socket; read from the NIC's PCI vendor in the system file."""
    topo = _with_nic_attrs(pcie_cluster, pci_vendor=vendor) if vendor else pcie_cluster
    s = nccl.analyse(topo, _ranks(topo), env=parse_nccl_env(["NCCL_NET=Socket"]))
    assert (s.socket.setup.threads, s.socket.setup.socks_per_thread) == expected
    # one of the two set: the other stays NCCL's choice for the vendor
    one = socket_setup(parse_nccl_env(["NCCL_SOCKET_NTHREADS=3"]), vendor)
    assert (one.threads, one.socks_per_thread) == (3, expected[1])


def test_the_product_cap_of_64_and_the_thread_cap_are_refused_in_one_line(cli):
    assert parse_nccl_env(["NCCL_SOCKET_NTHREADS=16,NCCL_NSOCKS_PERTHREAD=4"]).socket_threads == 16
    for bad, words in (("NCCL_SOCKET_NTHREADS=16,NCCL_NSOCKS_PERTHREAD=5", "at most 64"),
                       ("NCCL_SOCKET_NTHREADS=17", "0 to 16"), ("NCCL_NSOCKS_PERTHREAD=65", "0 to 64")):
        with pytest.raises(MeshscaleError, match=words):
            parse_nccl_env([bad])
    with pytest.raises(MeshscaleError, match="at most 64"):  # 16 threads x AWS's 8 sockets per thread
        socket_setup(parse_nccl_env(["NCCL_SOCKET_NTHREADS=16"]), "0x1d0f")
    res = cli("sim", "all_reduce", "-s", "pcie-4gpu", "--nodes", "2", "--link", "100gbe", "--nics", "1",
              "--nccl-env", "NCCL_NSOCKS_PERTHREAD=4")  # no helper thread on a generic NIC: the sockets never open
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "NCCL_SOCKET_NTHREADS" in res.stderr


def test_a_message_is_cut_as_the_benchmark_cuts_it():
    """The benchmark reproduces NCCL's split (tasks of at least 64 KiB, one per socket, round-robin); the model's
    busy threads follow the same count: sockets that get a task of one message, over NCCL_STEPS / sliceSteps
    messages in flight."""
    spec = importlib.util.spec_from_file_location("tcp_loopback", REPO / "benchmarks" / "tcp_loopback.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for threads, socks in ((1, 1), (2, 3), (4, 4), (16, 4)):
        for message in (1000, 64 << 10, 200 << 10, 1 << 20, 64 << 20):
            plan = bench.tasks_of(message, threads * socks, 1)
            used = sum(1 for p in plan if p)
            assert sum(map(sum, plan)) == message and all(t >= min(message, MIN_TASK_BYTES) for p in plan for t in p[:-1])
            assert used == min(threads * socks, math.ceil(message / MIN_TASK_BYTES))
            setup = SocketSetup(threads, socks, "test")
            assert setup.engaged_threads(message, slice_steps=8) == min(threads, used)  # one message in flight


def test_more_threads_never_slower_until_the_copies_cores_or_link_saturate(wide):
    """Each helper thread copies on a core of its own: far below the link two threads move twice one's bytes,
    more never slow a run, and the rate stops at the link (never above the same ports with RDMA) or the cores."""
    ranks = [0, 8]
    for topo in (wide, system_or_cluster("hgx-h200", 2, "400gbe", 1)):
        times = [_time(topo, ["NCCL_NET=Socket", f"NCCL_SOCKET_NTHREADS={t}"], ranks=ranks) for t in (0, 1, 2, 4, 16)]
        assert all(b <= a * (1 + 1e-9) for a, b in zip(times, times[1:]))
        assert times[0] > 1.5 * times[1]  # a helper thread a side against half a proxy thread's core
        assert times[-1] >= _time(topo, [], ranks=ranks) * (1 - 1e-9)
        assert times[-1] == pytest.approx(times[-2])  # the link sets the pace
    s = nccl.analyse(wide, ranks, env=parse_nccl_env(["NCCL_NET=Socket", "NCCL_SOCKET_NTHREADS=16"]))
    one, two = (replace(s.socket, setup=SocketSetup(t, 1, "test"), link_gbps=0.0) for t in (1, 2))
    assert two.node_gbps(1 << 20) == pytest.approx(2 * one.node_gbps(1 << 20))  # threads add up below the cores
    assert 2 * s.socket.connections * 16 > s.socket.cores  # more threads than cores: the cores' copies
    assert s.socket.node_gbps(1 << 20) == pytest.approx(s.socket.cores * s.socket.host.per_core_gbps / 2)
    # no helper thread: the rank's proxy thread copies its sends and receives on one core, half a core each way
    proxy = nccl.analyse(wide, ranks, env=parse_nccl_env(["NCCL_NET=Socket"]))
    assert proxy.socket.node_gbps(1 << 20) == pytest.approx(proxy.socket.host.per_core_gbps / 2)


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "broadcast", "all_to_all"])
def test_sockets_never_faster_than_rdma_on_the_same_link(collective):
    for link, nics in (("100gbe", 1), ("400gbe", 1), ("hdr", 2)):
        topo = system_or_cluster("pcie-4gpu", 2, link, nics)
        rdma = ["NCCL_NET=IB"]  # on 100 GbE: the same NIC with RoCE
        for settings in (["NCCL_NET=Socket"], ["NCCL_IB_DISABLE=1", "NCCL_SOCKET_NTHREADS=4"],
                         ["NCCL_NET=Socket", "NCCL_SOCKET_NTHREADS=16", "NCCL_NSOCKS_PERTHREAD=4"]):
            for nbytes in (1 << 20, 64 << 20, GIB):
                assert _time(topo, settings, collective, nbytes) >= _time(topo, rdma, collective, nbytes) * (1 - 1e-9)


def test_ethernet_without_rdma_goes_over_sockets_and_nccl_net_chooses():
    def socket_of(link, settings=()):
        topo = system_or_cluster("pcie-4gpu", 2, link, 1)
        return nccl.analyse(topo, _ranks(topo), env=parse_nccl_env(list(settings))).socket

    assert socket_of("10gbe") is not None and socket_of("100gbe") is not None
    assert socket_of("100gbe", ["NCCL_NET=IB"]) is None  # a RoCE NIC, said so
    assert socket_of("400gbe") is None and socket_of("ndr") is None
    assert socket_of("400gbe", ["NCCL_NET=Socket"]) is not None and socket_of("ndr", ["NCCL_IB_DISABLE=1"]) is not None


def test_p2p_and_shm_disabled_cut_the_host_into_nccls_nodes(h200):
    """paths.cc marks pairs neither P2P nor SHM joins PATH_NET and ncclTopoTrimSystem cuts them apart: each GPU is
    a node to NCCL's tuning, across the network (NET latencies, one GPU per node), through loopback when sockets;
    where P2P still joins some GPUs (a level), they stay one node."""
    env = parse_nccl_env(["NCCL_P2P_DISABLE=1,NCCL_SHM_DISABLE=1", "NCCL_NET=Socket"])
    s = nccl.analyse(h200, [0, 1, 2, 3], env=env)
    assert (s.n_nodes, s.ppn, s.hw) == (4, 1, "net") and s.socket.loopback and not s.nvls
    joined = nccl.analyse(h200, [0, 1, 2, 3], env=parse_nccl_env(["NCCL_P2P_LEVEL=NVL", "NCCL_SHM_DISABLE=1"]))
    assert joined.n_nodes == 1  # NVLink everywhere: P2P joins them all
    # the host's loopback is shared: more ranks on it, each moves no more
    four = _time(h200, ["NCCL_P2P_DISABLE=1,NCCL_SHM_DISABLE=1,NCCL_NET=Socket,NCCL_SOCKET_NTHREADS=16"], ranks=[0, 1, 2, 3])
    eight = _time(h200, ["NCCL_P2P_DISABLE=1,NCCL_SHM_DISABLE=1,NCCL_NET=Socket,NCCL_SOCKET_NTHREADS=16"], ranks=list(range(8)))
    assert GIB / eight <= GIB / four * (1 + 1e-9)


def test_a_measured_host_replaces_the_published_one(monkeypatch, wide):
    """benchmarks/tcp_loopback.py's JSON, for a host of the same CPU model (its clock and marks aside), gives the
    socket path its per-core rate and latency: a faster core runs faster, and its one-way latency adds once per
    network step."""
    cpu = next(n.attrs.get("model") for n in wide.nodes.values() if n.kind == "cpu")
    monkeypatch.setattr(net_socket, "measured_hosts", lambda: ())   # whatever measurements the package ships
    base = tcp_host(cpu)
    assert base.source.startswith("published")
    ranks = [0, 8]

    def measured(per_core, latency_s):
        row = {"kind": "tcp-loopback", "cpu_model": f"{cpu.replace('Intel', 'Intel(R)')} CPU @ 2.10GHz",
               "date": "2030-01-01", "file": "x.json",
               "summary": {"per_core_gbps": per_core, "loopback_gbps": 50.0, "latency_s": latency_s}}
        monkeypatch.setattr(net_socket, "measured_hosts", lambda: (row,))
        wide.route_cache.clear()
        small = nccl.predict(wide, "all_reduce", ranks, 1 << 10, nccl_algo="ring", proto="Simple",
                             env=parse_nccl_env(["NCCL_NET=Socket"])).time_s
        return small, _time(wide, ["NCCL_NET=Socket"], ranks=ranks)

    (small_slow, big_slow), (small_late, _) = measured(base.per_core_gbps, 0.0), measured(base.per_core_gbps, 1e-5)
    _, big_fast = measured(2 * base.per_core_gbps, 0.0)
    assert big_fast < big_slow
    assert small_late - small_slow == pytest.approx(2 * (2 - 1) * 1e-5, rel=1e-6)  # ring all-reduce: 2(nodes-1)
    wide.route_cache.clear()


def test_ll128_needs_gpudirect_across_nodes():
    """tuning.cc enables LL128 only where the GPU reaches its NIC within PXN; without GPUDirect RDMA (the socket
    transport never has it) the path goes through the CPU."""
    topo = system_or_cluster("hgx-h200", 2, "ndr", 8)
    offered = lambda env: {p for a, p, _ in nccl.tuning.tuning_table(  # noqa: E731
        nccl.analyse(topo, [0, 1, 8, 9], env=parse_nccl_env(env)), nccl.constants()).offered("all_reduce")}
    assert "LL128" in offered([]) and "LL128" not in offered(["NCCL_NET=Socket"])
