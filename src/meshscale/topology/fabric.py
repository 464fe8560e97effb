"""The network that joins a cluster's nodes, as one typed description: `NetLink` (a kind of port: rate, switch
radix, latencies) and `Cluster` (the node type, how many, their ports, the network's sizing, leaf map and
latency), which a `Topology` of several nodes carries as ``topology.cluster``.

Catalog clusters and cluster files (`cluster.build_cluster`) and hosts joined under torchrun
(`multinode.join_hosts`) all produce a `Cluster`; every reader (NCCL's model of the network, the network fit,
the bound, the exchange of a training step) takes it from there.
"""
from __future__ import annotations

from dataclasses import dataclass

from meshscale.errors import TopologyError
import meshscale.topology.links as calc
from meshscale.units import is_digits


@dataclass(frozen=True)
class NetLink:
    """One kind of network port: its data rate, nominal rate, the usual switch radix and latencies."""

    name: str
    kind: str                     # "infiniband" or "ethernet"
    bandwidth_bytes_per_s: float  # data rate per direction
    nominal_gbits: float          # marketing rate per direction (EDR 100, 10 GbE 10)
    radix: int                    # ports of a typical switch
    switch_latency_s: float       # per switch hop
    system_latency_s: float       # NIC to NIC, both NIC links together, without the switches
    whitepaper_encoding: float    # the DGX-1 whitepaper counts IB bisection as nominal x 64/66 (table 1, note a)
    rdma: bool = True             # its NICs do RDMA (InfiniBand, RoCE): NCCL's IB transport; else TCP sockets


NET_LINKS = {
    "edr": NetLink("edr", "infiniband", calc.infiniband_bandwidth("edr"), 100, 36, 0.09e-6, 1.01e-6, 64 / 66),
    "hdr": NetLink("hdr", "infiniband", calc.infiniband_bandwidth("hdr"), 200, 40, 0.13e-6, 1.01e-6, 64 / 66),
    "ndr": NetLink("ndr", "infiniband", calc.infiniband_bandwidth("ndr"), 400, 64, 0.13e-6, 1.01e-6, 64 / 66),
    # XDR: Quantum-X800 Q3400 switches have 144 ports of 800 Gb/s (NVIDIA Quantum-X800 datasheet); no switch or
    # NIC latency is published for it, so NDR's stand
    "xdr": NetLink("xdr", "infiniband", calc.infiniband_bandwidth("xdr"), 800, 144, 0.13e-6, 1.01e-6, 64 / 66),
    # commodity Ethernet: NICs without RDMA, so NCCL's socket transport (a RoCE NIC: NCCL_NET=IB)
    "10gbe": NetLink("10gbe", "ethernet", calc.ethernet_bandwidth(10), 10, 48, 0.5e-6, 3.5e-6, 1.0, rdma=False),
    "25gbe": NetLink("25gbe", "ethernet", calc.ethernet_bandwidth(25), 25, 48, 0.5e-6, 3.5e-6, 1.0, rdma=False),
    "100gbe": NetLink("100gbe", "ethernet", calc.ethernet_bandwidth(100), 100, 32, 0.4e-6, 3.0e-6, 1.0, rdma=False),
    # 400GbE / 800GbE: NVIDIA Spectrum-X, RoCE (RDMA over Converged Ethernet) end to end
    "400gbe": NetLink("400gbe", "ethernet", calc.ethernet_bandwidth(400), 400, 64, 0.4e-6, 3.0e-6, 1.0),
    # 800GbE: Spectrum-X800 SN5600 switches have 64 ports of 800GbE (NVIDIA Spectrum-X800 datasheet); latencies as
    # 400GbE's
    "800gbe": NetLink("800gbe", "ethernet", calc.ethernet_bandwidth(800), 800, 64, 0.4e-6, 3.0e-6, 1.0),
}


STATED_RADIX = 64  # switch ports assumed for a network given by its rate alone
NETWORKS = ("fat-tree", "rail")
# where a job's nodes sit on an oversubscribed tree: each on a leaf of its own whose up-links the leaf's other
# (busy) nodes share, as a shared cluster's scheduler may place them; or packed on the fewest leaves
PLACEMENTS = ("spread", "packed")
PLACEMENT_HELP = ("the job's nodes on an oversubscribed tree: spread (default: each on a leaf of its own, whose "
                  "up-links the leaf's other busy nodes share k:1, as a shared cluster places them) or packed (the "
                  "fewest leaves: topology-aware scheduling, or a cluster of your own)")


