"""Network ports from a faked sysfs tree, PCIe relations from PCI paths, and hosts joined into one topology."""
from pathlib import Path

import pytest

from meshscale.errors import MeshscaleError
from meshscale.topology.discover import cpu_topology
from meshscale.topology.multinode import HostReport, hostname, join_hosts, network_ports
from meshscale.topology.nics import Port, discover_ports, gpu_pci_path, pci_relation


def _device(root: Path, chain: str, numa: int) -> Path:
    device = root / "sys/devices" / chain
    device.mkdir(parents=True, exist_ok=True)
    (device / "numa_node").write_text(str(numa))
    return device


def _iface(root: Path, name: str, state: str, speed: str | None, device: Path | None) -> None:
    iface = root / "sys/class/net" / name
    iface.mkdir(parents=True)
    (iface / "operstate").write_text(state + "\n")
    if speed is not None:
        (iface / "speed").write_text(speed + "\n")
    if device is not None:
        (iface / "device").symlink_to(device)


def fake_sysfs(root: Path) -> Path:
    """eth0 (100 GbE, NUMA 1), eth1 (down, speed unknown), lo and a bridge (virtual), mlx5_0 with ib0 as its
    netdev (NDR, ACTIVE) and mlx5_1 (RoCE port, DOWN); a GPU at 0000:18:00.0 beside mlx5_0."""
    eth0 = _device(root, "pci0000:5d/0000:5d:00.0/0000:5e:00.0", 1)
    eth1 = _device(root, "pci0000:5d/0000:5d:02.0/0000:60:00.0", 1)
    mlx0 = _device(root, "pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:04.0/0000:1b:00.0", 0)
    mlx1 = _device(root, "pci0000:9a/0000:9a:00.0/0000:9b:00.0", 1)
    gpu = _device(root, "pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:00.0/0000:1a:00.0", 0)
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    (root / "sys/bus/pci/devices/0000:1a:00.0").symlink_to(gpu)
    _iface(root, "eth0", "up", "100000", eth0)
    _iface(root, "eth1", "down", "-1", eth1)
    _iface(root, "lo", "unknown", None, None)
    _iface(root, "docker0", "up", None, None)
    _iface(root, "ib0", "up", "400000", mlx0)
    for dev, device, state, rate, layer in (("mlx5_0", mlx0, "4: ACTIVE", "400 Gb/sec (4X NDR)", "InfiniBand"),
                                            ("mlx5_1", mlx1, "1: DOWN", "100 Gb/sec (4X EDR)", "Ethernet")):
        port = root / "sys/class/infiniband" / dev / "ports/1"
        port.mkdir(parents=True)
        (port / "state").write_text(state)
        (port / "rate").write_text(rate)
        (port / "link_layer").write_text(layer)
        (root / "sys/class/infiniband" / dev / "device").symlink_to(device)
    return root


def test_ports_from_sysfs(tmp_path):
    ports = {p.name: p for p in discover_ports(fake_sysfs(tmp_path))}
    assert list(ports) == ["mlx5_0/1", "mlx5_1/1", "eth0", "eth1"]  # lo, docker0 virtual; ib0 is mlx5_0's
    ib = ports["mlx5_0/1"]
    assert (ib.kind, ib.state, ib.rate_gbits, ib.numa, ib.link_layer) == ("infiniband", "ACTIVE", 400.0, 0, "InfiniBand")
    assert ib.pci_path[-1] == "0000:1b:00.0" and ib.pci_path[0] == "pci0000:17" and ib.usable
    assert ib.bandwidth_bytes_per_s == 50e9
    assert not ports["mlx5_1/1"].usable and ports["mlx5_1/1"].link_layer == "Ethernet"
    assert (ports["eth0"].state, ports["eth0"].rate_gbits, ports["eth0"].numa) == ("up", 100.0, 1)
    assert ports["eth1"].rate_gbits is None and not ports["eth1"].usable


def test_no_sysfs_means_no_ports(tmp_path):
    assert discover_ports(tmp_path / "nothing") == []


