"""Point-to-point collectives (send/recv, all_to_all, gather, scatter) as grouped ncclSend / ncclRecv: the
channels one send runs on (paths.cc, enqueue.cc), each pair's path, each GPU's links and NIC, and the chunk
pipeline's drain."""
from __future__ import annotations

import math

from meshscale.simulate.nccl.network import node_of, node_view
from meshscale.simulate.nccl.runtime import comm_channels, p2p_channel_gbps, p2p_local_copy_gbps
from meshscale.simulate.nccl.search import System, pair_path
from meshscale.topology import Topology


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
                direct = s.ring.path_type == "NVL" and node_of(topo, a) == node_of(topo, b)
                per_peer = min(per_peer, 2 * max(1, int(pair_gbps(topo, s, c, a, b) / nv + 1e-9)) if direct else 2)
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


def p2p_us(topo: Topology, s: System, c: dict, collective: str, ranks: list[int], nbytes: int, root: int,
            scale: float) -> tuple[float, int]:
    """Grouped sends and receives: one Ring/Simple step of latency; bytes over each GPU's links (their
    capacity, ``Graph.link_gbps``), over each pair's path and over the channels each send runs on (fewer for
    smaller sends), and inside a node the fill of each channel's chunk pipeline (``p2p_drain_us``). Returns the
    time (us) and the channels one send runs on."""
    n = len(ranks)
    lat = c["base_latency_us"]["ring"]["Simple"] + c["hw_latency_us"][s.hw]["ring"]["Simple"]
    names = [topo.device(r) for r in ranks]
    per_gpu = s.ring.link_gbps * scale if s.n_nodes == 1 else \
        (s.inter_run_gbps or min(s.ring.total_gbps, s.inter_gbps)) * scale
    block = nbytes if collective == "send_recv" else nbytes / n  # bytes of one send
    op_channels, p2p_channels = p2p_op_channels(topo, s, c, names, block)
    channel_gbps = p2p_channel_gbps(s, c) * scale
    if s.socket is not None and s.n_nodes > 1:  # what the socket transport's threads copy, a GPU's share
        remote = 1 if collective == "send_recv" else max(1, n - int(s.ppn))  # a GPU's peers on other nodes
        message = min(block / op_channels, c["p2p_chunk_bytes"]["net"])
        per_gpu = min(per_gpu, s.socket.node_gbps(message, int(s.ppn) * remote * op_channels, 1) / s.ppn * scale)
    if s.n_nodes == 1:  # across nodes the network sets the pace
        peers = 1 if collective == "send_recv" else n - 1  # the busiest GPU's sends (or receives)
        per_gpu = min(per_gpu, min(p2p_channels, peers * op_channels) * channel_gbps)
        # a round's send and receive are one work on the same channels (enqueue.cc addP2pToPlan); only
        # when the parts of all sends outnumber the p2p channels do two works share a block
        works = math.ceil(peers * op_channels / p2p_channels)
        lat += p2p_drain_us(s, c, block / op_channels, works, scale)

    def pair(a: str, b: str) -> float:
        path = pair_gbps(topo, s, c, a, b) * scale
        if node_of(topo, a) != node_of(topo, b):  # one GPU's flow leaves through its own NIC
            return min(path, gpu_net_gbps(s) * scale, per_gpu if s.socket is not None else path)
        return min(per_gpu, path, op_channels * channel_gbps if s.n_nodes == 1 else path)

    if collective == "send_recv":
        return lat + nbytes / (1000 * min(pair(a, b) for a, b in zip(names, names[1:] + names[:1]))), op_channels
    if collective == "all_to_all":
        worst = max(block / pair(a, b) for a in names for b in names if a != b)
        return lat + max(block * (n - 1) / per_gpu, off_node_s(s, block * (n - s.ppn), scale), worst) / 1000, op_channels
    hub = names[root]
    worst = max(block / (pair(hub, b) if collective == "scatter" else pair(b, hub)) for b in names if b != hub)
    return lat + max(block * (n - 1) / per_gpu, worst) / 1000, op_channels


def gpu_net_gbps(s: System) -> float:
    """GB/s one GPU's traffic to other nodes gets when it alone sends: the NIC NCCL gives it (its nearest;
    NICs shared by the GPUs of a node: DGX-1's 4 NICs serve 2 GPUs each), not the whole node's network."""
    return s.inter_gbps / max(1, min(len(s.nics) or 1, int(s.ppn)))


def off_node_s(s: System, off_bytes_per_gpu: float, scale: float) -> float:
    """Seconds x 1e9 (the units of bytes / GB/s) the bytes every GPU sends to other nodes take when all GPUs of a
    node send at once: the node's network shared by its GPUs (all_to_all across nodes)."""
    if s.n_nodes < 2 or off_bytes_per_gpu <= 0:
        return 0.0
    return off_bytes_per_gpu * s.ppn / (s.inter_gbps * scale)


def pair_gbps(topo: Topology, s: System, c: dict, a: str, b: str) -> float:
    key = (a, b)
    if key not in s.pair_gbps:
        if node_of(topo, a) != node_of(topo, b):
            s.pair_gbps[key] = s.inter_gbps
        else:
            capacity: dict = {}
            run: dict = {}  # host-memory paths (SHM): the rates a run moves at, where NCCL's rating differs
            p = pair_path(node_view(topo, node_of(topo, a)), a, b, c, s.sm, capacity, s.env, run)
            s.pair_gbps[key] = min(run.get(k, capacity[k]) / f for k, f in p.uses + p.host_uses) if p else 0.1
    return s.pair_gbps[key]
