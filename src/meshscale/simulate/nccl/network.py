"""The network between nodes as NCCL reaches it: each NIC's nearest GPU and path (GPUDirect RDMA or staged
through host memory), a node's rate when every node sends around the ring, and the latency node to node; the
per-node view of a cluster that searches inside a node use."""
from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from meshscale.simulate.nccl.tables import PATH_TYPES, cpu_class, host_memory_of
from meshscale.simulate.nccl_env import DEFAULT_ENV, NcclEnv
from meshscale.topology import Topology, route
from meshscale.topology.cluster import ClusterTopology
from meshscale.topology.fabric import NET_LINKS
from meshscale.topology.queries import path_class


# A PCIe transaction as an SM's copies cause it (PCI Express Base Specification, Gen3 and later): 128 B of payload
# (the SM's memory transaction; NVIDIA's sjeaugey in NVIDIA/nccl-tests #149: "SMs are limited to 128B payload
# size") in a TLP that adds a 4 B framing token, a 16 B header (4 DW, 64-bit address) and a 4 B LCRC.
PCIE_TLP_PAYLOAD_BYTES = 128
PCIE_TLP_OVERHEAD_BYTES = 4 + 16 + 4
REFERENCE_NET_LATENCY_S = 1.28e-6  # EDR InfiniBand, NIC to NIC over a two-level fat tree (3 switch hops)
GDR_PATH_TYPES = ("PIX", "PXB")  # NCCL_NET_GDR_LEVEL's default: GPUDirect RDMA only through PCIe switches


@dataclass
class NicPath:
    """One NIC as NCCL drives it: its nearest GPU, the path type between them, whether GPUDirect RDMA is used,
    and the GB/s the node gets through it."""

    nic: str
    gpu: str
    path_type: str
    gdr: bool
    port_gbps: float
    gbps: float
    staged_latency_s: float = 0.0  # without GPUDirect RDMA: the legs through host memory each message crosses
    socket: bool = False           # NCCL's socket transport through it (`nccl_env.NcclEnv.uses_socket`)
    vendor: str | None = None      # its PCI vendor (the system file's ``pci_vendor``): NCCL's socket defaults


def links_gbps(topo: Topology, directed: list, c: dict) -> dict:
    """(link index, direction) -> GB/s as NCCL rates it, for the links a path crosses."""
    out = {}
    for i, d in directed:
        link = topo.links[i]
        if link.kind in ("qpi", "upi"):
            out[(i, d)] = c["inter_cpu_bw"][cpu_class(topo.nodes[link.a].attrs.get("model", ""))]
        else:
            out[(i, d)] = pci_gbps(link, c) if link.kind == "pcie" else link.bandwidth_bytes_per_s / 1e9
    return out


def host_run_gbps(link, nccl_gbps: float) -> float:
    """GB/s a run moves over ``link`` on its way to or from host memory (the SHM transport), where NCCL's search
    rates the link conservatively (PCIe Gen5 x16 at 48): a PCIe link's data rate after line encoding (the
    topology's figure: 63 GB/s for Gen5 x16) times the share of each transaction that is payload (an SM's
    128 B per write or read completion, `PCIE_TLP_PAYLOAD_BYTES`, against `PCIE_TLP_OVERHEAD_BYTES`); the CPUs'
    link at the topology's figure; anything else at NCCL's rating."""
    if link.kind == "pcie" and link.bandwidth_bytes_per_s:
        payload = PCIE_TLP_PAYLOAD_BYTES / (PCIE_TLP_PAYLOAD_BYTES + PCIE_TLP_OVERHEAD_BYTES)
        return link.bandwidth_bytes_per_s / 1e9 * payload
    if link.kind in ("qpi", "upi") and link.bandwidth_bytes_per_s:
        return link.bandwidth_bytes_per_s / 1e9
    return nccl_gbps