def test_pci_relations_follow_nvidia_smi(tmp_path):
    root = fake_sysfs(tmp_path)
    numa, gpu = gpu_pci_path("00000000:1A:00.0", root)
    ports = {p.name: p for p in discover_ports(root)}
    assert numa == 0 and gpu[-1] == "0000:1a:00.0"
    assert pci_relation(gpu, numa, ports["mlx5_0/1"].pci_path, 0) == "PIX"  # one switch between them
    deeper = ("pci0000:17", "0000:17:00.0", "0000:18:00.0", "0000:19:08.0", "0000:30:00.0", "0000:31:00.0", "0000:32:00.0")
    assert pci_relation(gpu, 0, deeper, 0) == "PXB"  # a second switch below the shared one
    assert pci_relation(gpu, 0, ("pci0000:17", "0000:17:02.0", "0000:40:00.0"), 0) == "PHB"  # another root port
    assert pci_relation(gpu, 0, ports["eth0"].pci_path, 0) == "NODE"  # another root complex, same NUMA node
    assert pci_relation(gpu, 0, ports["eth0"].pci_path, 1) == "SYS"


def test_network_ports_prefer_active_infiniband_then_the_fastest_ethernet(tmp_path):
    ports = discover_ports(fake_sysfs(tmp_path))
    assert [p.name for p in network_ports(ports)] == ["mlx5_0/1"]
    eth = [Port("eth0", "ethernet", "up", 25.0), Port("eth1", "ethernet", "up", 100.0), Port("eth2", "ethernet", "down", 400.0)]
    assert [p.name for p in network_ports(eth)] == ["eth1"]
    assert network_ports([])[0].rate_gbits == 10.0 and "assumed" in network_ports([])[0].rate_text


def test_hostname_override(monkeypatch):
    monkeypatch.setenv("MESHSCALE_HOSTNAME", "node-a")
    assert hostname() == "node-a" and cpu_topology(1).nodes["host"].attrs["hostname"] == "node-a"


def test_two_hosts_join_with_global_indices_and_their_network(tmp_path):
    ports = discover_ports(fake_sysfs(tmp_path))
    joined = join_hosts([HostReport("a", cpu_topology(2), ports), HostReport("b", cpu_topology(2), ports)])
    assert [(d, joined.nodes[d].index) for d in joined.devices()] == [
        ("n0/worker0", 0), ("n0/worker1", 1), ("n1/worker0", 2), ("n1/worker1", 3)]
    assert joined.attrs["hosts"] == ["a", "b"] and joined.title.startswith("2 hosts (a, b): 2x CPU process (Gloo)")
    to_switch = [l for l in joined.links if l.b == "l1/0"]
    assert [(l.a, l.kind, l.bandwidth_bytes_per_s) for l in to_switch] == [
        ("n0/nic0", "infiniband", 50e9), ("n1/nic0", "infiniband", 50e9)]
    from meshscale.collectives.bounds import busbw_bound
    assert busbw_bound(joined, "all_reduce", [0, 1, 2, 3], 0) > 0


def test_hosts_that_disagree_are_one_line_error():
    with pytest.raises(MeshscaleError) as info:
        join_hosts([HostReport("a", cpu_topology(2)), HostReport("b", cpu_topology(1))])
    message = str(info.value)
    assert "\n" not in message and "a has 2x" in message and "b has 1x" in message


def test_two_gpu_hosts_join_and_the_network_port_bounds_the_ring():
    from conftest import FakeNVML

    from meshscale.collectives.bounds import busbw_bound
    from meshscale.simulate.cost import Call
    from meshscale.simulate.fabric import Fabric
    from meshscale.topology.nvml_discovery import nvml_topology

    host = nvml_topology(FakeNVML.from_dump(), sm_counts={})
    ndr = [Port("mlx5_0/1", "infiniband", "ACTIVE", 400.0, 0, (), "InfiniBand", "400 Gb/sec (4X NDR)")]
    joined = join_hosts([HostReport("a", host, ndr), HostReport("b", host, ndr)])
    assert [joined.nodes[d].index for d in joined.gpus()] == [0, 1, 2, 3]
    assert joined.title == "2 hosts (a, b): 2x NVIDIA H200 each, joined by 400 Gb/sec (4X NDR)"
    assert busbw_bound(joined, "all_reduce", [0, 1, 2, 3], 0) == pytest.approx(50e9)  # NDR, not the NIC's slot
    predicted = Fabric(joined).cost(Call("all_reduce", 1 << 28, tuple([0, 1, 2, 3])))
    assert 0 < predicted.busbw_bytes_per_s <= 50e9 * 1.01
