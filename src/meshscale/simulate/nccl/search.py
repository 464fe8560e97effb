"""What NCCL derives from the topology (src/graph/search.cc, paths.cc): the path between two GPUs of a node
(type and the links a channel consumes), the ring and tree graphs its search lays over them (speed ladder,
channels, duplication), and `analyse`, which gathers it all in a `System` as NCCL's tuning reads it."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from meshscale.errors import MeshscaleError
from meshscale.simulate.nccl.net_socket import UNKNOWN_SPEED_GBPS, SocketRun, socket_setup, tcp_host
from meshscale.simulate.nccl.network import (REFERENCE_NET_LATENCY_S, NicPath, fabric_gbps, host_memory_gbps,
                                             host_run_gbps, links_gbps, network_latency_s, network_paths, node_of,
                                             node_view, port_gbps, ranks_by_node, same_host, staging_gpus)
from meshscale.simulate.nccl.tables import (ARCH, DFS_VISIT_LIMIT, MAX_NODE_GPUS, PATH_TYPES, constants, cpu_class,
                                            data_file, gpu_sm)
from meshscale.simulate.nccl_env import DEFAULT_ENV, NcclEnv
from meshscale.topology import Topology, route
from meshscale.topology.queries import path_class



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
    transport: str = "p2p"  # how its hops move data: p2p (NVLink, PCIe peer to peer), shm (host memory) or net
    chain_capacity_gbps: float = 0.0  # the same, without each ring's closing hop (broadcast and reduce); 0: as above

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
        if self.transport == "shm" and self.capacity_gbps:
            return self.capacity_gbps  # host memory may carry less than NCCL's search, which does not see it, gave
        return max(self.capacity_gbps, self.total_gbps)

    @property
    def chain_gbps(self) -> float:
        """`link_gbps` of the chain a broadcast or reduce runs: the ring less the hop back into its first GPU,
        which carries nothing; where that hop shares a link with the others (a PCIe switch's up-link under the
        SHM transport), the chain's hops get the whole link."""
        if self.transport == "shm" and self.chain_capacity_gbps:
            return self.chain_capacity_gbps
        return max(self.chain_capacity_gbps, self.link_gbps)


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
    pair_gbps: dict[tuple[str, str], float] = field(default_factory=dict)  # (src, dst) -> NCCL path GB/s
    tree: Graph | None = None  # the tree graph (chains inside the node); None: trees use the ring graph
    net_extra_us: float = 0.0  # network latency beyond the InfiniBand fabric NCCL's constants were measured on
    nics: list[NicPath] = field(default_factory=list)  # each NIC of a node (several nodes only)
    gpu_mesh: bool = False  # GPUs of a node joined by NVLinks between them (not only through switches)
    env: NcclEnv = DEFAULT_ENV  # NCCL's environment (channels, transports)
    mixed_sm: bool = False  # GPUs of several generations: NCCL disables LL128 (min != max compute capability)
    tables: dict = field(default_factory=dict)  # NCCL family -> its `tuning.TuningTable`, kept by tuning_table
    socket: SocketRun | None = None  # the socket transport between NCCL's nodes: what its threads copy
    inter_run_gbps: float = 0.0  # what a run moves node to node where NCCL's NIC speed does not say (loopback)

    @property
    def ppn(self) -> float:
        return self.n_ranks / self.n_nodes

    @property
    def arch(self) -> str:
        return ARCH[max(k for k in ARCH if k <= max(self.sm, 70))]

    @property
    def hw(self) -> str:
        return "net" if self.n_nodes > 1 else self.ring.link


@dataclass
class _PairPath:
    path_type: str
    uses: list  # (resource key, consumption per unit of channel bandwidth)
    transport: str = "p2p"
    host_uses: list = field(default_factory=list)  # resources a run loads that NCCL's search does not see


def pair_path(topo: Topology, a: str, b: str, c: dict, sm: int, capacity: dict,
               env: NcclEnv = DEFAULT_ENV, run: dict | None = None) -> _PairPath | None:
    """NCCL's view of the path a -> b inside a node: its type and the resources a channel consumes on it, their
    capacity as NCCL rates them in ``capacity``. Where ``env`` denies the P2P transport on that path, the SHM
    transport's path through host memory (or, SHM disabled too, the network's); ``run`` then receives the rates
    a run moves bytes at where they differ from NCCL's (`host_run_gbps`)."""
    natural = _p2p_pair_path(topo, a, b, c, sm, capacity)
    if natural is None or env.p2p_allowed(natural.path_type):
        return natural
    if env.shm:
        return _host_pair_path(topo, a, b, c, capacity, {} if run is None else run)
    return _net_pair_path(topo, a, b, c, capacity, env)