def host_memory_gbps(topo: Topology, cpu: str) -> float:
    """GB/s the memory of ``cpu`` moves (its channels x transfer rate x 8 B, the CPU's datasheet): the node's own
    ``memory_bandwidth_bytes_per_s`` where the system file gives it, else the CPU model's row of the data file's
    ``host_memory`` table; 0 where neither knows it (the model then leaves host memory out)."""
    attrs = topo.nodes[cpu].attrs
    if attrs.get("memory_bandwidth_bytes_per_s"):
        return float(attrs["memory_bandwidth_bytes_per_s"]) / 1e9
    return host_memory_of(str(attrs.get("model", "")))


def pci_gbps(link, c: dict) -> float:
    rate = c["pci_rate_per_lane"].get(link.generation or 3, 60)
    return (link.width or 16) * rate / 80 * (link.count or 1)


def nic_rdma(topo: Topology, nic: str) -> bool:
    """Whether a NIC does RDMA (NCCL's IB transport): its ``rdma`` attribute where given (a cluster's NICs carry
    their network's, joined hosts' their port's), else InfiniBand yes and Ethernet as the catalog's port of its
    rate says (10/25/100 GbE no, 400/800 GbE RoCE yes; a rate it does not know: no)."""
    attrs = topo.nodes[nic].attrs
    if isinstance(attrs.get("rdma"), bool):
        return attrs["rdma"]
    if str(attrs.get("port_kind", "infiniband")).lower() != "ethernet":
        return True
    net = NET_LINKS.get(str(attrs.get("port_rate", "")).lower())
    return bool(net and net.rdma)


def port_gbps(topo: Topology, nic: str) -> float:
    return sum(l.bandwidth_bytes_per_s for l in topo.links_of(nic) if l.kind in ("infiniband", "ethernet")) / 1e9 \
        or float(topo.nodes[nic].attrs.get("port_gbps", 0) or 0) or _catalog_port_gbps(topo, nic)


def _catalog_port_gbps(topo: Topology, nic: str) -> float:
    """A system file's NIC without its network link: the port its ``port_rate`` names (ndr, 100gbe...)."""
    rate = str(topo.nodes[nic].attrs.get("port_rate", "")).lower()
    return NET_LINKS[rate].bandwidth_bytes_per_s / 1e9 if rate in NET_LINKS else 0.0


def node_view(topo: Topology, k: int) -> Topology:
    """Node ``k`` of a cluster on its own (its nodes and the links among them), built once per topology: the
    routes inside a node are found there, not by a max-flow over the whole cluster's graph. A topology of one
    node is its own view."""
    if isinstance(topo, ClusterTopology) and 0 <= k < topo.plan.spec.nodes:
        return topo.node_view(k)  # node k's part, not a scan of the whole cluster
    key = ("meshscale.simulate.nccl.node_view", k)
    if key not in topo.route_cache:
        # a cluster marks every node's parts with node=k; its switches belong to no node
        # (in the topology's order, so that equally near NICs and GPUs pair alike on every run)
        names = {n: node for n, node in topo.nodes.items()
                 if node.attrs.get("node") is not None and int(node.attrs["node"]) == k}
        if not names or len(names) == len(topo.nodes):
            topo.route_cache[key] = topo
        else:
            topo.route_cache[key] = Topology(f"{topo.name}/n{k}", names,
                                             [l for l in topo.links if l.a in names and l.b in names], topo.title)
    return topo.route_cache[key]


