"""One topology for ranks on several hosts: each host's own discovered topology and network ports, joined
through one network switch (the hosts of one job usually hang off one leaf; a deeper tree is `cluster.py`'s).

Device indices follow torchrun's ranks: host k's local device i is k * devices_per_host + i. Hosts must agree
on their rank devices (count and model), or the bound of a collective over them means nothing.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from meshscale.errors import MeshscaleError
import meshscale.topology.links as calc
from meshscale.topology.fabric import Cluster, NetLink, network_of
from meshscale.topology.model import DEFAULT_LATENCY_S, Link, Node, Topology
from meshscale.topology.nics import Port

HOSTNAME_ENV = "MESHSCALE_HOSTNAME"  # overrides the hostname, so that agents on one machine act as hosts
ASSUMED_PORT = Port("assumed", "ethernet", "up", 10.0, rate_text="10 GbE assumed (no port with a known rate)")


def network_assumed(attrs: dict) -> bool:
    """True when a joined topology's ``attrs`` say some host had no port of a known rate (`ASSUMED_PORT`)."""
    return any(ASSUMED_PORT.name in ports for ports in (attrs.get("network_ports") or {}).values())


def hostname() -> str:
    """This host's name for joining: $MESHSCALE_HOSTNAME when set, else the kernel's node name."""
    return os.environ.get(HOSTNAME_ENV) or os.uname().nodename


@dataclass
class HostReport:
    """What one host says about itself: its name, its topology (its ranks' devices) and its network ports."""

    hostname: str
    topology: Topology
    ports: list[Port] = field(default_factory=list)

    def devices_text(self) -> str:
        devices = self.topology.devices()
        models = sorted({str(self.topology.nodes[d].attrs.get("model", "?")) for d in devices})
        return f"{len(devices)}x {', '.join(models)}"


def check_hosts_agree(reports: list[HostReport]) -> None:
    """A one-line error when hosts have different rank devices (count or model)."""
    if not reports:
        raise MeshscaleError("no host reported its topology; every node's local rank 0 must report")
    first = reports[0]
    for other in reports[1:]:
        if other.devices_text() != first.devices_text():
            raise MeshscaleError(f"hosts disagree: {first.hostname} has {first.devices_text()}, {other.hostname} has "
                                 f"{other.devices_text()}; run the same number and model of devices on every node")


def network_ports(ports: list[Port]) -> list[Port]:
    """The ports a host's traffic to other hosts uses: every active InfiniBand port (NCCL spreads over them),
    else its fastest Ethernet interface that is up, else an assumed 10 GbE port."""
    ib = [p for p in ports if p.kind == "infiniband" and p.usable and p.rate_gbits]
    if ib:
        return ib
    eth = [p for p in ports if p.kind == "ethernet" and p.usable and p.rate_gbits]
    return [max(eth, key=lambda p: p.rate_gbits)] if eth else [ASSUMED_PORT]


def _port_kind(port: Port) -> str:
    return "ethernet" if port.kind == "ethernet" or port.link_layer.lower() == "ethernet" else "infiniband"


def node_copy(topology: Topology, k: int, first_index: int, **attrs) -> tuple[dict[str, Node], list[Link]]:
    """Node (or host) ``k`` of a cluster: every node and link of ``topology`` named ``n<k>/...``, marked with
    ``node=k`` (and ``attrs``), its devices numbered from ``first_index`` as the cluster's ranks are."""
    return node_copy_nodes(topology, k, first_index, **attrs), node_copy_links(topology, k)


def node_copy_nodes(topology: Topology, k: int, first_index: int, **attrs) -> dict[str, Node]:
    """The nodes of `node_copy`."""
    p = f"n{k}/"
    base = min((topology.nodes[d].index for d in topology.devices()), default=0)
    nodes = {}
    for n in topology.nodes.values():
        node_attrs = dict(n.attrs, node=k, **attrs)
        if n.kind in ("gpu", "worker") and n.index is not None:
            node_attrs["index"] = first_index + n.index - base
        nodes[p + n.name] = Node(p + n.name, n.kind, node_attrs)
    return nodes


