"""What a run takes beyond NCCL's own estimate (`tuning`): meshscale's corrections, each from NCCL's device
code or its enqueue logic: the channels a call runs on (enqueue.cc), a ring's loop of link steps and one local
copy (runRing), a one-node tree as a chain and its pipeline fill (runTreeSplit), the NVLS all-reduce's traffic and
pipeline, per-block ceilings of clamped communicators, the CUDA launch and the host thread's issue rate."""
from __future__ import annotations

import math

from meshscale.simulate.nccl.net_socket import BUFFER_BYTES, NCCL_STEPS, SLICE_STEPS, WIRE_DATA_SHARE
from meshscale.simulate.nccl.search import System
from meshscale.simulate.nccl.tables import RING_ONLY, constants, data_file, version_key
from meshscale.simulate.nccl.tuning import (NVLS_ALGOS, alg_from_bus, arch_row, bus_bandwidth, enabled, index2,
                                             latency_us, nvls_channel_gbps, ring_steps, tree_size_factor,
                                             tuning_table)


def host_launch_s(version: str | None = None) -> float:
    """Seconds a host thread spends issuing one GPU's collective with NCCL ``version`` (default 2.28): the
    figure of the newest family measured that is not newer (the oldest one for older versions)."""
    per_family = data_file()["host_launch_us_per_gpu"]
    want = version_key(constants(version)["family"])
    known = sorted(per_family, key=version_key)
    fitting = [f for f in known if version_key(f) <= want] or known[:1]
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
    return float(data_file()["launch_overhead_us"]) if proto in data_file()["launch_overhead_protocols"] else 0.0


def natural_channels(s: System, c: dict, algo: str) -> int:
    """Channels the search's graph gives the communicator: the graph's, doubled at setup (connect.cc), NVLS
    its own count; the links' bandwidth NCCL's tuning counts is spread over these."""
    if algo in NVLS_ALGOS:
        return c["nvls_channels"]
    return min(2 * s.ring.channels, c["max_channels"])


def comm_channels(s: System, c: dict, algo: str) -> int:
    """Channels the communicator runs: `natural_channels` clamped by NCCL_MAX_NCHANNELS / NCCL_MIN_NCHANNELS
    (NVLS: its own count, NCCL_NVLS_NCHANNELS, at most NCCL_MAX_NCHANNELS)."""
    natural = natural_channels(s, c, algo)
    if algo in NVLS_ALGOS:
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
        rate = min(send * c["tree_ll128_factor_one_node"], nch * arch_row(c["per_channel_max_tree_ll128_bw"], s)[0])
    else:
        rate = min(arch_row(c["ll_max_bw"], s)[0], send * c["ll_data_per_line"])
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
    sends = ring_steps(collective, n)
    # NCCL's bus bandwidth, back from algorithm to bus, at the links' capacity rather than the search's speed
    capacity = s.ring.chain_gbps if collective in RING_ONLY else s.ring.link_gbps
    link = bus_bandwidth(s, c, collective, "ring", proto, share) * sends / n * capacity / s.ring.total_gbps
    if proto == "LL128":
        per_block = arch_row(c["per_channel_max_ring_ll128_bw"], s)[index2(s)] / 2
    else:
        per_block = block_link_gbps(s, c)
    link = min(link, blocks * per_block)
    if collective in RING_ONLY:
        return link
    if s.ring.transport == "shm":
        # the receive leg is a read of host memory over the receiver's own links, which the ring's load on them
        # already counts: no step inside the GPU, and the steps keep both directions of the links busy
        return link * n / sends
    return n / (sends / link + 1 / (blocks * p2p_local_copy_gbps(s, c)))


def block_link_gbps(s: System, c: dict) -> float:
    """GB/s one channel's block moves over the links with the Simple protocol when it, not the links, sets the
    pace: the fastest speed NCCL's search lets one ring channel carry on this GPU generation (the top of its
    intra-node speed ladder, search.cc: 60 GB/s on sm90, 40 before, 90 on sm100) over the two blocks the
    communicator runs per graph channel (connect.cc doubles them): 30 GB/s on Hopper. A GPU's SMs, not its links:
    the same for NVLink, PCIe and host memory (SHM). With every channel running, the links' share per block is
    lower (370.8 GB/s over 24 blocks on an H100 / H200); a communicator clamped to fewer blocks
    (NCCL_MAX_NCHANNELS) runs each at this rate, at least NCCL's per-channel Simple ceiling
    (`p2p_channel_gbps`)."""
    ladders = c["speed_ladder_intra"]
    ladder = ladders.get("sm100" if s.sm >= 100 else "sm90" if s.sm >= 90 else "default", ladders["default"])
    return max(ladder[0] / 2, p2p_channel_gbps(s, c))


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