def network_paths(topo: Topology, local: list[str], c: dict, env: NcclEnv = DEFAULT_ENV) -> list[NicPath]:
    """How NCCL reaches the network from the GPUs ``local`` of one node of a cluster. Each NIC serves its nearest
    GPU (NIC-GPU affinity). GPUDirect RDMA is used when the NIC allows it and the path is PIX or PXB (NCCL's
    default GDR level), or a Grace's NVLink-C2C and PCIe (`through_c2c`): the NIC reads GPU memory at the path's
    bottleneck. Otherwise the data is staged through host memory: GPU -> CPU -> NIC, and links both legs cross
    (a PCIe switch's up-link) carry it twice. Equally near GPUs are spread over the NICs, as NCCL's rings start on
    different GPUs. The socket transport (``env``, or a NIC without RDMA) stages through host memory too; what
    its threads copy is `net_socket.SocketRun`'s. In a rack of several hosts a NIC serves its own host's GPUs,
    routed inside that host."""
    k = node_of(topo, local[0])
    cluster, topo = topo, node_view(topo, k)  # ports from the cluster, routes inside the node
    out, served = [], set()
    for nic in topo.nodes_of("nic"):
        # a cluster's ports are its network links; one host's (P2P and SHM disabled: NCCL's nodes are its GPUs)
        # its NICs' own rates
        port = port_gbps(cluster, nic) if cluster.cluster is None else \
            sum(l.bandwidth_bytes_per_s for l in cluster.links_of(nic) if l.kind in ("infiniband", "ethernet")) / 1e9
        near = [g for g in local if same_host(topo, g, nic)]
        if port and near:  # a NIC of a host where the communicator has no rank: its ranks use their own hosts'
            out.append(_nic_path(host_part(topo, nic), nic, near, served, port, c, env))
    return out


def _nic_path(topo: Topology, nic: str, near: list[str], served: set, port: float, c: dict,
              env: NcclEnv) -> NicPath:
    """One NIC's `NicPath`: the nearest of the GPUs ``near`` (one no NIC serves yet, ``served``, among equals)."""
    shapes = []
    for g in near:
        path = route(topo, g, nic).paths[0]
        shapes.append((PATH_TYPES.index(path_class(topo, path.nodes, nccl=True)), g, path))
    _, gpu, path = min(shapes, key=lambda x: (x[0], x[1] in served))  # equally near: a GPU no NIC serves yet
    served.add(gpu)
    kind_name = path_class(topo, path.nodes, nccl=True)
    socket = env.uses_socket(nic_rdma(topo, nic))  # NET/Socket reads host memory only (NCCL_PTR_HOST)
    gdr = topo.nodes[nic].attrs.get("gpudirect_rdma", True) is not False and not socket \
        and (kind_name in GDR_PATH_TYPES or through_c2c(topo, path))
    staged_s = 0.0
    if gdr:
        gbps = min([port, *links_gbps(topo, path.directed_links, c).values()])
    else:
        cpus = [n for n in path.nodes if topo.nodes[n].kind in ("cpu", "host")]
        host = cpus[0] if cpus else next(iter(topo.nodes_of("cpu") + topo.nodes_of("host")), None)
        legs = [route(topo, gpu, host).paths[0], route(topo, host, nic).paths[0]] if host else [path]
        staged_s = sum(topo.links[i].latency_s for leg in legs for i, _d in leg.directed_links)
        uses: dict = {}
        rates: dict = {}
        for leg in legs:
            rates.update(links_gbps(topo, leg.directed_links, c))
            for i, _d in leg.directed_links:  # a PCIe link carries the staged copy once per leg that crosses it
                uses[i] = uses.get(i, 0) + 1
        stagers = staging_gpus(topo, host) if host else {}
        gbps = min([port, *(rate / (uses[i] * max(1, stagers.get(i, 0))) for (i, _d), rate in rates.items())])
    vendor = topo.nodes[nic].attrs.get("pci_vendor")
    return NicPath(nic, gpu, kind_name, gdr, port, gbps, staged_s, socket, str(vendor) if vendor else None)


def host_part(topo: Topology, name: str) -> Topology:
    """The host ``name`` sits in, on its own (an NVL72 rack's compute tray: its Graces, GPUs, NICs and the links
    among them), built once: a GPU's path to its NIC stays inside it. A node of one host is its own part."""
    host = topo.nodes[name].attrs.get("host")
    if host is None:
        return topo
    key = ("meshscale.simulate.nccl.host_part", host)
    if key not in topo.route_cache:
        keep = {n: node for n, node in topo.nodes.items() if node.attrs.get("host") == host}
        topo.route_cache[key] = Topology(f"{topo.name}/host{host}", keep,
                                         [l for l in topo.links if l.a in keep and l.b in keep], topo.title)
    return topo.route_cache[key]