def _p2p_pair_path(topo: Topology, a: str, b: str, c: dict, sm: int, capacity: dict) -> _PairPath | None:
    if node_of(topo, a) != node_of(topo, b):  # two nodes of a cluster: the network's, never a P2P path
        return None
    nv = c["nvlink_bw_per_link"].get(sm, c["nvlink_bw_per_link"][80 if sm >= 80 else 70])
    direct = [l for l in topo.links_between(a, b) if l.kind == "nvlink"]
    if direct:
        key = ("nvl", a, b)
        capacity[key] = sum(l.count for l in direct) * nv
        return _PairPath("NVL", [(key, 1.0)])
    (a_switches, a_links), (b_switches, b_links) = _switches_of(topo, a), _switches_of(topo, b)
    if a_switches & b_switches or route(topo, a, b).fabric == "nvlink":  # through NVSwitches: a's links in, b's out
        capacity[("nvs", "out", a)], capacity[("nvs", "in", b)] = a_links * nv, b_links * nv
        return _PairPath("NVL", [(("nvs", "out", a), 1.0), (("nvs", "in", b), 1.0)])
    r = route(topo, a, b)
    if r.fabric != "pcie":
        return None
    path = r.paths[0]
    path_type = path_class(topo, path.nodes, nccl=True)
    cpus = [n for n in path.nodes[1:-1] if topo.nodes[n].kind in ("cpu", "host")]
    intel = bool(cpus) and all(cpu_class(topo.nodes[x].attrs.get("model", "")) in ("bdw", "skl", "srp", "erp")
                               for x in cpus)
    uses = []
    for (i, d), rate in links_gbps(topo, path.directed_links, c).items():
        capacity[("link", i, d)] = rate
        # P2P through an Intel root complex: 64 B TLPs cost 1.2x the link (search.cc, PHB paths); not the CPU link
        intel_tlp = path_type == "PHB" and intel and topo.links[i].kind not in ("qpi", "upi")
        uses.append((("link", i, d), c["intel_p2p_overhead"] if intel_tlp else 1.0))
    return _PairPath(path_type, uses)


def _switches_of(topo: Topology, gpu: str) -> tuple[set[str], int]:
    """The NVSwitches a GPU links to and its NVLinks to them; asked for every pair (5,112 on an NVL72 rack)."""
    key = ("meshscale.simulate.nccl.switches_of", gpu)
    if key not in topo.route_cache:
        links = [l for l in topo.links_of(gpu, "nvlink") if topo.nodes[l.other(gpu)].kind == "nvswitch"]
        topo.route_cache[key] = {l.other(gpu) for l in links}, sum(l.count for l in links)
    return topo.route_cache[key]


def local_cpu(topo: Topology, gpu: str) -> str | None:
    """The CPU a GPU's PCIe tree hangs off (its nearest CPU by route), found in its own node (`node_view`: a
    GPU's PCIe and its CPUs stay in its node, so a cluster of thousands is neither scanned nor routed)."""
    inside = node_view(topo, node_of(topo, gpu))
    cpus = inside.nodes_of("cpu") + inside.nodes_of("host")
    beside = [l.other(gpu) for l in inside.links_of(gpu) if l.kind in ("c2c", "pcie") and l.other(gpu) in cpus]
    if beside:  # linked to a CPU (a Grace over NVLink-C2C): that one, without routing
        return beside[0]
    mine = [x for x in cpus if same_host(inside, x, gpu)]
    return min(mine, key=lambda x: len(route(inside, gpu, x).paths[0].nodes), default=None)