def predicted_us(s: System, c: dict, collective: str, algo: str, proto: str, nbytes: int, scale: float) -> tuple[float, int]:
    """What a run of ``algo``/``proto`` takes (us) and the channels it runs on: the launch, NCCL's latency from its
    table, and the bytes the run moves (fills and rounded chunks included) at the rate this module's corrections
    give; ``scale`` scales every bandwidth (a calibration)."""
    nc = channels_used(s, c, algo, proto, nbytes)
    # the share of the links the channels run carry: channels NCCL sheds for a small call leave theirs idle;
    # a communicator clamped to fewer channels (NCCL_MAX_NCHANNELS) leaves the links free and each block runs
    # at its own ceiling (a one-node ring: `ring_loop_gbps`; else `block_ceiling_gbps`), NVLS's channels excepted
    # (its bandwidth is per NVLS channel)
    nvls_algo = algo in NVLS_ALGOS
    share = min(1.0, nc / (natural_channels if nvls_algo else comm_channels)(s, c, algo))
    moved = nbytes
    chain = algo == "tree" and s.n_nodes == 1 and collective == "all_reduce" and not s.gpu_mesh
    if chain:
        bw = chain_gbps(s, c, proto, share) * scale
        moved += tree_fill_bytes(s, c, proto, nbytes, nc)
    elif nvls_algo and collective == "all_reduce" and s.n_nodes == 1:
        bw = nvls_traffic_gbps(s, c, algo, share) * scale
    else:
        bw = bus_bandwidth(s, c, collective, algo, proto, share, run=True) * scale
    if algo == "ring" and proto != "Simple" and c["ring_chunk_rounding"]:
        moved = ring_chunked_bytes(s, c, collective, proto, nbytes, nc)
    if algo == "ring" and proto != "LL" and s.n_nodes == 1:  # across nodes the network sets the pace
        bw = ring_loop_gbps(s, c, collective, proto, nc, share) * scale
    if algo == "tree" and not chain:  # NCCL's own size correction stands for the pipeline of trees not modelled
        bw *= tree_size_factor(c, collective, proto, nbytes)
    if s.socket is not None and s.n_nodes > 1:  # the socket transport: what its threads copy through the kernel
        bw = min(bw, socket_alg_gbps(s, collective, algo, proto, nbytes, nc) * scale)
    ring_loop = algo == "ring" and proto != "LL" and s.n_nodes == 1  # its blocks' ceiling is in ring_loop_gbps
    if not nvls_algo and not ring_loop and comm_channels(s, c, algo) < natural_channels(s, c, algo):
        bw = min(bw, block_ceiling_gbps(s, c, collective, algo, nc) * scale)
    if algo == "nvls" and collective == "all_reduce" and s.n_nodes == 1:
        # three warp groups pipeline the loops (scatter, reduce + multicast, gather): the first loop's bytes
        # pass the stages one after another before the pipeline runs full
        moved += (c["nvls_pipeline_stages"] - 1) * min(nbytes, nvls_loop_bytes(s, c, nbytes, nc))
    nccl_latency_us = tuning_table(s, c).entries[(collective, algo, proto)].latency_us + socket_latency_us(s, collective, algo)
    return launch_overhead_us(proto) + nccl_latency_us + moved / (1000 * bw), nc


def socket_alg_gbps(s: System, collective: str, algo: str, proto: str, nbytes: int, channels: int) -> float:
    """Algorithm bandwidth (GB/s) the socket transport's copies allow a call of ``nbytes`` on ``channels``: the
    node's copy rate each way (`net_socket.SocketRun.node_gbps`) for the messages NCCL's proxy posts (a slice of
    a step buffer, net.cc; a small call's share per channel and rank where less), at the protocol's data share
    of the bytes on the wire, from bus to algorithm bandwidth as NCCL converts it."""
    steps = SLICE_STEPS.get(collective, 1)
    step_bytes = BUFFER_BYTES[proto] / NCCL_STEPS * steps
    per_channel = nbytes / max(1, channels) / (1 if collective in RING_ONLY else s.n_ranks)
    node = s.socket.node_gbps(min(step_bytes, per_channel), min(channels, s.socket.connections), steps)
    return alg_from_bus(s, collective, algo, node * WIRE_DATA_SHARE[proto])


def network_steps(nodes: int, collective: str, algo: str) -> int:
    """Messages one call sends node to node one after another (tuning.cc's inter-node steps): a ring's nodes-1
    (all-reduce twice), a tree's 2 log2(nodes), PAT's and NVLS's log2(nodes)."""
    log_nodes = max(1, int(math.log2(max(2, nodes))))
    if algo == "ring":
        return 2 * (nodes - 1) if collective == "all_reduce" else nodes - 1
    return 2 * log_nodes if algo in ("tree", "nvls_tree") else log_nodes


def socket_latency_us(s: System, collective: str, algo: str) -> float:
    """What the kernel's TCP path adds to each message node to node (the host's measured one-way latency;
    none where unmeasured, NCCL's NET latency standing), over the call's network steps."""
    if s.socket is None or s.n_nodes < 2 or not s.socket.host.latency_s:
        return 0.0
    return network_steps(s.n_nodes, collective, algo) * s.socket.host.latency_s * 1e6