def node_copy_links(topology: Topology, k: int) -> list[Link]:
    """The links of `node_copy`."""
    p = f"n{k}/"
    return [Link(**{**vars(l), "a": p + l.a, "b": p + l.b}) for l in topology.links]


def join_hosts(reports: list[HostReport]) -> Topology:
    """The hosts' topologies as one, host k's nodes prefixed ``n<k>/``, their network ports as NICs on one
    switch ``l1/0``; its `Cluster` is the network the hosts found (or the 10 GbE assumed where a host found
    none), with that network's own switch and NIC latencies. Raises `MeshscaleError` when the hosts disagree
    on their rank devices."""
    check_hosts_agree(reports)
    per_host = len(reports[0].topology.devices())
    used = {r.hostname: network_ports(r.ports) for r in reports}
    # the slowest port any host uses: a collective across the hosts runs at its pace
    net = min((network_of(_port_kind(p), p.bandwidth_bytes_per_s) for ps in used.values() for p in ps),
              key=lambda n: (n.bandwidth_bytes_per_s, n.kind != "ethernet"))
    nodes: dict[str, Node] = {}
    links: list[Link] = []
    for k, report in enumerate(reports):
        prefix, topo = f"n{k}/", report.topology
        copied, copied_links = node_copy(topo, k, k * per_host, hostname=report.hostname)
        nodes.update(copied)
        links += copied_links
        for j, port in enumerate(used[report.hostname]):
            kind = _port_kind(port)
            nic = f"{prefix}nic{j}"
            # an InfiniBand device's port does RDMA (also RoCE, its link layer Ethernet); an Ethernet interface not
            nodes[nic] = Node(nic, "nic", {"port": port.name, "port_kind": kind, "port_rate": port.rate_text
                                           or f"{port.rate_gbits:g} Gb/s", "numa": port.numa, "node": k,
                                           "rdma": port.kind == "infiniband"})
            generation = _nic_pcie_generation(port.bandwidth_bytes_per_s)
            links.append(Link(nic, prefix + _attach_point(topo, port), "pcie", calc.pcie_bandwidth(generation, 16),
                              DEFAULT_LATENCY_S["pcie"], generation=generation, width=16))
            links.append(Link(nic, "l1/0", kind, port.bandwidth_bytes_per_s, net.system_latency_s / 2))
    nodes["l1/0"] = Node("l1/0", "net_switch", {"level": 1, "latency_s": net.switch_latency_s})
    names = [r.hostname for r in reports]
    title = (f"{len(reports)} hosts ({', '.join(names)}): {reports[0].devices_text()} each, joined by "
             f"{', '.join(sorted({p.rate_text or p.name for ps in used.values() for p in ps}))}")
    attrs = {"source": "joined hosts", "hosts": names,
             "network_ports": {h: [p.name for p in ps] for h, ps in used.items()},
             "bandwidth_source": reports[0].topology.attrs.get("bandwidth_source", "")}
    return Topology(f"{len(reports)}-hosts", nodes, links, title, attrs, _joined_cluster(reports, used, net))


def _joined_cluster(reports: list[HostReport], used: dict[str, list[Port]], net: NetLink) -> Cluster:
    """The hosts under one switch: one level, every host on the one leaf; one message crosses both NIC links
    and the switch."""
    nics = min(len(ps) for ps in used.values())
    return Cluster(reports[0].topology.name, len(reports), nics, net, net.name, levels=1,
                   nodes_per_leaf=len(reports), switches=(1,), latency_s=net.system_latency_s + net.switch_latency_s,
                   radix=net.radix)


def _attach_point(topo: Topology, port: Port) -> str:
    """Where a NIC hangs in its host: the CPU of its NUMA node (its PCIe switch is not in NVML's tree)."""
    cpus = topo.nodes_of("cpu")
    near = [c for c in cpus if topo.nodes[c].attrs.get("numa") == port.numa]
    return (near or cpus or topo.nodes_of("host") or topo.devices())[0]


def _nic_pcie_generation(port_bytes_per_s: float) -> int:
    """The PCIe generation of a x16 slot that carries the port's rate (sysfs does not say; NDR needs gen 5)."""
    return next((g for g in (3, 4) if calc.pcie_bandwidth(g, 16) >= port_bytes_per_s), 5)