def same_host(topo: Topology, a: str, b: str) -> bool:
    """Whether two parts of a node sit in one host: a rack of several hosts (an NVL72's 18 compute trays) marks
    each part with its ``host``; the hosts share nothing but NVLink, so a NIC serves the GPUs of its own host."""
    return topo.nodes[a].attrs.get("host") == topo.nodes[b].attrs.get("host")


def through_c2c(topo: Topology, path) -> bool:
    """A GPU -> NIC path over the GPU's NVLink-C2C to its CPU and that CPU's PCIe to the NIC (GB200: NCCL's
    PATH_P2C), on which NCCL uses GPUDirect RDMA by default (NCCL_NET_GDR_C2C=1, src/graph/paths.cc)."""
    cpus = [n for n in path.nodes[1:-1] if topo.nodes[n].kind in ("cpu", "host")]
    return bool(path.directed_links) and topo.links[path.directed_links[0][0]].kind == "c2c" and len(cpus) == 1


def staging_gpus(topo: Topology, host: str) -> dict[int, int]:
    """Link index -> how many of the node's GPUs cross it on their way to host memory. Without GPUDirect RDMA
    every GPU of the node stages its traffic there at once (a layout dimension runs all its groups together, and
    multi-node jobs take whole nodes), so a PCIe switch's up-link carries the copies of every GPU below it."""
    key = ("meshscale.simulate.nccl.staging", host)
    if key not in topo.route_cache:
        count: dict[int, int] = {}
        for gpu in [g for g in topo.devices() if same_host(topo, g, host)]:
            for i, _d in route(topo, gpu, host).paths[0].directed_links:
                count[i] = count.get(i, 0) + 1
        topo.route_cache[key] = count
    return topo.route_cache[key]


def fabric_gbps(topo: Topology, nodes: Collection[int], node_gbps: float) -> float:
    """A node's network rate when every node sends at once around NCCL's ring over the nodes in rank order. The
    ring crosses nodes NIC k to NIC k (NCCL keeps each channel on one NIC, rail-aligned), so it passes inside
    any set of nodes whose NICs share their leaf switches: one leaf in a fat tree, one leaf per rail (a rail
    group) in a rail-optimized network. It leaves each such group once, with all of a node's traffic, each NIC's
    share through its leaf's up-links: a tree oversubscribed k:1 has 1/k as many up-links as down-links, so it
    slows the ring only where a leaf holds fewer than k nodes; a rail leaf carries one NIC's share of the ring,
    so its up-links rarely bind. One group: nothing climbs. A job spread over the leaves of an oversubscribed
    tree (`Cluster.placement`, a shared cluster's busy leaves) gets 1/k of each node's rate: every node's traffic
    to the others climbs, through up-links its leaf's other nodes keep busy."""
    cluster = topo.cluster
    if cluster is not None and cluster.placement == "spread" and cluster.oversubscription > 1 and len(nodes) > 1:
        return node_gbps / cluster.oversubscription
    leaves = _leaves_by_node(topo, nodes)
    groups = {tuple(leaves.get(k, ())) for k in nodes}
    if () in groups or len(groups) < 2:
        return node_gbps
    rate = node_gbps
    for group in groups:
        for leaf in set(group):
            up = sum(l.bandwidth_bytes_per_s for l in _up_links(topo, leaf))
            rate = min(rate, up / 1e9 * len(group) / group.count(leaf))  # the leaf carries its NICs' share
    return rate


def _up_links(topo: Topology, leaf: str) -> list:
    """A leaf switch's links to the switches above it (a cluster's from its plan, not its whole graph)."""
    if isinstance(topo, ClusterTopology):
        return topo.up_links(leaf)
    return [l for l in topo.links_of(leaf) if topo.nodes[l.other(leaf)].kind == "net_switch"
            and topo.nodes[l.other(leaf)].attrs.get("level", 1) > 1]