def _host_pair_path(topo: Topology, a: str, b: str, c: dict, capacity: dict, run: dict) -> _PairPath:
    """The SHM transport's path a -> b: paths.cc diverts a pair without P2P through the CPU next to the receiver
    (addInterStep), and shm.cc places the buffer there (NCCL_SHM_LOCALITY's default, the receiver's side): a's
    GPU writes into that host memory over its PCIe links (and the CPUs' link, if a hangs off the other CPU),
    b's reads it over its own, and the host's memory takes every byte twice (written, then read). Type PHB, or
    SYS when it crosses between CPUs. ``run`` gets each resource's rate for a run (`host_run_gbps`); host
    memory is a resource NCCL's search does not see."""
    host = local_cpu(topo, b)
    if host is None:
        raise MeshscaleError(f"{topo.name}: no CPU to stage {a} -> {b} through host memory (P2P disabled); "
                             "describe the host in the system file")
    legs = [route(topo, a, host).paths[0], route(topo, host, b).paths[0]]
    uses = []
    for leg in legs:
        for key, rate in links_gbps(topo, leg.directed_links, c).items():
            capacity[("link", *key)] = rate
            run[("link", *key)] = host_run_gbps(topo.links[key[0]], rate)
            uses.append((("link", *key), 1.0))
    host_uses = []
    memory_gbps = host_memory_gbps(topo, host)
    if memory_gbps:
        run[("mem", host)] = memory_gbps
        host_uses.append((("mem", host), 2.0))
    cpus = {x for leg in legs for x in leg.nodes if topo.nodes[x].kind in ("cpu", "host")}
    return _PairPath("SYS" if len(cpus) >= 2 else "PHB", uses, "shm", host_uses)


def _net_pair_path(topo: Topology, a: str, b: str, c: dict, capacity: dict, env: NcclEnv) -> _PairPath:
    """The NET transport's path a -> b inside one node (P2P and SHM both disabled): out through the NIC nearest
    a and back in through it (paths.cc marks the pair PATH_NET)."""
    node = node_of(topo, a)
    nics = [n for n in topo.nodes_of("nic") if node_of(topo, n) == node and port_gbps(topo, n)]
    if not nics:
        if not env.uses_socket(False):
            raise MeshscaleError(f"{topo.name}: with P2P and SHM disabled NCCL sends through the network, and NCCL_NET="
                                 "IB needs a NIC this node does not describe; describe the NICs or drop NCCL_NET=IB")
        capacity[("nic", "lo")] = UNKNOWN_SPEED_GBPS  # sockets over an interface whose speed NCCL does not read
        return _PairPath("SYS", [(("nic", "lo"), 1.0)], "net")
    nic = min(nics, key=lambda n: len(route(topo, a, n).paths[0].nodes))
    capacity[("nic", nic)] = port_gbps(topo, nic)  # as NCCL rates it; a socket run's copies: `p2p.p2p_us`
    return _PairPath("SYS", [(("nic", nic), 1.0)], "net")


@dataclass
class _Hop:
    """One pair's path as the ring search reads it: its path type's rank, its uses (resource, consumption per
    unit of speed), per resource what a hop at the search's speed needs left (less a tolerance) and takes, and
    a path of two uses (through NVSwitches: the sender's links out, the receiver's in) as those two, which the
    search's ranking reads without a loop (it ranks every candidate of every GPU it places)."""

    kind: int
    uses: list
    needs: tuple
    two: tuple | None = None


def _hops(paths: dict, speed: float, slot: dict) -> dict:
    """Each pair's `_Hop` at ``speed``, its resources named by their ``slot`` in the search's list of what is left."""
    out = {}
    for pair, p in paths.items():
        uses = [(slot[k], f) for k, f in p.uses]
        out[pair] = _Hop(PATH_TYPES.index(p.path_type), uses, tuple((k, speed * f - 1e-9, speed * f) for k, f in uses),
                         (*uses[0], *uses[1]) if len(uses) == 2 else None)
    return out


def _cycles(names: list[str], hops: dict, left: dict, budget: list[int], closed: bool = True):
    """Rings through ``names`` whose every hop (``hops``: `_hops` at the search's speed) has that speed left on
    each resource it uses (depth-first, nearest path types first); ``closed`` False: chains (a tree's
    intra-node pattern), from any first GPU. Each ring is yielded with its resources taken; they are given back
    after. ``budget``: visits left, shared by the whole search."""
    n, first = len(names), names[0]
    after = {u: [(v, hops[(u, v)]) for v in names if (u, v) in hops] for u in names}   # in ``names`` order
    order: list[str] = []
    placed: set[str] = set()

    def fits(hop: _Hop) -> bool:
        for k, need, _ in hop.needs:
            if not left[k] >= need:
                return False
        return True

    def take(hop: _Hop, sign: float) -> None:
        for k, _, amount in hop.needs:
            left[k] -= sign * amount

    def ranked(u: str) -> list:
        """The GPUs not placed yet that ``u`` reaches, nearest path type first, then most left on the hop's
        busiest resource (ties in ``names`` order: the position breaks them, as a stable sort would)."""
        found = []
        for i, (v, hop) in enumerate(after[u]):
            if v not in placed:
                if hop.two is None:
                    most = min([left[k] / f for k, f in hop.uses])
                else:   # min() of the two, as min() picks it
                    k1, f1, k2, f2 = hop.two
                    x, y = left[k1] / f1, left[k2] / f2
                    most = y if y < x else x
                found.append((hop.kind, -most, i, v, hop))
        found.sort()
        return found

    def dfs(u: str):
        budget[0] -= 1
        if budget[0] < 0:
            return
        if len(order) == n:
            hop = hops.get((u, first))
            if not closed:
                yield list(order)
            elif hop is not None and fits(hop):
                take(hop, 1)
                yield list(order)
                take(hop, -1)
            return
        for _kind, _left, _i, v, hop in ranked(u):
            if fits(hop):
                take(hop, 1)
                order.append(v)
                placed.add(v)
                yield from dfs(v)
                placed.discard(v)
                order.pop()
                take(hop, -1)

    for start in (names if not closed else names[:1]):
        order.append(start)
        placed.add(start)
        yield from dfs(start)
        placed.discard(start)
        order.pop()