def net_link(name: str) -> NetLink:
    """The port kind called ``name`` (edr, hdr, ndr, xdr, 10gbe, 25gbe, 100gbe, 400gbe, 800gbe), or one stated by its rate and
    latency (``25GB/s,5us``, ``100Gb/s,2us``: see `links.parse_network_rate`). A stated latency is NIC to NIC,
    switches included; without one, InfiniBand EDR's figures stand. A stated network is taken to be an RDMA
    fabric (NCCL's IB transport), on switches of `STATED_RADIX` ports."""
    if name.lower() in NET_LINKS:
        return NET_LINKS[name.lower()]
    if not any(is_digits(ch) for ch in name):
        raise TopologyError(f"unknown network link {name!r}; use one of {', '.join(NET_LINKS)} "
                            "or a stated rate such as 25GB/s,5us") from None
    bytes_per_s, latency_s = calc.parse_network_rate(name)
    edr = NET_LINKS["edr"]
    switch_s, system_s = (0.0, latency_s) if latency_s is not None else (edr.switch_latency_s, edr.system_latency_s)
    label = f"{bytes_per_s / 1e9:g}GBps" + (f"-{latency_s * 1e6:g}us" if latency_s is not None else "")
    return NetLink(label, "infiniband", bytes_per_s, bytes_per_s * 8 / 1e9, STATED_RADIX,
                   switch_s, system_s, 1.0)



def network_of(kind: str, bytes_per_s: float) -> NetLink:
    """The `NetLink` of a port found on a host: the catalog's port of that kind and data rate (an HDR port is
    HDR, with HDR's switch and NIC latencies; an assumed 10 GbE one is 10 GbE's), else one of that rate with the
    latencies of the catalog's port of that kind nearest in rate."""
    same_kind = [n for n in NET_LINKS.values() if n.kind == kind]
    if not same_kind:
        raise TopologyError(f"unknown network kind {kind!r}; use infiniband or ethernet")
    nearest = min(same_kind, key=lambda n: abs(n.bandwidth_bytes_per_s / bytes_per_s - 1))
    if abs(nearest.bandwidth_bytes_per_s / bytes_per_s - 1) < 1e-3:
        return nearest
    return NetLink(f"{bytes_per_s / 1e9:g}GBps-{kind}", kind, bytes_per_s, bytes_per_s * 8 / 1e9, nearest.radix,
                   nearest.switch_latency_s, nearest.system_latency_s, nearest.whitepaper_encoding, nearest.rdma)


@dataclass(frozen=True)
class Cluster:
    """``nodes`` copies of the system ``node`` (a catalog name or a file; for joined hosts the first host's own
    topology name), each with ``nics`` ports of ``net``, on a fat tree or a rail-optimized network of ``levels``
    levels: ``switches`` per level, level 1 first, ``nodes_per_leaf`` nodes per leaf (per rail group on rails).
    ``latency_s``: one message node to node in the worst case, NIC links and switch hops included."""

    node: str
    nodes: int
    nics: int
    net: NetLink
    link: str                      # the network as ``--link`` spells it (edr, 25GB/s,5us): how to build it again
    levels: int
    nodes_per_leaf: int
    switches: tuple[int, ...]
    latency_s: float
    network: str = "fat-tree"      # or "rail"
    oversubscription: float = 1.0
    gpudirect: bool = True
    radix: int = 0
    placement: str = "spread"      # a job's nodes on an oversubscribed tree (PLACEMENTS)

    @property
    def rails(self) -> int:
        """Rails of a rail-optimized network (one per NIC of a node); 0 on a fat tree."""
        return self.nics if self.network == "rail" else 0

    @property
    def node_bandwidth_bytes_per_s(self) -> float:
        """One node into the network, per direction (all its ports)."""
        return self.nics * self.net.bandwidth_bytes_per_s

    def leaves_of_node(self, k: int) -> list[int]:
        """The level-1 switch of each NIC of node ``k``: all on its leaf in a fat tree, NIC j on rail j's leaf
        of its group in a rail network."""
        group = k // self.nodes_per_leaf
        if self.rails:
            return [group * self.rails + j for j in range(self.nics)]
        return [group] * self.nics
