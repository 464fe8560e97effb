"""NCCL's own cost model, applied to a meshscale topology: what NCCL would pick for a collective and how long
it would take.

NCCL (src/graph/tuning.cc) predicts ``time = latency + nBytes / bandwidth`` for every algorithm (ring, tree,
NVLS, ...) and protocol (LL, LL128, Simple) and runs the fastest. Its inputs come from the topology search
(src/graph/search.cc): per-channel bandwidth and the number of channels (rings) it could lay over the links.
This module derives those inputs from a `Topology` the way NCCL does (compute capability from the GPU model,
NVLink bandwidth per link by generation, PCI width x rate, the CPU-to-CPU link by CPU generation, the speed
ladders and channel duplication), then evaluates NCCL's formulas with the constants of ``nccl_tuning.yaml``.

The choice is NCCL's (argmin of its own estimates). The predicted time adds what NCCL's estimate leaves out
but a run shows: the CUDA launch and per-call set-up, channels shed for small messages (enqueue.cc), the
traffic an NVLS all-reduce really moves over each GPU's links, and the host thread that launches one GPU after another (nccl-tests -g N). Trees use
their own graph (chains, search.cc), as NCCL's tuning reads graphs[algorithm].
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import yaml

from meshscale.collectives.kinds import kind
from meshscale.errors import MeshscaleError
from meshscale.simulate.nccl_env import DEFAULT_ENV, NcclEnv, allows
from meshscale.topology import Topology, route

PROTOCOLS = ("LL", "LL128", "Simple")
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "collnet_direct", "collnet_chain", "pat")
P2P = "p2p"  # point-to-point collectives (all_to_all, gather, scatter, send_recv): grouped ncclSend/ncclRecv
DEFAULT_VERSION = "2.28"
PATH_TYPES = ("NVL", "PIX", "PXB", "PHB", "SYS")  # NCCL's path types inside a node, nearest first
_ARCH = {70: "volta", 80: "ampere", 90: "hopper", 100: "blackwell"}
_ALGO_SPELLINGS = {"nvlstree": "nvls_tree", "collnetdirect": "collnet_direct", "collnetchain": "collnet_chain",
                   "collnet": "collnet_direct"}
_RING_ONLY = ("broadcast", "reduce")
_P2P_COLLECTIVES = ("all_to_all", "gather", "scatter", "send_recv")
DFS_VISIT_LIMIT = 20_000  # ring search effort per ring (NCCL's search has a time limit too)
# GPUs of one node NCCL's search here lays rings over: the largest NVLink domain built (GB200 NVL72); the search
# grows with the square of the GPUs and more would not answer within seconds
MAX_NODE_GPUS = 72


# ---- constants --------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _data() -> dict:
    with resources.files("meshscale.simulate").joinpath("nccl_tuning.yaml").open() as f:
        return yaml.safe_load(f)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def families() -> list[str]:
    """The NCCL version families the data file describes, oldest first."""
    return sorted(_data()["families"], key=_version_key)


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2])


@lru_cache(maxsize=None)
def constants(version: str | None = None) -> dict:
    """The constants of the family ``version`` belongs to (the newest family not newer than it; default 2.28),
    inherited entries merged in; ``family`` and ``source`` say which."""
    fams = _data()["families"]
    text = str(version or DEFAULT_VERSION).strip().lstrip("v")
    if not re.match(r"^\d+(\.\d+)*", text):
        raise MeshscaleError(f"NCCL version {version!r} is not a version number; use e.g. 2.28, 2.18.5 or 1.6")
    want = _version_key(text)
    fitting = [f for f in fams if _version_key(f) <= want]
    if not fitting:
        raise MeshscaleError(f"no NCCL constants for version {version}; known families: {', '.join(families())}")
    family = max(fitting, key=_version_key)

    def resolved(name: str) -> dict:
        entry = fams[name]
        return _merge(resolved(entry["inherit"]), entry) if "inherit" in entry else dict(entry)

    merged = resolved(family)
    merged["family"] = family
    return merged


def _first_match(table: list, text: str, default):
    for pattern, value in table:
        if re.search(pattern, text or "", re.IGNORECASE):
            return value
    return default


def gpu_sm(model: str) -> int:
    """Compute capability x10 of a GPU model name (H100 -> 90), as NCCL reads it from the device."""
    return int(_first_match(_data()["gpu_sm"], model, _data()["gpu_sm_default"]))


def cpu_class(model: str) -> str:
    """NCCL's CPU class (bdw, skl, srp, erp, amd, p9, arm) of a CPU model name."""
    return str(_first_match(_data()["cpu_class"], model, _data()["cpu_class_default"]))


def host_launch_s(version: str | None = None) -> float:
    """Seconds a host thread spends issuing one GPU's collective with NCCL ``version`` (default 2.28): the
    figure of the newest family measured that is not newer (the oldest one for older versions)."""
    per_family = _data()["host_launch_us_per_gpu"]
    want = _version_key(constants(version)["family"])
    known = sorted(per_family, key=_version_key)
    fitting = [f for f in known if _version_key(f) <= want] or known[:1]
    return float(per_family[fitting[-1]]) * 1e-6


def host_bound_s(device_s: float, gpus_per_thread: int, version: str | None = None) -> float:
    """Time per call of a back-to-back loop when one host thread issues each call on ``gpus_per_thread`` GPUs
    one after another. Launches are asynchronous: the thread runs ahead and the kernels queue, so a call
    takes the longer of the thread's G issues and the device's own ``device_s`` (one GPU per thread: its
    launch overlaps the previous call)."""
    return max(max(1, gpus_per_thread) * host_launch_s(version), device_s)


def launch_overhead_us(proto: str) -> float:
    """What a call of ``proto`` pays on top of NCCL's estimate: the CUDA launch and NCCL's per-call set-up
    (see the data file). LL128's estimate already holds it (its base latency is at or above what LL128 calls
    take in a loop), so LL128 pays nothing more. A separate term: NCCL's choice does not see it."""
    return float(_data()["launch_overhead_us"]) if proto in _data()["launch_overhead_protocols"] else 0.0


def call_floor_us(s: System, c: dict, collective: str) -> float:
    """The least time (us) one call of ``collective`` takes in a back-to-back loop: the CUDA launch and NCCL's
    per-call overhead (see the data file) on top of NCCL's cheapest latency for it (LL on the algorithm of fewest
    steps: the ring in one node, the tree's log-depth across many). A separate term: NCCL's choice does not see it."""
    lowest = min(latency_us(s, c, collective, a, "LL") for a in ("ring", "tree")
                 if a == "ring" or enabled(s, c, collective, a, "LL", True))
    return float(_data()["launch_overhead_us"]) + lowest


# ---- what NCCL derives from the topology ------------------------------------------------------------------

@dataclass
class Graph:
    """A channel graph as NCCL's search leaves it: channels, GB/s per channel, the farthest path type used, and
    what its links carry at their capacity (``capacity_gbps``; 0: the search's channels x speed)."""

    channels: int
    bw_gbps: float
    path_type: str = "NVL"
    same_channels: bool = True
    orders: list[list[str]] = field(default_factory=list)
    capacity_gbps: float = 0.0

    @property
    def link(self) -> str:
        return "nvlink" if self.path_type == "NVL" else "pci"

    @property
    def total_gbps(self) -> float:
        return self.channels * self.bw_gbps

    @property
    def link_gbps(self) -> float:
        """GB/s a GPU's bytes cross its links at: the capacity of the links the channels use (NCCL's per-link
        figures, e.g. 18 NVLinks x 20.6 = 370.8 on an H100 / H200, as NCCL prints it as the system's maxBw),
        not the search's speed step (12 channels x 30 = 360 there), which NCCL's estimate and choice keep.
        Measured on 2 H200, broadcast and reduce at 1 GiB run at 366-371 GB/s: above the speed step."""
        return max(self.capacity_gbps, self.total_gbps)


@dataclass
class System:
    """What NCCL knows when it tunes: GPU generation, ranks and nodes, the ring graph, NVLS, CPU vendor."""

    sm: int
    n_ranks: int
    n_nodes: int
    ring: Graph
    nvls: bool  # NVSwitch multicast joins the ranks of a node
    cpu: str
    inter_gbps: float = 0.0  # network bandwidth of one node, all NICs (several nodes only)
    pair_gbps: dict = field(default_factory=dict)  # (src, dst) -> NCCL path bandwidth, GB/s
    tree: Graph | None = None  # the tree graph (chains inside the node); None: trees use the ring graph
    net_extra_us: float = 0.0  # network latency beyond the InfiniBand fabric NCCL's constants were measured on
    nics: list = field(default_factory=list)  # NicPath of each NIC of a node (several nodes only)
    gpu_mesh: bool = False  # GPUs of a node joined by NVLinks between them (not only through switches)
    env: NcclEnv = DEFAULT_ENV  # NCCL's environment (channels, transports)

    @property
    def ppn(self) -> float:
        return self.n_ranks / self.n_nodes

    @property
    def arch(self) -> str:
        return _ARCH[max(k for k in _ARCH if k <= max(self.sm, 70))]

    @property
    def hw(self) -> str:
        return "net" if self.n_nodes > 1 else self.ring.link