def network_latency_s(topo: Topology, nics: list[NicPath]) -> float:
    """One message's latency node to node: the cluster's worst case where its plan says (`build_cluster`), else
    what the topology's own network says, a NIC's link to its switch, the switch, and the link down to another
    node's NIC (hosts joined under torchrun: their ports' kind, Ethernet or InfiniBand), else EDR InfiniBand's;
    without GPUDirect RDMA, plus the staging through host memory at both ends (GPU -> CPU -> NIC, and back)."""
    staged_s = 2 * max((path.staged_latency_s for path in nics), default=0.0)
    stated = topo.cluster.latency_s if topo.cluster is not None else None
    if stated:
        return float(stated) + staged_s
    for path in nics:
        up = [l for l in topo.links_of(path.nic) if topo.nodes[l.other(path.nic)].kind == "net_switch"]
        if up:
            switch = up[0].other(path.nic)
            return 2 * up[0].latency_s + float(topo.nodes[switch].attrs.get("latency_s", 0.0)) + staged_s
    return REFERENCE_NET_LATENCY_S + staged_s


def _leaves_by_node(topo: Topology, nodes: Collection[int]) -> dict[int, list[str]]:
    """Node -> the switch each of its NICs links to, in NIC order (NICs without a switch left out), for
    ``nodes`` at least (a cluster's from its plan)."""
    if isinstance(topo, ClusterTopology):
        return {k: topo.leaves_of(k) for k in nodes}
    out: dict[int, list[str]] = {}
    for nic in topo.nodes_of("nic"):
        switch = next((l.other(nic) for l in topo.links_of(nic) if topo.nodes[l.other(nic)].kind == "net_switch"), None)
        if switch is not None:
            out.setdefault(node_of(topo, nic), []).append(switch)
    return out


def ranks_by_node(topo: Topology, ranks: Sequence[int]) -> tuple[Mapping[int, list[str]], set[str]]:
    """(each node's devices among ``ranks``, in rank order, the nodes in the order of their first rank; the
    devices' models). On a cluster built from one node (`ClusterTopology`) by the index arithmetic alone, each
    node's devices named when asked (`_NodesOfRanks`): a call over a whole cluster names its first node's."""
    if isinstance(topo, ClusterTopology) and len(ranks):
        per, found = len(topo.plan.node_topology.devices()), np.asarray(ranks)
        outside = np.flatnonzero((found < 0) | (found >= per * topo.plan.spec.nodes))
        if len(outside):
            topo.device(int(found[outside[0]]))  # raises as for any topology, naming the device
        models = {topo.nodes[topo.device(int(i))].attrs.get("model", "") for i in np.unique(found % per)}
        return _NodesOfRanks(topo, found, per), models
    names = [topo.device(r) for r in ranks]
    nodes: dict[int, list[str]] = {}
    for n in names:
        nodes.setdefault(node_of(topo, n), []).append(n)
    return nodes, {topo.nodes[n].attrs.get("model", "") for n in names}


class _NodesOfRanks(Mapping):
    """`ranks_by_node`'s nodes on a `ClusterTopology`: node -> the names of its devices among the ranks (in rank
    order), the nodes in the order of their first rank; a node's names made when it is asked for."""

    def __init__(self, topo: ClusterTopology, ranks: np.ndarray, per_node: int):
        node = ranks // per_node
        order = np.argsort(node, kind="stable")   # each node's ranks together, in rank order
        spanned, first, count = np.unique(node, return_index=True, return_counts=True)
        start = np.concatenate(([0], np.cumsum(count)[:-1]))
        self._topo, self._sorted = topo, ranks[order]
        self._slices = {int(spanned[i]): (int(start[i]), int(start[i] + count[i])) for i in np.argsort(first)}
        self._names: dict[int, list[str]] = {}

    def __getitem__(self, k: int) -> list[str]:
        if k not in self._names:
            a, b = self._slices[k]
            self._names[k] = [self._topo.device(int(r)) for r in self._sorted[a:b]]
        return self._names[k]

    def __iter__(self) -> Iterator[int]:
        return iter(self._slices)

    def __len__(self) -> int:
        return len(self._slices)


def node_of(topo: Topology, name: str) -> int:
    return int(topo.nodes[name].attrs.get("node", 0))