def ring_chunked_bytes(s: System, c: dict, collective: str, proto: str, nbytes: int, channels: int) -> float:
    """Bytes a ring of ``channels`` moves for ``nbytes`` with LL or LL128, by the chunks NCCL's device code cut
    before 2.20 (runRing; see ``ring_chunk_rounding`` in the data file): each loop gives every slot (channels x
    ranks; broadcast and reduce: channels) a chunk rounded up to a multiple of the protocol's minimum chunk, laid
    out chunk-major across the channels, and every channel that holds data runs all its ring's steps on whole
    chunks. A call that fills
    fewer slots than the rounding leaves (4 MiB on 8 GPUs x 24 channels with LL128: 110 of 192 chunks of
    38.4 KB) takes the time of all of them."""
    slots = channels * (1 if collective in RING_ONLY else s.n_ranks)
    min_chunk = c["max_threads"][proto] * c["ring_grain_bytes"][proto] / c["ring_min_chunk_divisor"][proto]
    step = c["ring_step_data_bytes"][proto]
    loops, rest = divmod(nbytes, slots * step)
    last = min(step, math.ceil(rest / (slots * min_chunk)) * min_chunk) if rest else 0
    return max(float(nbytes), (loops * step + last) * slots)


def nvls_traffic_gbps(s: System, c: dict, algo: str, share: float = 1.0) -> float:
    """Algorithm bandwidth (GB/s) of an NVLS all-reduce by the traffic it moves over each GPU's links, in place of
    NCCL's credit (`tuning.bus_bandwidth`, which the choice keeps): multimem reduce reads each GPU's buffer once
    and returns its share; the multicast store sends the share once and brings back the others: size x (n+1)/n
    per GPU link and direction."""
    nch_nvls = c["nvls_channels"] * share
    return nch_nvls * nvls_channel_gbps(s, c, algo) * c["nvls_efficiency"][s.arch] * s.ppn / (s.ppn + 1)


def block_ceiling_gbps(s: System, c: dict, collective: str, algo: str, blocks: int) -> float:
    """Algorithm bandwidth (GB/s) ``blocks`` channels reach when their blocks, not the links, set the pace: each
    block at NCCL's per-channel ceiling of the Simple protocol over the two blocks of a graph channel
    (`p2p_channel_gbps`), from bus to algorithm bandwidth as `bus_bandwidth` converts it."""
    bus = blocks * p2p_channel_gbps(s, c)
    if algo != "ring" and collective in ("all_gather", "reduce_scatter"):
        return bus
    return bus * (s.n_ranks / ring_steps(collective, s.n_ranks) if algo == "ring" else 0.5)


def call_floor_us(s: System, c: dict, collective: str, chosen: tuple[str, str] | None = None) -> float:
    """The least time (us) one call of ``collective`` takes in a back-to-back loop: the CUDA launch and NCCL's
    per-call overhead (see the data file) on top of NCCL's cheapest latency for it (LL on the algorithm of fewest
    steps: the ring in one node, the tree's log-depth across many; PAT's log-depth with one GPU per node, which has
    only Simple), or the ``chosen`` (algorithm, protocol)'s own where that is NVLink SHARP and lower: a ring of 72
    GPUs in one NVLink domain pays 142 LL steps, NVLS one multicast whatever the GPUs. A separate term: NCCL's
    choice does not see it."""
    lowest = min(latency_us(s, c, collective, a, p) for a, p in (("ring", "LL"), ("tree", "LL"), ("pat", "Simple"))
                 if a == "ring" or enabled(s, c, collective, a, p, True))
    if chosen is not None and chosen[0] in ("nvls", "nvls_tree"):
        lowest = min(lowest, latency_us(s, c, collective, *chosen))
    return float(data_file()["launch_overhead_us"]) + lowest


def p2p_channel_gbps(s: System, c: dict) -> float:
    """GB/s one channel (one thread block) of point-to-point copies moves with the Simple protocol: NCCL's
    per-channel ceiling of a Simple pattern (perChMaxTreeBw) over the two blocks a graph channel becomes once
    the communicator doubles its channels (connect.cc)."""
    return arch_row(c["per_channel_max_tree_bw"], s)[index2(s)] / 2


def p2p_local_copy_gbps(s: System, c: dict) -> float:
    """GB/s one channel's block copies a chunk between a p2p receive buffer and a user buffer of the same GPU:
    NCCL's per-channel ceiling of the Simple protocol (perChMaxTreeBw) whole. The half of it that
    ``p2p_channel_gbps`` gives a block is for copies that cross a link (NVLink, PCI), where the link's round
    trips and not the block set the pace; a copy inside the GPU's own memory does not pay them."""
    return arch_row(c["per_channel_max_tree_bw"], s)[index2(s)]