def _pci_gbps(link, c: dict) -> float:
    rate = c["pci_rate_per_lane"].get(link.generation or 3, 60)
    return (link.width or 16) * rate / 80 * (link.count or 1)


@dataclass
class _PairPath:
    path_type: str
    uses: list  # (resource key, consumption per unit of channel bandwidth)


def _pair_path(topo: Topology, a: str, b: str, c: dict, sm: int, capacity: dict,
               env: NcclEnv = DEFAULT_ENV) -> _PairPath | None:
    """NCCL's view of the path a -> b inside a node: its type and the resources a channel consumes on it. Where
    ``env`` denies the P2P transport on that path, the SHM transport's path through host memory (or, SHM
    disabled too, the network's)."""
    natural = _p2p_pair_path(topo, a, b, c, sm, capacity)
    if natural is None or env.p2p_allowed(natural.path_type):
        return natural
    if env.shm:
        return _host_pair_path(topo, a, b, c, capacity)
    return _net_pair_path(topo, a, b, c, capacity, env)


def _p2p_pair_path(topo: Topology, a: str, b: str, c: dict, sm: int, capacity: dict) -> _PairPath | None:
    nv = c["nvlink_bw_per_link"].get(sm, c["nvlink_bw_per_link"][80 if sm >= 80 else 70])
    direct = [l for l in topo.links_between(a, b) if l.kind == "nvlink"]
    if direct:
        key = ("nvl", a, b)
        capacity[key] = sum(l.count for l in direct) * nv
        return _PairPath("NVL", [(key, 1.0)])
    shared = _switches_of(topo, a) & _switches_of(topo, b)  # one hop through a common switch: no route needed
    if shared or route(topo, a, b).fabric == "nvlink":  # through NVSwitches: a's links in, b's links out
        for g, way in ((a, "out"), (b, "in")):
            capacity[("nvs", way, g)] = sum(l.count for l in topo.links_of(g, "nvlink")
                                            if topo.nodes[l.other(g)].kind == "nvswitch") * nv
        return _PairPath("NVL", [(("nvs", "out", a), 1.0), (("nvs", "in", b), 1.0)])
    r = route(topo, a, b)
    if r.fabric != "pcie":
        return None
    path = r.paths[0]
    cpus = [n for n in path.nodes[1:-1] if topo.nodes[n].kind in ("cpu", "host")]
    switches = [n for n in path.nodes[1:-1] if topo.nodes[n].kind == "pcie_switch"]
    path_type = "SYS" if len(cpus) >= 2 else "PHB" if cpus else "PIX" if len(switches) <= 1 else "PXB"
    intel = bool(cpus) and all(cpu_class(topo.nodes[x].attrs.get("model", "")) in ("bdw", "skl", "srp", "erp")
                               for x in cpus)
    uses = []
    for i, d in path.directed_links:
        link = topo.links[i]
        key = ("link", i, d)
        if link.kind in ("qpi", "upi"):
            capacity[key] = c["inter_cpu_bw"][cpu_class(topo.nodes[link.a].attrs.get("model", ""))]
            uses.append((key, 1.0))
        else:
            capacity[key] = _pci_gbps(link, c) if link.kind == "pcie" else link.bandwidth_bytes_per_s / 1e9
            # P2P through an Intel root complex: 64 B TLPs cost 1.2x the link (search.cc, PHB paths)
            uses.append((key, c["intel_p2p_overhead"] if path_type == "PHB" and intel else 1.0))
    return _PairPath(path_type, uses)


def _switches_of(topo: Topology, gpu: str) -> set[str]:
    return {l.other(gpu) for l in topo.links_of(gpu, "nvlink") if topo.nodes[l.other(gpu)].kind == "nvswitch"}


def _local_cpu(topo: Topology, gpu: str) -> str | None:
    """The CPU a GPU's PCIe tree hangs off (its nearest CPU by route)."""
    cpus = topo.nodes_of("cpu") + topo.nodes_of("host")
    node = _node_of(topo, gpu)
    mine = [x for x in cpus if _node_of(topo, x) == node]
    return min(mine, key=lambda x: len(route(topo, gpu, x).paths[0].nodes), default=None)


def _host_pair_path(topo: Topology, a: str, b: str, c: dict, capacity: dict) -> _PairPath:
    """The SHM transport's path a -> b: paths.cc diverts a pair without P2P through the CPU next to the receiver
    (addInterStep); a's GPU writes into pinned host memory over its PCIe links (and the CPUs' link, if a hangs
    off the other CPU), b's reads it over its own. Type PHB, or SYS when it crosses between CPUs."""
    host = _local_cpu(topo, b)
    if host is None:
        raise MeshscaleError(f"{topo.name}: no CPU to stage {a} -> {b} through host memory (P2P disabled); "
                             "describe the host in the system file")
    legs = [route(topo, a, host).paths[0], route(topo, host, b).paths[0]]
    uses = []
    for leg in legs:
        for key, rate in _links_gbps(topo, leg.directed_links, c).items():
            capacity[("link", *key)] = rate
            uses.append((("link", *key), 1.0))
    cpus = {x for leg in legs for x in leg.nodes if topo.nodes[x].kind in ("cpu", "host")}
    return _PairPath("SYS" if len(cpus) >= 2 else "PHB", uses)


def _net_pair_path(topo: Topology, a: str, b: str, c: dict, capacity: dict, env: NcclEnv) -> _PairPath:
    """The NET transport's path a -> b inside one node (P2P and SHM both disabled): out through the NIC nearest
    a and back in through it (paths.cc marks the pair PATH_NET)."""
    node = _node_of(topo, a)
    nics = [n for n in topo.nodes_of("nic") if _node_of(topo, n) == node and _port_gbps(topo, n)]
    if not nics:
        raise MeshscaleError(f"{topo.name}: with P2P and SHM disabled NCCL sends through the network, and this "
                             "node has no NIC; enable one of them or describe the NICs")
    nic = min(nics, key=lambda n: len(route(topo, a, n).paths[0].nodes))
    port = _port_gbps(topo, nic)
    capacity[("nic", nic)] = env.socket_gbps(port) if env.socket else port
    return _PairPath("SYS", [(("nic", nic), 1.0)])


def _port_gbps(topo: Topology, nic: str) -> float:
    return sum(l.bandwidth_bytes_per_s for l in topo.links_of(nic) if l.kind in ("infiniband", "ethernet")) / 1e9 \
        or float(topo.nodes[nic].attrs.get("port_gbps", 0) or 0) or _catalog_port_gbps(topo, nic)


def _catalog_port_gbps(topo: Topology, nic: str) -> float:
    """A system file's NIC without its network link: the port its ``port_rate`` names (ndr, 100gbe...)."""
    from meshscale.topology.cluster import NET_LINKS

    rate = str(topo.nodes[nic].attrs.get("port_rate", "")).lower()
    return NET_LINKS[rate].bandwidth_bytes_per_s / 1e9 if rate in NET_LINKS else 0.0


def _cycles(names: list[str], paths: dict, left: dict, speed: float, budget: list[int], closed: bool = True):
    """Rings through ``names`` whose every hop has ``speed`` GB/s left on each resource it uses (depth-first,
    nearest path types first); ``closed`` False: chains (a tree's intra-node pattern), from any first GPU.
    Each ring is yielded with its resources taken; they are given back after."""
    n = len(names)

    def fits(u, v):
        p = paths.get((u, v))
        return p is not None and all(left[k] >= speed * f - 1e-9 for k, f in p.uses)

    def take(u, v, sign):
        for k, f in paths[(u, v)].uses:
            left[k] -= sign * speed * f

    order: list[str] = []

    def dfs():
        budget[0] -= 1
        if budget[0] < 0:
            return
        u = order[-1]
        if len(order) == n and not closed:
            yield list(order)
            return
        if len(order) == n:
            if fits(u, names[0]):
                take(u, names[0], 1)
                yield list(order)
                take(u, names[0], -1)
            return
        rest = [v for v in names if v not in order and (u, v) in paths]
        rest.sort(key=lambda v: (PATH_TYPES.index(paths[(u, v)].path_type),
                                 -min(left[k] / f for k, f in paths[(u, v)].uses)))
        for v in rest:
            if fits(u, v):
                take(u, v, 1)
                order.append(v)
                yield from dfs()
                order.pop()
                take(u, v, -1)

    for first in (names if not closed else names[:1]):
        order.append(first)
        yield from dfs()
        order.pop()