def _first_uses(paths: dict) -> dict[str, set]:
    """Each sender's first resource over all its paths (its links out)."""
    out: dict = {}
    for (a, _), p in paths.items():
        for k, _f in p.uses[:1]:
            out.setdefault(a, set()).add(k)
    return out


def _pack_rings(names: list[str], paths: dict, capacity: dict, speed: float, limit: int,
                closed: bool = True, uniform: float | None = -1.0, out: dict | None = None) -> list[list[str]]:
    """As many rings (``closed`` False: chains) at ``speed`` as fit together (NCCL's search backtracks over
    channels too, within a time limit); stops at the bound the busiest GPU's links set. ``uniform`` and ``out``:
    `uniform_switch_capacity` and `_first_uses` of ``paths``, where the caller has them."""
    out = out if out is not None else _first_uses(paths)
    sends = min(int(sum(capacity[k] for k in ks) / speed + 1e-9) for ks in out.values())
    bound = min(limit, sends if closed else sends * len(names) // max(1, len(names) - 1))
    if uniform is not None and uniform < 0:
        uniform = uniform_switch_capacity(names, paths, capacity)
    # chains leave the first GPU's links in and the last's out unused: chains from other ends could add some
    # (2 GPUs: 0->1 and 1->0), unless the links' bound leaves no room for one more
    if uniform is not None and (closed or bound <= sends):
        return [list(names)] * min(bound, int(uniform / speed + 1e-9))
    return _searched_rings(names, paths, capacity, speed, bound, closed)


def uniform_switch_capacity(names: list[str], paths: dict, capacity: dict) -> float | None:
    """Each GPU's NVSwitch bandwidth (GB/s each way) where ``names`` are GPUs all alike behind NVSwitches, or None
    for any other node. Each pair path takes the sender's switch links out and the receiver's in, every GPU's as
    wide: the search's ordering ties at every step, so it lays every ring (or chain) in ``names`` order until the
    links are spent, capacity / speed of them (NVL72: 16 rings of 72 found at once, not by 72 x 72 steps each)."""
    caps = set()
    for a in names:
        for b in names:
            p = paths.get((a, b)) if a != b else None
            if a != b and (p is None or [k for k, _f in p.uses] != [("nvs", "out", a), ("nvs", "in", b)]
                           or any(f != 1.0 for _k, f in p.uses)):
                return None
        caps |= {capacity[("nvs", "out", a)], capacity[("nvs", "in", a)]}
    return caps.pop() if len(caps) == 1 else None


_SEARCHED: dict = {}  # a canonical search (`_search_shape`) -> the rings it found, as positions in ``names``


def _searched_rings(names: list[str], paths: dict, capacity: dict, speed: float, bound: int,
                    closed: bool) -> list[list[str]]:
    """`_pack_rings` by depth-first search: rings taken one after another, backtracking within a visit budget.
    The search reads its GPUs by position and its resources by key only, so two searches alike but for the names
    (the same node alone and as node k of a cluster, any cluster size) find the same rings: searched once."""
    shape = _search_shape(names, paths, capacity, speed, bound, closed)
    if shape not in _SEARCHED:
        if len(_SEARCHED) >= NODE_GRAPHS_KEPT:
            _SEARCHED.pop(next(iter(_SEARCHED)))
        at = {name: i for i, name in enumerate(names)}
        _SEARCHED[shape] = [[at[n] for n in ring] for ring in _dfs_rings(names, paths, capacity, speed, bound, closed)]
    return [[names[i] for i in ring] for ring in _SEARCHED[shape]]


def _search_shape(names: list[str], paths: dict, capacity: dict, speed: float, bound: int, closed: bool) -> tuple:
    """What `_dfs_rings` depends on, with GPUs named by position and resources numbered in order of first use:
    each pair's path type and uses, each resource's capacity, the speed, the bound and the pattern."""
    resources: dict = {}
    pairs = []
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            p = paths.get((a, b))
            if p is not None:
                pairs.append((i, j, p.path_type, tuple((resources.setdefault(k, len(resources)), f) for k, f in p.uses)))
    return len(names), tuple(pairs), tuple(capacity[k] for k in resources), speed, bound, closed


def _dfs_rings(names: list[str], paths: dict, capacity: dict, speed: float, bound: int,
               closed: bool) -> list[list[str]]:
    slot = {k: i for i, k in enumerate(capacity)}   # what is left by position: no key hashed per look-up
    left, rings, best, budget = list(capacity.values()), [], [[]], [DFS_VISIT_LIMIT]
    hops = _hops(paths, speed, slot)

    def rec():
        if len(rings) > len(best[0]):
            best[0] = list(rings)
        if len(rings) >= bound or budget[0] <= 0:
            return
        for ring in _cycles(names, hops, left, budget, closed):
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
    run: dict = {}  # resource -> GB/s a run moves where it differs from NCCL's rating (host-memory paths)
    paths = {}
    for a in names:
        for b in names:
            if a != b:
                p = pair_path(topo, a, b, c, sm, capacity, env, run)
                if p is not None:
                    paths[(a, b)] = p
    ladders = c["speed_ladder_intra"]
    ladder = ladders.get("sm100" if sm >= 100 else "sm90" if sm >= 90 else "default", ladders["default"])
    for allowed in (("NVL",), PATH_TYPES):
        usable = {k: p for k, p in paths.items() if p.path_type in allowed}
        if not usable:
            continue
        best: tuple[int, float, list] = (0, 0.0, [])
        max_bw = max(min(capacity[k] / f for k, f in p.uses) for p in usable.values())
        out = _first_uses(usable)
        total_bw = max(sum(capacity[k] for k in ks) for ks in out.values())
        if not closed:
            total_bw *= len(names) / (len(names) - 1)
        first, uniform = None, uniform_switch_capacity(names, usable, capacity)
        for speed in [s for s in ladder if s <= max_bw + 1e-9]:
            if first is not None and speed / first <= 0.49:
                break
            rings = _pack_rings(names, usable, capacity, speed, limit, closed, uniform, out)
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
            capacity_gbps, chain_gbps = _run_capacity(rings, paths, capacity, run, closed)
            if bw >= c["duplicate_min_bw"] and not (sm > 80 and bw < c["duplicate_sm90_max_bw"] and nch > 4):
                dup = min(2 * nch, dup_limit)
                bw, nch = bw / math.ceil(dup / nch), dup
            return Graph(nch, bw, worst, same, rings, capacity_gbps, _transport(paths, hops), chain_gbps)
    hops = list(zip(names, names[1:] + (names[:1] if closed else [])))
    if all(h in paths for h in hops):
        # search.cc: no pattern at any speed of the ladder -> "falling back to simple order": one channel over the
        # GPUs in order, typed SYS, rated 0.1 GB/s for the tuning; a run moves what its paths carry
        capacity_gbps, chain_gbps = _run_capacity([list(names)], paths, capacity, run, closed)
        return Graph(1, c["fallback_bw"], "SYS", True, [list(names)], capacity_gbps, _transport(paths, hops),
                     chain_gbps)
    raise MeshscaleError(f"{topo.name}: no ring joins devices {names}; check their links")


def _transport(paths: dict, hops: list) -> str:
    """The transport a graph's hops use: the farthest of them (net over shm over p2p)."""
    kinds = {paths[h].transport for h in hops}
    return "net" if "net" in kinds else "shm" if "shm" in kinds else "p2p"


def _run_capacity(rings: list, paths: dict, capacity: dict, run: dict, closed: bool) -> tuple[float, float]:
    """GB/s the channels ``rings`` carry at their links' capacity (each resource over its load, summed over every
    hop of every ring, at the rate a run moves: ``run`` where given, NCCL's rating otherwise), and the same for
    chains that leave out each ring's closing hop (broadcast, reduce); 0 for the chain where rings are not closed."""
    def carried(hops: list) -> float:
        load: dict = {}  # per unit of channel speed
        for hop in hops:
            for k, f in paths[hop].uses + paths[hop].host_uses:
                load[k] = load.get(k, 0.0) + f
        return len(rings) * min(run.get(k, capacity.get(k, 0.0)) / x for k, x in load.items()) if load else 0.0

    ring_hops = [(u, v) for r in rings for u, v in zip(r, r[1:] + (r[:1] if closed else []))]
    chain_hops = [(u, v) for r in rings for u, v in zip(r, r[1:])]
    return carried(ring_hops), carried(chain_hops) if closed else 0.0


_NODE_GRAPHS: dict = {}  # node type -> what NCCL's search finds inside it (see `_node_graphs`)
NODE_GRAPHS_KEPT = 64


def _node_signature(topo: Topology, inside: Topology) -> tuple[tuple, tuple]:
    """What makes two nodes of clusters the same to NCCL's search: their parts and links; and to its view of the
    network, their NIC ports too."""
    ports = tuple(sorted((nic, sum(l.bandwidth_bytes_per_s for l in topo.links_of(nic)
                                   if l.kind in ("infiniband", "ethernet"))) for nic in inside.nodes_of("nic")))
    key = "meshscale.simulate.nccl.signature"   # kept on the node's view: asked for every group priced on it
    if key not in inside.route_cache:
        inside.route_cache[key] = (tuple((n.name, n.kind, repr(sorted(n.attrs.items()))) for n in inside.nodes.values()),
                                   tuple(repr(vars(l)) for l in inside.links))
    return inside.route_cache[key], ports


def _kept(key: tuple, make):
    """``make()``, kept under ``key`` in `_NODE_GRAPHS` (the oldest of `NODE_GRAPHS_KEPT` goes first)."""
    if key not in _NODE_GRAPHS:
        if len(_NODE_GRAPHS) >= NODE_GRAPHS_KEPT:
            _NODE_GRAPHS.pop(next(iter(_NODE_GRAPHS)))
        _NODE_GRAPHS[key] = make()
    return _NODE_GRAPHS[key]


def _node_graphs(topo: Topology, local: list[str], c: dict, sm: int, env: NcclEnv,
                 several_nodes: bool) -> tuple[Graph, Graph | None, list[NicPath]]:
    """The ring and tree graphs NCCL's search lays over the GPUs ``local`` of one node, and its NICs' paths
    (several nodes): searched once per node type and reused by every cluster of that node (NCCL searches
    inside a node; a cluster of thousands of the same node needs the search once), whatever its network,
    its NICs' share of it or its size (the graphs do not depend on them)."""
    inside = node_view(topo, node_of(topo, local[0]))
    parts, ports = _node_signature(topo, inside)
    key = (parts, tuple(local), c["family"], sm, env.search_key)

    def graphs() -> tuple[Graph, Graph | None]:
        ring = ring_graph(inside, local, c, sm, env)
        return ring, tree_graph(inside, local, c, sm, ring, env) if len(local) > 1 else None
    ring, tree = _kept(("graphs", *key), graphs)
    nics = _kept(("nics", ports, *key), lambda: network_paths(topo, local, c, env)) if several_nodes else []
    return ring, tree, nics


def analyse(topo: Topology, ranks: list[int], version: str | None = None, env: NcclEnv = DEFAULT_ENV) -> System:
    """What NCCL derives from ``topo`` for ``ranks`` (device indices) in the environment ``env``; memoized on
    the topology."""
    c = constants(version)
    memo = ("meshscale.simulate.nccl", tuple(ranks), c["family"], env.system_key)
    if memo in topo.route_cache:
        return topo.route_cache[memo]
    by_node, models = ranks_by_node(topo, ranks)
    if len(set(ranks)) != len(ranks):
        raise MeshscaleError(f"device list {list(ranks)} repeats a device; give each GPU once")
    if topo.device_kind != "gpu":
        raise MeshscaleError(f"{topo.name} has no GPUs; NCCL's model applies to GPUs only")
    sms = {gpu_sm(model) for model in models}
    sm = min(sms)
    nodes = nccl_nodes(topo, by_node, c, sm, env)
    local = next(iter(nodes.values()))
    if len(local) > MAX_NODE_GPUS:
        raise MeshscaleError(f"{topo.name}: {len(local)} GPUs in one node; NCCL's model searches rings over at most "
                             f"{MAX_NODE_GPUS} GPUs of a node (an NVL72 domain): describe larger machines as a "
                             "cluster of nodes (--nodes, a cluster file)")
    graph, tree, node_nics = _node_graphs(topo, local, c, sm, env, len(nodes) > 1)
    first_cpu = next(iter(topo.nodes_of("cpu")), None)
    cpu = cpu_class(topo.nodes[first_cpu].attrs.get("model", "")) if first_cpu else data_file()["cpu_class_default"]
    nvs = {v for a in local for l in topo.links_of(a, "nvlink") for v in (l.other(a),) if topo.nodes[v].kind == "nvswitch"}
    multicast = [topo.nodes[v].attrs.get("multicast") for v in nvs]
    nvls = bool(nvs) and len(local) >= c.get("nvls_min_gpus", 3) and sm >= 90 and all(m is not False for m in multicast) and graph.path_type == "NVL"
    net = _Network()
    if len(nodes) > 1:
        net = _network(topo, nodes, local, graph, node_nics, c, env)
        graph = net.graph or graph
    mesh = any(l.kind == "nvlink" for a in local for b in local if a != b for l in topo.links_between(a, b))
    system = System(sm, len(ranks), len(nodes), graph, nvls, cpu, net.inter_gbps, tree=tree,
                    net_extra_us=net.extra_us, nics=net.nics, gpu_mesh=mesh, env=env, mixed_sm=len(sms) > 1,
                    socket=net.socket, inter_run_gbps=net.run_gbps)
    topo.route_cache[memo] = system
    return system


def nccl_nodes(topo: Topology, by_node: Mapping, c: dict, sm: int, env: NcclEnv) -> Mapping:
    """NCCL's nodes of the GPUs ``by_node`` (`network.ranks_by_node`: each node's GPUs): those nodes, and where
    P2P is denied and SHM disabled, each group of a node's GPUs that P2P still joins (paths.cc marks the other
    pairs PATH_NET and ncclTopoTrimSystem cuts them into systems of their own; init.cc counts a node per ring's
    first rank): with NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1, every GPU a node across the network, even on one
    host. Keys: the node, or (node, group)."""
    if env.shm or env.p2p_level is None:
        return by_node
    out: dict = {}
    for k, group in by_node.items():
        inside, parts = node_view(topo, k), []
        for g in group:  # a GPU joins the first group one of whose GPUs it reaches by P2P (both ways)
            home = next((part for part in parts if any(_p2p_joined(inside, g, x, c, sm, env) for x in part)), None)
            if home is None:
                parts.append([g])
            else:
                home.append(g)
        for i, part in enumerate(parts):
            out[k if len(parts) == 1 else (k, i)] = part
    return out


def _p2p_joined(topo: Topology, a: str, b: str, c: dict, sm: int, env: NcclEnv) -> bool:
    paths = [_p2p_pair_path(topo, x, y, c, sm, {}) for x, y in ((a, b), (b, a))]
    return all(p is not None and env.p2p_allowed(p.path_type) for p in paths)


@dataclass
class _Network:
    """What NCCL's nodes see of the network between them (several nodes only): the 1-GPU node's graph, the
    node's rate (NCCL's), its latency beyond the reference fabric's, its NICs, the socket transport's run and
    what a run moves where NCCL's rate is a NIC speed the data does not cross (one host's loopback)."""

    graph: Graph | None = None
    inter_gbps: float = 0.0
    extra_us: float = 0.0
    nics: list[NicPath] = field(default_factory=list)
    socket: SocketRun | None = None
    run_gbps: float = 0.0


def _network(topo: Topology, nodes: Mapping, local: list[str], graph: Graph, node_nics: list[NicPath], c: dict,
             env: NcclEnv) -> _Network:
    nics, node_gbps = node_nics, sum(n.gbps for n in node_nics)
    if len(nodes) > len({k if isinstance(k, int) else k[0] for k in nodes}):   # a node's GPUs NCCL's nodes apart
        nics = _nearest_nics(topo, local, nics, env)  # one host's GPUs apart: each uses its nearest NIC
        node_gbps = min(sum(n.gbps for n in nics), _gpus_link_gbps(topo, local, nics, c))
    inter = fabric_gbps(topo, [k for k in nodes if isinstance(k, int)] or [0], node_gbps or c["net_bw_default"])
    extra_us = max(0.0, network_latency_s(topo, nics) - REFERENCE_NET_LATENCY_S) * 1e6
    one_gpu = None
    if len(local) == 1:  # one GPU per node: NCCL's channels run GPU -> NIC, one per NIC at its rate
        one_gpu = Graph(max(1, len(nics)), inter / max(1, len(nics)), "NET", orders=[list(local)])
    socket = None
    if any(n.socket for n in nics):
        hosts = {(node_of(topo, g), topo.nodes[g].attrs.get("host")) for part in nodes.values() for g in part}
        socket = _socket_run(topo, nodes, local, one_gpu or graph, nics, c, env, loopback=len(hosts) == 1)
    return _Network(one_gpu, inter, extra_us, nics, socket, socket.link_gbps if socket and socket.loopback else 0.0)


def _nearest_nics(topo: Topology, local: list[str], nics: list[NicPath], env: NcclEnv) -> list[NicPath]:
    """A group's NICs when one host's GPUs are NCCL's nodes: the nearest to its GPUs (by path type); where the
    host describes none, sockets over an interface NCCL cannot read the speed of (10 Gb/s)."""
    if nics:
        rank = {n.nic: PATH_TYPES.index(n.path_type) if n.path_type in PATH_TYPES else len(PATH_TYPES) for n in nics}
        return [n for n in nics if rank[n.nic] == min(rank.values())]
    if not env.uses_socket(False):
        raise MeshscaleError(f"{topo.name}: with P2P and SHM disabled NCCL sends through the network, and NCCL_NET=IB "
                             "needs a NIC this node does not describe; describe the NICs or drop NCCL_NET=IB")
    return [NicPath("lo", local[0], "SYS", False, UNKNOWN_SPEED_GBPS, UNKNOWN_SPEED_GBPS, socket=True)]


def _gpus_link_gbps(topo: Topology, local: list[str], nics: list[NicPath], c: dict) -> float:
    """GB/s the GPUs ``local`` reach their NICs through at most: each GPU's own first link, which all its NICs'
    paths share (NCCL's search spends it once)."""
    inside, total = node_view(topo, node_of(topo, local[0])), 0.0
    for g in local:
        mine = [n.nic for n in nics if n.gpu == g and n.nic in inside.nodes]
        if not mine:
            return math.inf
        first = route(inside, g, mine[0]).paths[0].directed_links[:1]
        total += min(links_gbps(inside, first, c).values(), default=math.inf)
    return total


def _socket_run(topo: Topology, nodes: dict, local: list[str], graph: Graph, nics: list[NicPath], c: dict,
                env: NcclEnv, loopback: bool) -> SocketRun:
    """The socket transport of the node ``local``: NCCL's threads and sockets for its NIC, the host's TCP path
    (its CPU model's), the node's network channels (the graph's, doubled, one pair per NIC at most twice: each a
    send and a receive connection), its share of the host's cores and, on one host, of the loopback and of its
    GPUs' PCIe staging."""
    host_gpus = [g for part in nodes.values() for g in part
                 if node_of(topo, g) == node_of(topo, local[0]) and same_host(topo, g, local[0])]
    inside = node_view(topo, node_of(topo, local[0]))
    cpus = [x for x in inside.nodes_of("cpu") if same_host(inside, x, local[0])]
    share = len(local) / max(1, len(host_gpus))  # the host's cores and loopback are shared by its ranks
    cores = sum(float(inside.nodes[x].attrs.get("cores") or 0) for x in cpus) * share
    tcp = tcp_host(str(inside.nodes[cpus[0]].attrs.get("model", "")) if cpus else "")
    connections = env.channels(min(2 * graph.channels, 2 * max(1, len(nics)), c["max_channels"]))
    link = 0.0
    if loopback:
        memory = sum(host_memory_gbps(inside, x) for x in cpus)
        link = min(tcp.loopback_of(memory) * share, sum(_staging_gbps(inside, g, c) for g in local))
    setup = socket_setup(env, next((n.vendor for n in nics if n.socket and n.vendor), None))
    return SocketRun(setup, tcp, connections, len(local), cores, link, loopback)


def _staging_gbps(topo: Topology, gpu: str, c: dict) -> float:
    """GB/s a GPU's SMs move to (or from) pinned host memory over its PCIe path to its CPU, at the links' payload
    rate, each link shared by the host's GPUs that stage through it."""
    host = local_cpu(topo, gpu)
    if host is None:
        return math.inf
    directed = route(topo, gpu, host).paths[0].directed_links
    stagers = staging_gpus(topo, host)
    return min((host_run_gbps(topo.links[i], rate) / max(1, stagers.get(i, 1))
                for (i, _d), rate in links_gbps(topo, directed, c).items()), default=math.inf)