def _pack_rings(names: list[str], paths: dict, capacity: dict, speed: float, limit: int,
                closed: bool = True) -> list[list[str]]:
    """As many rings (``closed`` False: chains) at ``speed`` as fit together (NCCL's search backtracks over
    channels too, within a time limit); stops at the bound the busiest GPU's links set."""
    out: dict = {}
    for (a, _), p in paths.items():
        for k, _f in p.uses[:1]:
            out.setdefault(a, set()).add(k)
    sends = min(int(sum(capacity[k] for k in ks) / speed + 1e-9) for ks in out.values())
    bound = min(limit, sends if closed else sends * len(names) // max(1, len(names) - 1))
    left, rings, best, budget = dict(capacity), [], [[]], [DFS_VISIT_LIMIT]

    def rec():
        if len(rings) > len(best[0]):
            best[0] = list(rings)
        if len(rings) >= bound or budget[0] <= 0:
            return
        for ring in _cycles(names, paths, left, speed, budget, closed):
            rings.append(ring)
            rec()
            rings.pop()
            if len(best[0]) >= bound or budget[0] <= 0:
                return

    rec()
    return best[0]


def ring_graph(topo: Topology, names: list[str], c: dict, sm: int, env: NcclEnv = DEFAULT_ENV) -> Graph:
    """The ring graph NCCL's search finds over the GPUs ``names`` of one node: NVLink-only rings if any exist
    (else rings over PCIe / the CPU link), at the fastest speed of the ladder that gives the most bandwidth
    (nChannels x speed), then channel duplication."""
    return _search_graph(topo, names, c, sm, closed=True, limit=c["search_max_channels"], dup_limit=c["max_channels"],
                         env=env)


def tree_graph(topo: Topology, names: list[str], c: dict, sm: int, ring: Graph, env: NcclEnv = DEFAULT_ENV) -> Graph:
    """The tree graph of one node (search.cc, balanced-tree pattern): chains through ``names``, at most as many
    as the ring graph has channels (init.cc sets the tree's maxChannels to the ring's nChannels); a chain
    crosses n-1 links, so a perfect graph carries totalBw * n / (n-1)."""
    return _search_graph(topo, names, c, sm, closed=False, limit=ring.channels, dup_limit=ring.channels, env=env)


def _search_graph(topo: Topology, names: list[str], c: dict, sm: int, closed: bool, limit: int,
                  dup_limit: int, env: NcclEnv = DEFAULT_ENV) -> Graph:
    if len(names) == 1:
        return Graph(1, 0.0)
    capacity: dict = {}
    paths = {}
    for a in names:
        for b in names:
            if a != b:
                p = _pair_path(topo, a, b, c, sm, capacity, env)
                if p is not None:
                    paths[(a, b)] = p
    ladders = c["speed_ladder_intra"]
    ladder = ladders.get("sm100" if sm >= 100 else "sm90" if sm >= 90 else "default", ladders["default"])
    for allowed in (("NVL",), PATH_TYPES):
        usable = {k: p for k, p in paths.items() if p.path_type in allowed}
        if not usable:
            continue
        best: tuple[int, float, list] = (0, 0.0, [])
        per_gpu = {a: max((min(capacity[k] / f for k, f in p.uses) for (s, _), p in usable.items() if s == a), default=0)
                   for a in names}
        max_bw = max(per_gpu.values())
        total_bw = max(sum(capacity[k] for k in {p.uses[0][0] for (s, _), p in usable.items() if s == a}) for a in names)
        if not closed:
            total_bw *= len(names) / (len(names) - 1)
        first = None
        for speed in [s for s in ladder if s <= max_bw + 1e-9]:
            if first is not None and speed / first <= 0.49:
                break
            rings = _pack_rings(names, usable, capacity, speed, limit, closed)
            if rings and len(rings) * speed > best[0] * best[1] + 1e-9:
                best = (len(rings), speed, rings)
            if rings and first is None:
                first = speed
            if best[0] * best[1] >= total_bw - 1e-9 or best[0] >= limit:
                break
        if best[0]:
            nch, bw, rings = best
            hops = [(u, v) for r in rings for u, v in zip(r, r[1:] + (r[:1] if closed else []))]
            worst = max((paths[h].path_type for h in hops), key=PATH_TYPES.index)
            same = all(r == rings[0] for r in rings)
            load: dict = {}  # per unit of channel speed, summed over every hop of every ring
            for hop in hops:
                for k, f in paths[hop].uses:
                    load[k] = load.get(k, 0.0) + f
            capacity_gbps = nch * min(capacity[k] / x for k, x in load.items())
            if bw >= c["duplicate_min_bw"] and not (sm > 80 and bw < c["duplicate_sm90_max_bw"] and nch > 4):
                dup = min(2 * nch, dup_limit)
                bw, nch = bw / math.ceil(dup / nch), dup
            return Graph(nch, bw, worst, same, rings, capacity_gbps)
    hops = list(zip(names, names[1:] + (names[:1] if closed else [])))
    if all(h in paths for h in hops):
        # search.cc: no pattern at any speed of the ladder -> "falling back to simple order": one channel over the
        # GPUs in order, typed SYS, rated 0.1 GB/s for the tuning; a run moves what its paths carry
        load = {}
        for hop in hops:
            for k, f in paths[hop].uses:
                load[k] = load.get(k, 0.0) + f
        return Graph(1, c["fallback_bw"], "SYS", True, [list(names)], min(capacity[k] / x for k, x in load.items()))
    raise MeshscaleError(f"{topo.name}: no ring joins devices {names}; check their links")


# ---- the network between nodes ------------------------------------------------------------------------------

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


def _path_shape(topo: Topology, nodes: list[str]) -> str:
    cpus = [n for n in nodes[1:-1] if topo.nodes[n].kind in ("cpu", "host")]
    switches = [n for n in nodes[1:-1] if topo.nodes[n].kind == "pcie_switch"]
    return "SYS" if len(cpus) >= 2 else "PHB" if cpus else "PIX" if len(switches) <= 1 else "PXB"


def _links_gbps(topo: Topology, directed: list, c: dict) -> dict:
    """(link index, direction) -> GB/s as NCCL rates it, for the links a path crosses."""
    out = {}
    for i, d in directed:
        link = topo.links[i]
        if link.kind in ("qpi", "upi"):
            out[(i, d)] = c["inter_cpu_bw"][cpu_class(topo.nodes[link.a].attrs.get("model", ""))]
        else:
            out[(i, d)] = _pci_gbps(link, c) if link.kind == "pcie" else link.bandwidth_bytes_per_s / 1e9
    return out


def node_view(topo: Topology, k: int) -> Topology:
    """Node ``k`` of a cluster on its own (its nodes and the links among them), built once per topology: the
    routes inside a node are found there, not by a max-flow over the whole cluster's graph. A topology of one
    node is its own view."""
    key = ("meshscale.nccl_model.node_view", k)
    if key not in topo.route_cache:
        # a cluster marks every node's parts with node=k; its switches belong to no node
        names = {n for n, node in topo.nodes.items() if node.attrs.get("node") is not None and int(node.attrs["node"]) == k}
        if not names or len(names) == len(topo.nodes):
            topo.route_cache[key] = topo
        else:
            topo.route_cache[key] = Topology(f"{topo.name}/n{k}", {n: topo.nodes[n] for n in names},
                                             [l for l in topo.links if l.a in names and l.b in names], topo.title)
    return topo.route_cache[key]


def network_paths(topo: Topology, local: list[str], c: dict, env: NcclEnv = DEFAULT_ENV) -> list[NicPath]:
    """How NCCL reaches the network from the GPUs ``local`` of one node of a cluster. Each NIC serves its nearest
    GPU (NIC-GPU affinity). GPUDirect RDMA is used when the NIC allows it and the path is PIX or PXB (NCCL's
    default GDR level): the NIC reads GPU memory at the path's bottleneck. Otherwise the data is staged through
    host memory: GPU -> CPU -> NIC, and links both legs cross (a PCIe switch's up-link) carry it twice. Equally
    near GPUs are spread over the NICs, as NCCL's rings start on different GPUs. The socket transport (``env``)
    stages through host memory too, and a NIC carries what its streams move."""
    k = _node_of(topo, local[0])
    cluster, topo = topo, node_view(topo, k)  # ports from the cluster, routes inside the node
    out, served = [], set()
    for nic in topo.nodes_of("nic"):
        port = sum(l.bandwidth_bytes_per_s for l in cluster.links_of(nic) if l.kind in ("infiniband", "ethernet")) / 1e9
        if not port:
            continue
        shapes = []
        for g in local:
            path = route(topo, g, nic).paths[0]
            shapes.append((PATH_TYPES.index(_path_shape(topo, path.nodes)), g, path))
        _, gpu, path = min(shapes, key=lambda x: (x[0], x[1] in served))  # equally near: a GPU no NIC serves yet
        served.add(gpu)
        kind_name = _path_shape(topo, path.nodes)
        gdr = topo.nodes[nic].attrs.get("gpudirect_rdma", True) is not False and kind_name in GDR_PATH_TYPES \
            and not env.socket
        if gdr:
            gbps = min([port, *_links_gbps(topo, path.directed_links, c).values()])
        else:
            cpus = [n for n in path.nodes if topo.nodes[n].kind in ("cpu", "host")]
            host = cpus[0] if cpus else next(iter(topo.nodes_of("cpu") + topo.nodes_of("host")), None)
            legs = [route(topo, gpu, host).paths[0], route(topo, host, nic).paths[0]] if host else [path]
            uses: dict = {}
            rates: dict = {}
            for leg in legs:
                rates.update(_links_gbps(topo, leg.directed_links, c))
                for i, _d in leg.directed_links:  # a PCIe link carries the staged copy once per leg that crosses it
                    uses[i] = uses.get(i, 0) + 1
            gbps = min([port, *(rate / uses[i] for (i, _d), rate in rates.items())])
        if env.socket:
            gbps = env.socket_gbps(gbps)
        out.append(NicPath(nic, gpu, kind_name, gdr, port, gbps))
    return out


def fabric_gbps(topo: Topology, nodes: dict[int, list[str]], node_gbps: float) -> float:
    """A node's network rate when every node sends at once around NCCL's ring over the nodes in rank order. The
    ring crosses nodes NIC k to NIC k (NCCL keeps each channel on one NIC, rail-aligned), so it passes inside
    any set of nodes whose NICs share their leaf switches: one leaf in a fat tree, one leaf per rail (a rail
    group) in a rail-optimized network. It leaves each such group once, with all of a node's traffic, each NIC's
    share through its leaf's up-links: a tree oversubscribed k:1 has 1/k as many up-links as down-links, so it
    slows the ring only where a leaf holds fewer than k nodes; a rail leaf carries one NIC's share of the ring,
    so its up-links rarely bind. One group: nothing climbs."""
    leaves = _leaves_by_node(topo)
    groups = {tuple(leaves.get(k, ())) for k in nodes}
    if () in groups or len(groups) < 2:
        return node_gbps
    rate = node_gbps
    for group in groups:
        for leaf in set(group):
            up = sum(l.bandwidth_bytes_per_s for l in topo.links_of(leaf) if topo.nodes[l.other(leaf)].kind == "net_switch"
                     and topo.nodes[l.other(leaf)].attrs.get("level", 1) > 1)
            rate = min(rate, up / 1e9 * len(group) / group.count(leaf))  # the leaf carries its NICs' share
    return rate


def network_latency_s(topo: Topology, nics: list[NicPath]) -> float:
    """One message's latency node to node: the cluster's worst case where its plan says (`build_cluster`), else
    what the topology's own network says, a NIC's link to its switch, the switch, and the link down to another
    node's NIC (hosts joined under torchrun: their ports' kind, Ethernet or InfiniBand), else EDR InfiniBand's."""
    stated = topo.attrs.get("cluster", {}).get("latency_s")
    if stated:
        return float(stated)
    for path in nics:
        up = [l for l in topo.links_of(path.nic) if topo.nodes[l.other(path.nic)].kind == "net_switch"]
        if up:
            switch = up[0].other(path.nic)
            return 2 * up[0].latency_s + float(topo.nodes[switch].attrs.get("latency_s", 0.0))
    return REFERENCE_NET_LATENCY_S


def _leaves_by_node(topo: Topology) -> dict[int, list[str]]:
    """Node -> the switch each of its NICs links to, in NIC order (NICs without a switch left out)."""
    out: dict[int, list[str]] = {}
    for nic in topo.nodes_of("nic"):
        switch = next((l.other(nic) for l in topo.links_of(nic) if topo.nodes[l.other(nic)].kind == "net_switch"), None)
        if switch is not None:
            out.setdefault(_node_of(topo, nic), []).append(switch)
    return out


def _node_of(topo: Topology, name: str) -> int:
    return int(topo.nodes[name].attrs.get("node", 0))


_NODE_GRAPHS: dict = {}  # node type -> what NCCL's search finds inside it (see `_node_graphs`)
NODE_GRAPHS_KEPT = 64


def _node_signature(topo: Topology, inside: Topology) -> tuple:
    """What makes two nodes of clusters the same to NCCL's search: their nodes, links and NIC ports."""
    ports = tuple(sorted((nic, sum(l.bandwidth_bytes_per_s for l in topo.links_of(nic)
                                   if l.kind in ("infiniband", "ethernet"))) for nic in inside.nodes_of("nic")))
    return (tuple((n.name, n.kind, repr(sorted(n.attrs.items()))) for n in inside.nodes.values()),
            tuple(repr(vars(l)) for l in inside.links), ports)


def _node_graphs(topo: Topology, local: list[str], c: dict, sm: int, env: NcclEnv,
                 several_nodes: bool) -> tuple[Graph, Graph | None, list[NicPath]]:
    """The ring and tree graphs NCCL's search lays over the GPUs ``local`` of one node, and its NICs' paths
    (several nodes): searched once per node type and reused by every cluster of that node (NCCL searches
    inside a node; a cluster of thousands of the same node needs the search once)."""
    inside = node_view(topo, _node_of(topo, local[0]))
    key = (_node_signature(topo, inside), tuple(local), c["family"], sm, env.system_key, several_nodes)
    if key not in _NODE_GRAPHS:
        if len(_NODE_GRAPHS) >= NODE_GRAPHS_KEPT:
            _NODE_GRAPHS.pop(next(iter(_NODE_GRAPHS)))
        ring = ring_graph(inside, local, c, sm, env)
        tree = tree_graph(inside, local, c, sm, ring, env) if len(local) > 1 else None
        _NODE_GRAPHS[key] = ring, tree, network_paths(topo, local, c, env) if several_nodes else []
    return _NODE_GRAPHS[key]


def analyse(topo: Topology, ranks: list[int], version: str | None = None, env: NcclEnv = DEFAULT_ENV) -> System:
    """What NCCL derives from ``topo`` for ``ranks`` (device indices) in the environment ``env``; memoized on
    the topology."""
    c = constants(version)
    memo = ("meshscale.nccl_model", tuple(ranks), c["family"], env.system_key)
    if memo in topo.route_cache:
        return topo.route_cache[memo]
    names = [topo.device(r) for r in ranks]
    if len(set(names)) != len(names):
        raise MeshscaleError(f"device list {list(ranks)} repeats a device; give each GPU once")
    if topo.device_kind != "gpu":
        raise MeshscaleError(f"{topo.name} has no GPUs; NCCL's model applies to GPUs only")
    sms = {gpu_sm(topo.nodes[n].attrs.get("model", "")) for n in names}
    sm = min(sms)
    nodes: dict[int, list[str]] = {}
    for n in names:
        nodes.setdefault(_node_of(topo, n), []).append(n)
    local = next(iter(nodes.values()))
    if len(local) > MAX_NODE_GPUS:
        raise MeshscaleError(f"{topo.name}: {len(local)} GPUs in one node; NCCL's model searches rings over at most "
                             f"{MAX_NODE_GPUS} GPUs of a node (an NVL72 domain): describe larger machines as a "
                             "cluster of nodes (--nodes, a cluster file)")
    graph, tree, node_nics = _node_graphs(topo, local, c, sm, env, len(nodes) > 1)
    cpus = [topo.nodes[x].attrs.get("model", "") for x in topo.nodes_of("cpu")]
    cpu = cpu_class(cpus[0]) if cpus else _data()["cpu_class_default"]
    nvs = {v for a in local for l in topo.links_of(a, "nvlink") for v in (l.other(a),) if topo.nodes[v].kind == "nvswitch"}
    multicast = [topo.nodes[v].attrs.get("multicast") for v in nvs]
    nvls = bool(nvs) and len(local) >= c.get("nvls_min_gpus", 3) and sm >= 90 and all(m is not False for m in multicast) and graph.path_type == "NVL"
    inter, net_extra_us, nics = 0.0, 0.0, []
    if len(nodes) > 1:
        nics = node_nics
        inter = fabric_gbps(topo, nodes, sum(n.gbps for n in nics) or c["net_bw_default"])
        latency_s = network_latency_s(topo, nics)
        net_extra_us = max(0.0, latency_s - REFERENCE_NET_LATENCY_S) * 1e6
        if len(local) == 1:  # one GPU per node: NCCL's channels run GPU -> NIC, one per NIC at its rate
            graph = Graph(max(1, len(nics)), inter / max(1, len(nics)), "NET", orders=[list(local)])
    mesh = any(l.kind == "nvlink" for a in local for b in local if a != b for l in topo.links_between(a, b))
    system = System(sm, len(names), len(nodes), graph, nvls, cpu, inter, tree=tree, net_extra_us=net_extra_us,
                    nics=nics, gpu_mesh=mesh, env=env)
    if len(sms) > 1:  # mixed generations: NCCL disables LL128 (min != max compute capability)
        system.pair_gbps["mixed_sm"] = True
    topo.route_cache[memo] = system
    return system


# ---- NCCL's estimate --------------------------------------------------------------------------------------

def _row(table: dict, s: System) -> list[float]:
    return table.get(s.arch, table.get("ampere"))


def _index2(s: System) -> int:
    return s.n_nodes - 1 if s.n_nodes <= 2 else 2


def enabled(s: System, c: dict, collective: str, algo: str, proto: str, nvls: bool) -> bool:
    """Whether NCCL would consider ``algo``/``proto`` for ``collective`` on ``s`` (hardware and version)."""
    if algo not in c["algorithms"] or proto not in c["protocols"]:
        return False
    if collective in _RING_ONLY and algo != "ring":
        return False
    if collective in ("all_gather", "reduce_scatter") and algo not in ("ring", "nvls", "pat", "collnet_direct"):
        return False
    if collective == "all_reduce" and algo == "pat":
        return False
    if algo in ("nvls", "nvls_tree") and (proto != "Simple" or not (s.nvls and nvls)):
        return False
    if algo == "nvls_tree" and s.n_nodes == 1:
        return False
    if algo == "nvls" and s.n_nodes > 1 and c.get("nvls_multinode_needs_collnet"):
        return False
    if algo.startswith("collnet"):  # needs a network that reduces (SHARP); no catalog system has one
        return False
    if algo == "pat" and (s.ppn != 1 or s.n_nodes < 2):
        return False
    if algo == "tree" and s.n_ranks < 2:
        return False
    if proto == "LL128":
        sms = c.get("ll128_sms")
        ok = (s.sm in sms) if sms else s.sm >= c["ll128_min_sm"]
        if not ok or s.ring.path_type != "NVL" or s.pair_gbps.get("mixed_sm"):
            return False
    return True


def _nsteps(collective: str, n: int) -> int:
    return 2 * (n - 1) if collective == "all_reduce" else n - 1 if collective in ("all_gather", "reduce_scatter") else n


def bus_bandwidth(s: System, c: dict, collective: str, algo: str, proto: str, share: float = 1.0,
                  nvls_traffic: bool = False) -> float:
    """NCCL's algorithm bandwidth (GB/s) for ``algo``/``proto``: per-channel graph bandwidth x channels with its
    protocol factors and caps, converted from bus to algorithm bandwidth. ``share`` (default 1) evaluates it
    on that fraction of the channels; ``nvls_traffic`` replaces NCCL's NVLS all-reduce credit by the traffic an
    NVLS all-reduce moves over each GPU's links (used for the predicted time, not for the choice)."""
    g = s.tree if algo == "tree" and s.tree is not None else s.ring  # tuning.cc reads graphs[algo]
    nch = g.channels * share
    n, i2 = s.n_ranks, _index2(s)
    bw = g.bw_gbps
    if s.n_nodes > 1:  # the network carries every channel once per node
        bw = min(bw, s.inter_gbps / g.channels)
    if algo in ("nvls", "nvls_tree"):
        nch_nvls = c["nvls_channels"] * share
        per_ch = g.total_gbps / c["nvls_channels"]
        if s.n_nodes > 1:  # tuning.cc: NVLS min(bwIntra, bwInter); NVLS tree min(bwIntra, bwInter / 2) beyond 2 nodes
            per_ch = min(per_ch, s.inter_gbps / c["nvls_channels"] / (2 if algo == "nvls_tree" and s.n_nodes > 2 else 1))
        eff = c["nvls_efficiency"][s.arch]
        if nvls_traffic and collective == "all_reduce":
            # multimem reduce reads each GPU's buffer once and returns its share; the multicast store sends the
            # share once and brings back the others: size * (n+1)/n per GPU link and direction
            return nch_nvls * per_ch * eff * s.ppn / (s.ppn + 1)
        if c["nvls_algbw_rule"] == "2.20":
            return nch_nvls * per_ch * (5 / 6)
        intra = per_ch * eff * (c["nvls_channels"] - 1) / c["nvls_channels"]
        intra *= 2.0 if collective == "all_reduce" else (s.ppn - 1) / s.ppn
        if algo == "nvls_tree":
            intra = min(intra, _row(c["per_channel_max_nvls_tree_bw"], s)[i2] or intra)
        bus = nch_nvls * intra
        if collective in ("all_gather", "reduce_scatter"):
            return bus
        return bus * n / _nsteps(collective, n)
    bus = nch * bw
    if c.get("sm80_bus_bw_cap") and s.sm == 80:
        bus = min(bus, c["sm80_bus_bw_cap"])
    if algo == "ring" and proto == "LL":
        if c.get("ring_ll_factor_v27"):
            bus *= 0.25 if (s.n_nodes > 1 or collective in ("all_reduce", "reduce")) else 1 / 3
        else:
            row = c["ll_max_bw"][s.arch] if s.n_nodes == 1 else c["ll_max_bw"]["net_amd" if s.cpu == "amd" else "net_intel"]
            bus = min(row[i2], bus * c["ring_ll_factor"])
    if algo == "ring" and proto == "LL128":
        bus = min(bus * c["ring_ll128_factor"], nch * _row(c["per_channel_max_ring_ll128_bw"], s)[i2])
    if algo == "tree":
        if collective == "all_reduce":
            bus = min(bus * c["tree_factor"], nch * _row(c["per_channel_max_tree_bw"], s)[i2])
        if proto == "LL":
            bus = min(bus / c["tree_ll_divisor"], _row(c["ll_max_bw"], s)[i2])
        if proto == "LL128":
            f = c["tree_ll128_factor_one_node"] if s.n_nodes == 1 else c["tree_ll128_factor_multi_node"]
            bus = min(bus * f, nch * _row(c["per_channel_max_tree_ll128_bw"], s)[i2])
    if algo == "pat":
        bus *= c["pat_factor"]
    if algo != "ring" and collective in ("all_gather", "reduce_scatter"):
        return bus
    return bus * (n / _nsteps(collective, n) if algo == "ring" else 0.5)


def latency_us(s: System, c: dict, collective: str, algo: str, proto: str) -> float:
    """NCCL's latency (us) of one ``algo``/``proto`` call of ``collective`` on ``s``."""
    base = c["base_latency_us"][algo][proto]
    hw = c["hw_latency_us"]
    intra = hw[s.ring.link].get(algo, {}).get(proto, 0.0)
    net = hw["net"]
    inter = (net["tree"] if s.ppn == 1 else net.get(algo, {})).get(proto, 0.0) + s.net_extra_us
    n, nodes = s.n_ranks, s.n_nodes
    nsteps = _nsteps(collective, n)
    if algo == "ring":
        step = hw[s.hw]["ring"][proto]
        if collective in _RING_ONLY:
            if s.ring.same_channels:
                return base + step
            return base + nsteps * (hw[s.hw]["tree"]["Simple"] if proto == "Simple" else step)
        if nodes > 1:
            overhead = c["net_overhead_us"]["amd" if s.cpu == "amd" else "intel"] * (3 if proto == "Simple" else 1)
            intra = max(intra, overhead)
        inter_steps = 0 if nodes == 1 else 2 * (nodes - 1) if collective == "all_reduce" else nodes - 1
        return base + (nsteps - inter_steps) * intra + inter_steps * inter
    log_nodes = int(math.log2(nodes))
    if algo == "tree":
        return base + 2 * ((n // nodes - 1) * intra + log_nodes * inter)
    if algo == "nvls":
        return intra + (inter if nodes > 1 else 0.0)
    if algo == "nvls_tree":
        return base + intra + 2 * log_nodes * inter
    if algo == "pat":
        return base + log_nodes * inter / 3.5 + n * 2.8
    if algo == "collnet_direct":
        return base + 2 * (min(1, n // nodes - 1) * intra + (n // nodes - 1) * 0.4) + inter
    return base + 2 * (n // nodes - 1) * intra + inter


def nccl_time_us(s: System, c: dict, collective: str, algo: str, proto: str, nbytes: int) -> float:
    """``ncclTopoGetAlgoTime``: latency + nBytes / bandwidth, with its size corrections; -1 when disabled."""
    bw = bus_bandwidth(s, c, collective, algo, proto)
    if bw <= 0:
        return -1.0
    lat = latency_us(s, c, collective, algo, proto)
    log_size = int(math.log2(nbytes >> 6)) if nbytes >= 64 else -1
    if algo == "tree" and 0 <= log_size < 23 and (collective == "all_reduce" or c["tree_correction_all_collectives"]):
        bw *= c["tree_correction"][proto][log_size]
    if algo == "ring" and proto == "Simple" and s.n_nodes > 1 and collective == "all_reduce" \
            and nbytes / (s.ring.channels * s.n_ranks) >= 64:
        lat *= c["ring_plateau_factor"]["below_sm80" if s.sm < 80 else "sm80_and_up"]
    return lat + nbytes / (1000 * bw)


# ---- what a run takes -------------------------------------------------------------------------------------

@dataclass
class Estimate:
    """One algorithm x protocol: NCCL's own estimate and the predicted time."""

    algo: str
    proto: str
    nccl_time_s: float
    time_s: float
    channels: int


@dataclass
class NcclPrediction:
    """NCCL's choice for one collective and the predicted time; ``candidates`` fastest (by NCCL) first."""

    collective: str
    ranks: list[int]
    nbytes: int
    algo: str
    proto: str
    channels: int
    time_s: float
    nccl_time_s: float
    family: str
    system: System
    candidates: list[Estimate] = field(default_factory=list)
    host_bound: bool = False

    @property
    def detail(self) -> str:
        if self.algo == P2P:
            text = f"nccl p2p/Simple, {self.channels} channels"
        else:
            text = f"nccl {self.algo}/{self.proto}, {self.channels} channels"
        return text + (" (host launch bound)" if self.host_bound else "")


def natural_channels(s: System, c: dict, algo: str) -> int:
    """Channels the search's graph gives the communicator: the graph's, doubled at setup (connect.cc), NVLS
    its own count; the links' bandwidth NCCL's tuning counts is spread over these."""
    if algo in ("nvls", "nvls_tree"):
        return c["nvls_channels"]
    return min(2 * s.ring.channels, c["max_channels"])


def comm_channels(s: System, c: dict, algo: str) -> int:
    """Channels the communicator runs: `natural_channels` clamped by NCCL_MAX_NCHANNELS / NCCL_MIN_NCHANNELS
    (NVLS: its own count, NCCL_NVLS_NCHANNELS, at most NCCL_MAX_NCHANNELS)."""
    natural = natural_channels(s, c, algo)
    if algo in ("nvls", "nvls_tree"):
        return min(natural, s.env.max_channels or natural)
    return s.env.channels(natural)


def channels_used(s: System, c: dict, algo: str, proto: str, nbytes: int) -> int:
    """Channels a call of ``nbytes`` runs on: NCCL sheds channels while nBytes < nc * nThreads * threshold."""
    nc = comm_channels(s, c, algo)
    nt = c["max_threads"][proto]
    thr = c["thread_threshold_bytes"][proto] * (s.n_ranks if algo == "ring" and proto == "LL" else 1)
    while nbytes < nc * nt * thr:
        if nc >= 2:
            nc -= 1
        elif nt % 128 == 0:
            nt //= 2
        else:
            break
    return nc


def chain_gbps(s: System, c: dict, proto: str, share: float = 1.0) -> float:
    """Algorithm bandwidth (GB/s) a tree all-reduce runs at inside one node whose GPUs reach each other through
    switches (NVSwitch, PCIe), where NCCL's tree is a chain (search.cc, the tree pattern inside a node). A GPU
    with a parent and a child sends the data up (reduce) and down (broadcast): twice the size through its one
    port; a chain of two moves it once each way. A GPU sends at its links' capacity (``Graph.link_gbps``)
    with the protocol's factors of NCCL's tuning: Simple the tree factor, LL128 the one-node tree factor and
    per-channel cap, LL the ring's LL rate (8 B of data per 16 B line, capped by llMaxBw). NCCL's
    estimate divides LL by 3.8 instead, a rate a node's chain does not run at (forced Tree/LL on 2 and 4 H200
    runs at the ring's LL rate)."""
    send = s.ring.link_gbps * share
    if proto == "Simple":
        rate = send * c["tree_factor"]
    elif proto == "LL128":
        nch = (s.tree or s.ring).channels * share
        rate = min(send * c["tree_ll128_factor_one_node"], nch * _row(c["per_channel_max_tree_ll128_bw"], s)[0])
    else:
        rate = min(_row(c["ll_max_bw"], s)[0], send * c["ring_ll_factor"])
    return rate / (1 if s.n_ranks == 2 else 2)


def ring_loop_gbps(s: System, c: dict, collective: str, proto: str, blocks: int, share: float = 1.0) -> float:
    """Algorithm bandwidth (GB/s) of a ring inside one node, loop by loop. In NCCL's device code (runRing of
    all_gather.h, reduce_scatter.h, all_reduce.h) a channel's block runs the steps of a loop one after another,
    one chunk each: an all-gather or reduce-scatter n-1 steps that send over the link, an all-reduce 2(n-1),
    and then one step inside the GPU (recv / recvReduceCopy: out of the receive buffer into the user buffer).
    Each step waits for the previous GPU's, so every GPU and channel runs the same step at once, and while the
    last one copies inside the GPU the link carries nothing: a loop of n chunks takes sends x chunk / link rate
    + chunk / local rate. Link rate: NCCL's bus bandwidth with the protocol's factors, at the links' capacity
    (``Graph.link_gbps``), at most NCCL's per-channel ceiling per block (Simple: ``p2p_channel_gbps``; LL128:
    perChMaxRingLL128Bw over the two blocks of a graph channel); local rate: perChMaxTreeBw per block, as for
    the copies of point-to-point calls inside one GPU (``p2p_local_copy_gbps``). Broadcast and reduce make one
    step per chunk on each GPU, the busiest over the link. LL is left to NCCL's llMaxBw, a ceiling of the whole
    kernel."""
    n = s.n_ranks
    sends = _nsteps(collective, n)
    # NCCL's bus bandwidth, back from algorithm to bus, at the links' capacity rather than the search's speed
    link = bus_bandwidth(s, c, collective, "ring", proto, share) * sends / n * s.ring.link_gbps / s.ring.total_gbps
    if proto == "LL128":
        per_block = _row(c["per_channel_max_ring_ll128_bw"], s)[_index2(s)] / 2
    else:
        per_block = p2p_channel_gbps(s, c)
    link = min(link, blocks * per_block)
    if collective in _RING_ONLY:
        return link
    return n / (sends / link + 1 / (blocks * p2p_local_copy_gbps(s, c)))


def nvls_loop_bytes(s: System, c: dict, nbytes: int, channels: int) -> int:
    """Bytes one loop of the NVLS all-reduce moves on one node: channels x heads (one per GPU) x the chunk NCCL
    picks for ``nbytes`` (enqueue.cc calcCollChunking: 128 KiB, shrunk to 64 / 32 / 16 KiB for smaller calls)."""
    concurrent = channels * int(s.ppn)
    chunk = c["nvls_chunk_max_bytes"]
    for times, smaller in c["nvls_chunk_shrink"]:
        if nbytes < times * concurrent * chunk and chunk > smaller:
            chunk = smaller
    return concurrent * chunk


def chain_fill_chunks(n: int, chunks: float) -> float:
    """Chunk times (of the chain's steady pace) a tree all-reduce on a chain of ``n`` GPUs takes beyond its
    ``chunks`` chunks per channel, when a chunk is forwarded whole (store and forward). Device code (runTreeSplit):
    every GPU but the root runs a reduce-up group and a broadcast-down group at once; the root (one end of the
    chain) reduces and sends down in one pass. Position k from the leaf (root at n-1) sends its first chunk
    after the k hops that bring it there, sends each chunk ``load`` times (up and down in the middle of the
    chain, once at either end) and its last send is followed by the hops left to the leaf. A GPU's port sets
    a bound of entry + load x chunks + exit hop times; the slowest port sends ``max load`` chunks per steady
    chunk time."""
    if n < 2:
        return 0.0
    peak_load = 2 if n > 2 else 1
    bounds = []
    for k in range(n):
        if k == 0:                  # the leaf: its last chunk still climbs n-2 hops and comes down n-1
            entry, load, exit_hops = 0, 1, 2 * n - 3
        elif k == n - 1:            # the root: reduce and send down in one pass
            entry, load, exit_hops = n - 1, 1, n - 2
        else:                       # the last send is the broadcast down, k-1 hops above the leaf
            entry, load, exit_hops = k, 2, k - 1
        bounds.append(entry + load * chunks + exit_hops)
    return max(bounds) / peak_load - chunks


def tree_fill_bytes(s: System, c: dict, proto: str, nbytes: int, channels: int) -> float:
    """Bytes-equivalent of the pipeline fill of a tree all-reduce on a one-node chain: Simple forwards a chunk
    (one step of its buffer: ``tree_simple_chunk_bytes``, enqueue.cc calcCollChunking) only when the whole chunk
    has arrived, so the first chunk's trip up and down the chain costs chunk times (``chain_fill_chunks``). LL
    and LL128 carry a flag in every line, so a GPU forwards each line as it lands: their fill is the per-hop
    latency NCCL already counts."""
    if proto != "Simple" or channels < 1:
        return 0.0
    per_channel = nbytes / channels
    chunk = min(c["tree_simple_chunk_bytes"], per_channel)
    if chunk <= 0:
        return 0.0
    return chain_fill_chunks(s.n_ranks, per_channel / chunk) * chunk * channels


def _predicted_us(s: System, c: dict, collective: str, algo: str, proto: str, nbytes: int, scale: float) -> tuple[float, int]:
    nc = channels_used(s, c, algo, proto, nbytes)
    # the share of the links the channels run carry: channels NCCL sheds for a small call leave theirs idle;
    # a communicator clamped to fewer channels (NCCL_MAX_NCHANNELS) leaves the links free and each block runs
    # at its own ceiling (`_block_ceiling_gbps`), NVLS's channels excepted (its bandwidth is per NVLS channel)
    nvls_algo = algo in ("nvls", "nvls_tree")
    share = min(1.0, nc / (natural_channels if nvls_algo else comm_channels)(s, c, algo))
    moved = nbytes
    chain = algo == "tree" and s.n_nodes == 1 and collective == "all_reduce" and not s.gpu_mesh
    if chain:
        bw = chain_gbps(s, c, proto, share) * scale
        moved += tree_fill_bytes(s, c, proto, nbytes, nc)
    else:
        bw = bus_bandwidth(s, c, collective, algo, proto, share, nvls_traffic=True) * scale
    if algo == "ring" and proto != "LL" and s.n_nodes == 1:  # across nodes the network sets the pace
        bw = ring_loop_gbps(s, c, collective, proto, nc, share) * scale
    if algo == "tree" and not chain:  # NCCL's own size correction stands for the pipeline of trees not modelled
        log_size = int(math.log2(nbytes >> 6)) if nbytes >= 64 else -1
        if 0 <= log_size < 23:
            bw *= c["tree_correction"][proto][log_size]
    if not nvls_algo and comm_channels(s, c, algo) < natural_channels(s, c, algo):
        bw = min(bw, _block_ceiling_gbps(s, c, collective, algo, nc) * scale)
    if algo == "nvls" and collective == "all_reduce" and s.n_nodes == 1:
        # three warp groups pipeline the loops (scatter, reduce + multicast, gather): the first loop's bytes
        # pass the stages one after another before the pipeline runs full
        moved += (c["nvls_pipeline_stages"] - 1) * min(nbytes, nvls_loop_bytes(s, c, nbytes, nc))
    return launch_overhead_us(proto) + latency_us(s, c, collective, algo, proto) + moved / (1000 * bw), nc


def _block_ceiling_gbps(s: System, c: dict, collective: str, algo: str, blocks: int) -> float:
    """Algorithm bandwidth (GB/s) ``blocks`` channels reach when their blocks, not the links, set the pace: each
    block at NCCL's per-channel ceiling of the Simple protocol over the two blocks of a graph channel
    (`p2p_channel_gbps`), from bus to algorithm bandwidth as `bus_bandwidth` converts it."""
    bus = blocks * p2p_channel_gbps(s, c)
    if algo != "ring" and collective in ("all_gather", "reduce_scatter"):
        return bus
    return bus * (s.n_ranks / _nsteps(collective, s.n_ranks) if algo == "ring" else 0.5)


def _pow2_up(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def p2p_op_channels(topo: Topology, s: System, c: dict, names: list[str], nbytes: float) -> tuple[int, int]:
    """Channels one send (or receive) of ``nbytes`` runs on when each of ``names`` exchanges with its peers, and
    the p2p channels of the communicator. NCCL gives a peer 2 channels per NVLink of its path (2 on PCIe;
    paths.cc ncclTopoComputeP2pChannels, rounded up to a power of two, at most the p2p channels: the collective
    channels rounded up to a power of two); a send starts on the fewest channels that keep nRanks x channels
    within the p2p channels and doubles them while a channel would carry more than 32 chunks (inside a node;
    enqueue.cc addP2pToPlan)."""
    nv = c["nvlink_bw_per_link"].get(s.sm, c["nvlink_bw_per_link"][80 if s.sm >= 80 else 70])
    p2p_channels = min(_pow2_up(comm_channels(s, c, "ring")), c["max_channels"])
    per_peer = p2p_channels
    for a in names:
        for b in names:
            if a != b:
                direct = s.ring.path_type == "NVL" and _node_of(topo, a) == _node_of(topo, b)
                per_peer = min(per_peer, 2 * max(1, int(_pair_gbps(topo, s, c, a, b) / nv + 1e-9)) if direct else 2)
    per_peer = min(_pow2_up(per_peer), p2p_channels)
    n = len(names)
    low = high = per_peer
    while low * n > p2p_channels and low > 1:
        low //= 2
    while c.get("p2p_channels_per_op_quarter") and high * n > 4 * p2p_channels and high > 1:
        high //= 2
    step = c["p2p_chunk_bytes"]["nvlink" if s.ring.path_type == "NVL" else "pci"]
    min_part, max_part = (step / 2, step) if s.n_nodes > 1 else (step / 8, step * 32)
    nch = max(1, min(low, math.ceil(nbytes / min_part)))
    while max(min_part, nbytes / nch) > max_part and nch <= high // 2:
        nch *= 2
    return nch, p2p_channels


def p2p_channel_gbps(s: System, c: dict) -> float:
    """GB/s one channel (one thread block) of point-to-point copies moves with the Simple protocol: NCCL's
    per-channel ceiling of a Simple pattern (perChMaxTreeBw) over the two blocks a graph channel becomes once
    the communicator doubles its channels (connect.cc)."""
    return _row(c["per_channel_max_tree_bw"], s)[_index2(s)] / 2


def p2p_local_copy_gbps(s: System, c: dict) -> float:
    """GB/s one channel's block copies a chunk between a p2p receive buffer and a user buffer of the same GPU:
    NCCL's per-channel ceiling of the Simple protocol (perChMaxTreeBw) whole. The half of it that
    ``p2p_channel_gbps`` gives a block is for copies that cross a link (NVLink, PCI), where the link's round
    trips and not the block set the pace; a copy inside the GPU's own memory does not pay them."""
    return _row(c["per_channel_max_tree_bw"], s)[_index2(s)]


def p2p_drain_us(s: System, c: dict, part_bytes: float, works_per_channel: int, scale: float = 1.0) -> float:
    """Microseconds a channel's part of a send (``part_bytes``) takes beyond its bytes over the link: the chunk
    pipeline's fill. A point-to-point chunk (NCCL_P2P_NVL_CHUNKSIZE / PCI_CHUNKSIZE, one FIFO step) passes two
    copies one after the other: the link copy and a copy inside one GPU (P2P write, Hopper and others: the
    receiver copies the chunk out of its FIFO into the user buffer; P2P read, Ampere on NVLink: the sender
    first copies it into its own FIFO, which the receiver reads). The chunks overlap the two copies (NCCL_STEPS
    FIFO slots), so a part pays the link copy of every chunk plus the local copy of one chunk; a part of one
    chunk or less runs the two copies back to back. ``works_per_channel`` sends sharing a block split its
    warps (sendrecv.h: nWarpPerWork = nWarps / nWorks), so their last chunks drain one block's rate."""
    chunk = min(part_bytes, c["p2p_chunk_bytes"]["nvlink" if s.ring.path_type == "NVL" else "pci"])
    return max(1, works_per_channel) * chunk / (1000 * p2p_local_copy_gbps(s, c) * scale)


def _p2p_us(topo: Topology, s: System, c: dict, collective: str, ranks: list[int], nbytes: int, root: int,
            scale: float) -> tuple[float, int]:
    """Grouped sends and receives: one Ring/Simple step of latency; bytes over each GPU's links (their
    capacity, ``Graph.link_gbps``), over each pair's path and over the channels each send runs on (fewer for
    smaller sends), and inside a node the fill of each channel's chunk pipeline (``p2p_drain_us``). Returns the
    time (us) and the channels one send runs on."""
    n = len(ranks)
    lat = c["base_latency_us"]["ring"]["Simple"] + c["hw_latency_us"][s.hw]["ring"]["Simple"]
    names = [topo.device(r) for r in ranks]
    per_gpu = s.ring.link_gbps * scale if s.n_nodes == 1 else min(s.ring.total_gbps, s.inter_gbps) * scale
    block = nbytes if collective == "send_recv" else nbytes / n  # bytes of one send
    op_channels, p2p_channels = p2p_op_channels(topo, s, c, names, block)
    channel_gbps = p2p_channel_gbps(s, c) * scale
    if s.n_nodes == 1:  # across nodes the network sets the pace
        peers = 1 if collective == "send_recv" else n - 1  # the busiest GPU's sends (or receives)
        per_gpu = min(per_gpu, min(p2p_channels, peers * op_channels) * channel_gbps)
        # a round's send and receive are one work on the same channels (enqueue.cc addP2pToPlan); only
        # when the parts of all sends outnumber the p2p channels do two works share a block
        works = math.ceil(peers * op_channels / p2p_channels)
        lat += p2p_drain_us(s, c, block / op_channels, works, scale)

    def pair(a: str, b: str) -> float:
        path = _pair_gbps(topo, s, c, a, b) * scale
        if _node_of(topo, a) != _node_of(topo, b):
            return min(path, gpu_net_gbps(s) * scale)  # one GPU's flow leaves through its own NIC
        return min(per_gpu, path, op_channels * channel_gbps if s.n_nodes == 1 else path)

    if collective == "send_recv":
        return lat + nbytes / (1000 * min(pair(a, b) for a, b in zip(names, names[1:] + names[:1]))), op_channels
    if collective == "all_to_all":
        worst = max(block / pair(a, b) for a in names for b in names if a != b)
        return lat + max(block * (n - 1) / per_gpu, _off_node_s(s, block * (n - s.ppn), scale), worst) / 1000, op_channels
    hub = names[root]
    worst = max(block / (pair(hub, b) if collective == "scatter" else pair(b, hub)) for b in names if b != hub)
    return lat + max(block * (n - 1) / per_gpu, worst) / 1000, op_channels


def gpu_net_gbps(s: System) -> float:
    """GB/s one GPU's traffic to other nodes gets when it alone sends: the NIC NCCL gives it (its nearest;
    NICs shared by the GPUs of a node: DGX-1's 4 NICs serve 2 GPUs each), not the whole node's network."""
    return s.inter_gbps / max(1, min(len(s.nics) or 1, int(s.ppn)))


def _off_node_s(s: System, off_bytes_per_gpu: float, scale: float) -> float:
    """Seconds x 1e9 (the units of bytes / GB/s) the bytes every GPU sends to other nodes take when all GPUs of a
    node send at once: the node's network shared by its GPUs (all_to_all across nodes)."""
    if s.n_nodes < 2 or off_bytes_per_gpu <= 0:
        return 0.0
    return off_bytes_per_gpu * s.ppn / (s.inter_gbps * scale)


def _pair_gbps(topo: Topology, s: System, c: dict, a: str, b: str) -> float:
    key = (a, b)
    if key not in s.pair_gbps:
        if _node_of(topo, a) != _node_of(topo, b):
            s.pair_gbps[key] = s.inter_gbps
        else:
            capacity: dict = {}
            p = _pair_path(node_view(topo, _node_of(topo, a)), a, b, c, s.sm, capacity, s.env)
            s.pair_gbps[key] = min(capacity[k] / f for k, f in p.uses) if p else 0.1
    return s.pair_gbps[key]


def normalize_algo(name: str | None) -> str | None:
    """NCCL_ALGO spellings (Ring, NVLS, NVLSTree, CollNetDirect...) -> this module's names; None stays None."""
    if name is None:
        return None
    key = name.strip().lower().replace("-", "_")
    key = _ALGO_SPELLINGS.get(key.replace("_", ""), key)
    if key not in ALGORITHMS:
        raise MeshscaleError(f"unknown NCCL algorithm {name!r}; use one of {', '.join(ALGORITHMS)}")
    return key


def normalize_proto(name: str | None) -> str | None:
    """NCCL_PROTO spellings (ll, ll128, simple) -> LL, LL128, Simple; None stays None."""
    if name is None:
        return None
    for p in PROTOCOLS:
        if name.strip().lower() == p.lower():
            return p
    raise MeshscaleError(f"unknown NCCL protocol {name!r}; use one of {', '.join(PROTOCOLS)}")


def predict(topo: Topology, collective: str, ranks: list[int], nbytes: int, *, nccl_version: str | None = None,
            nccl_algo: str | None = None, proto: str | None = None, nvls: bool | None = None, root: int = 0,
            gpus_per_thread: int = 1, bandwidth_scale: float = 1.0, env: NcclEnv | None = None) -> NcclPrediction:
    """NCCL's choice and the predicted time of ``collective`` of ``nbytes`` (the nccl-tests size) over ``ranks``.
    ``nccl_algo`` / ``proto`` force them as NCCL_ALGO / NCCL_PROTO do; ``nvls`` False turns NVLink SHARP off
    (NCCL_NVLS_ENABLE=0; default: on where the switches multicast); ``gpus_per_thread`` is how many GPUs one
    host thread drives (nccl-tests -g); ``bandwidth_scale`` scales every bandwidth (a calibration); ``env``:
    NCCL's environment (`nccl_env.NcclEnv`: channels, transports, NCCL_ALGO / NCCL_PROTO / NCCL_NVLS_ENABLE)."""
    from meshscale.simulate.nccl_env import with_forced

    collective = kind(collective).name
    c = constants(nccl_version)
    env = with_forced(env or DEFAULT_ENV, nccl_algo, proto, nvls)
    s = analyse(topo, list(ranks), nccl_version, env)
    nbytes = int(nbytes)
    if len(ranks) < 2:
        return NcclPrediction(collective, list(ranks), nbytes, "none", "-", 0,
                              host_bound_s(0.0, gpus_per_thread, nccl_version),
                              0.0, c["family"], s)
    if collective in _P2P_COLLECTIVES:
        t, nc = _p2p_us(topo, s, c, collective, list(ranks), nbytes, root, bandwidth_scale)
        chosen = Estimate(P2P, "Simple", t * 1e-6, t * 1e-6, nc)
        candidates = [chosen]
    else:
        candidates = []
        for a in ALGORITHMS:
            if not allows(env.algos, a):
                continue
            for p in PROTOCOLS:
                if not allows(env.protos, p):
                    continue
                if not enabled(s, c, collective, a, p, env.nvls is not False):
                    continue
                est = nccl_time_us(s, c, collective, a, p, nbytes)
                if est < 0:
                    continue
                t, nc = _predicted_us(s, c, collective, a, p, nbytes, bandwidth_scale)
                candidates.append(Estimate(a, p, est * 1e-6, t * 1e-6, nc))
        if not candidates:
            what = " ".join(x for x in env.settings if x.startswith(("NCCL_ALGO", "NCCL_PROTO"))) or \
                "/".join(x for x in (nccl_algo, proto) if x) or "any algorithm"
            raise MeshscaleError(f"NCCL {c['family']} cannot run {collective} with {what} on {topo.name} "
                                 f"devices {list(ranks)} (the hardware or the version does not offer it)")
        candidates.sort(key=lambda e: e.nccl_time_s)
        chosen = candidates[0]
    device_s = chosen.time_s if chosen.algo == P2P else max(chosen.time_s, call_floor_us(s, c, collective) * 1e-6)
    time_s = host_bound_s(device_s, gpus_per_thread, nccl_version)
    return NcclPrediction(collective, list(ranks), nbytes, chosen.algo, chosen.proto, chosen.channels, time_s,
                          chosen.nccl_time_s, c["family"], s, candidates,
                          host_bound=max(1, gpus_per_thread) * host_launch_s(nccl_version) > device_s)
