"""NCCL's own tuning model (src/graph/tuning.cc, NCCL 2.x): per collective, algorithm and protocol a latency and
a bandwidth, ``time = latency + nBytes / bandwidth`` with its size corrections, and the choice of the fastest.
Only NCCL's formula lives here, with the constants of ``nccl_tuning.yaml``; what meshscale adds to NCCL's
estimate to predict a run is in `runtime`."""
from __future__ import annotations

import math
from dataclasses import dataclass

from meshscale.simulate.nccl.search import System
from meshscale.simulate.nccl.tables import ALGORITHMS, PROTOCOLS, RING_ONLY, TUNED_COLLECTIVES

NVLS_ALGOS = ("nvls", "nvls_tree")  # NVLink SHARP: off with NCCL_NVLS_ENABLE=0


def arch_row(table: dict, s: System) -> list[float]:
    return table.get(s.arch, table.get("ampere"))


def index2(s: System) -> int:
    return s.n_nodes - 1 if s.n_nodes <= 2 else 2


def enabled(s: System, c: dict, collective: str, algo: str, proto: str, nvls: bool) -> bool:
    """Whether NCCL would consider ``algo``/``proto`` for ``collective`` on ``s`` (hardware and version)."""
    if algo not in c["algorithms"] or proto not in c["protocols"]:
        return False
    if collective in RING_ONLY and algo != "ring":
        return False
    if collective in ("all_gather", "reduce_scatter") and algo not in ("ring", "nvls", "pat", "collnet_direct"):
        return False
    if collective == "all_reduce" and algo == "pat":
        return False
    if algo in NVLS_ALGOS and (proto != "Simple" or not (s.nvls and nvls)):
        return False
    if algo == "nvls_tree" and s.n_nodes == 1:
        return False
    if algo == "nvls" and s.n_nodes > 1 and c.get("nvls_multinode_needs_collnet"):
        return False
    if algo.startswith("collnet"):  # needs a network that reduces (SHARP); no catalog system has one
        return False
    if algo == "pat" and (s.ppn != 1 or s.n_nodes < 2 or proto != "Simple"):  # ncclPatEnable; Simple only
        return False
    if algo == "tree" and s.n_ranks < 2:
        return False
    if proto == "LL128":
        sms = c.get("ll128_sms")
        ok = (s.sm in sms) if sms else s.sm >= c["ll128_min_sm"]
        if not ok or s.ring.path_type != "NVL" or s.mixed_sm:
            return False
        # tuning.cc: LL128 only where the graph reaches its NICs within typeInter <= PXN (PXB before sm90); NICs
        # without GPUDirect RDMA (the socket transport never has it) are reached through the CPU (PHB, SYS)
        if s.n_nodes > 1 and s.nics and not any(n.gdr for n in s.nics):
            return False
    return True


def ring_steps(collective: str, n: int) -> int:
    return 2 * (n - 1) if collective == "all_reduce" else n - 1 if collective in ("all_gather", "reduce_scatter") else n


def bus_bandwidth(s: System, c: dict, collective: str, algo: str, proto: str, share: float = 1.0,
                  run: bool = False) -> float:
    """NCCL's algorithm bandwidth (GB/s) for ``algo``/``proto``: per-channel graph bandwidth x channels with its
    protocol factors and caps, converted from bus to algorithm bandwidth. ``share`` (default 1) evaluates it
    on that fraction of the channels. ``run``: the rate a run moves rather than NCCL's credit, where the two part
    (a ring's LL: its lines' data share at most llMaxBw, whatever share a version's estimate credits)."""
    g = s.tree if algo == "tree" and s.tree is not None else s.ring  # tuning.cc reads graphs[algo]
    nch = g.channels * share
    i2 = index2(s)
    bw = g.bw_gbps
    if s.n_nodes > 1:  # the network carries every channel once per node
        if run and s.inter_run_gbps:  # a run over one host's loopback: not the NIC speed NCCL reads
            bw = s.inter_run_gbps / g.channels if g.path_type == "NET" else min(bw, s.inter_run_gbps / g.channels)
        else:
            bw = min(bw, s.inter_gbps / g.channels)
    if algo in NVLS_ALGOS:
        return nvls_bus_bandwidth(s, c, collective, algo, share)
    bus = nch * bw
    if c.get("sm80_bus_bw_cap") and s.sm == 80:
        bus = min(bus, c["sm80_bus_bw_cap"])
    if algo == "ring" and proto == "LL":
        bus *= c["ll_data_per_line"] if run else ring_ll_factor(s, c, collective)
        if run or c["ring_ll_capped"]:
            row = c["ll_max_bw"][s.arch] if s.n_nodes == 1 else c["ll_max_bw"]["net_amd" if s.cpu == "amd" else "net_intel"]
            bus = min(row[i2], bus)
    if algo == "ring" and proto == "LL128":
        bus = min(bus * c["ring_ll128_factor"], nch * arch_row(c["per_channel_max_ring_ll128_bw"], s)[i2])
    if algo == "tree":
        if collective == "all_reduce":
            bus = min(bus * c["tree_factor"], nch * arch_row(c["per_channel_max_tree_bw"], s)[i2])
        if proto == "LL":
            bus = min(bus / c["tree_ll_divisor"], arch_row(c["ll_max_bw"], s)[i2])
        if proto == "LL128":
            f = c["tree_ll128_factor_one_node"] if s.n_nodes == 1 else c["tree_ll128_factor_multi_node"]
            bus = min(bus * f, nch * arch_row(c["per_channel_max_tree_ll128_bw"], s)[i2])
    if algo == "pat":
        bus *= c["pat_factor"]
    return alg_from_bus(s, collective, algo, bus)


def alg_from_bus(s: System, collective: str, algo: str, bus: float) -> float:
    """NCCL's algorithm bandwidth of a bus bandwidth (tuning.cc): a ring's n / steps, a tree's half, the others'
    all-gather and reduce-scatter as they are."""
    if algo != "ring" and collective in ("all_gather", "reduce_scatter"):
        return bus
    return bus * (s.n_ranks / ring_steps(collective, s.n_ranks) if algo == "ring" else 0.5)


def ring_ll_factor(s: System, c: dict, collective: str) -> float:
    """NCCL's share of a ring's bus bandwidth it credits LL with: one number (2.21 on: .5, the 8 B of data in a
    16 B line), or, before, 1/4 for all-reduce, reduce and any call across nodes and 1/3 for the others."""
    f = c["ring_ll_factor"]
    if isinstance(f, dict):
        return f["reducing_or_nodes"] if s.n_nodes > 1 or collective in ("all_reduce", "reduce") else f["other"]
    return float(f)


def nvls_bus_bandwidth(s: System, c: dict, collective: str, algo: str, share: float = 1.0) -> float:
    """NCCL's algorithm bandwidth (GB/s) of NVLS and NVLS-Tree (tuning.cc): per NVLS channel min(intraBw, interBw,
    and for NVLS-Tree perChMaxNVLSTreeBw), intraBw = bwIntra x efficiency x (nCh-1)/nCh, x2 for all-reduce
    (two operations pipelined) else x (ppn-1)/ppn; interBw = bwInter, x2 for NVLS-Tree on up to 2 nodes. One node:
    the ring graph's bandwidth over NCCL's NVLS channels (`nvls_channel_gbps`); several: NCCL's NVLS graph, one
    channel per head GPU and its NIC (`nvls_net_graph`). ``share``: that fraction of the channels."""
    n, eff = s.n_ranks, c["nvls_efficiency"][s.arch]
    if s.n_nodes > 1 and c["nvls_algbw_rule"] != "2.20":
        nch, bw_intra, bw_inter = nvls_net_graph(s, c)
    else:
        nch, bw_intra = c["nvls_channels"], nvls_channel_gbps(s, c, algo)
        bw_inter = bw_intra
    if c["nvls_algbw_rule"] == "2.20":
        return nch * share * bw_intra * (5 / 6)
    intra = bw_intra * eff * (nch - 1) / nch
    intra *= 2.0 if collective == "all_reduce" else (s.ppn - 1) / s.ppn
    per_channel = min(intra, bw_inter * (2 if algo == "nvls_tree" and s.n_nodes <= 2 else 1))
    if algo == "nvls_tree":
        per_channel = min(per_channel, arch_row(c["per_channel_max_nvls_tree_bw"], s)[index2(s)] or per_channel)
    bus = nch * share * per_channel
    if collective in ("all_gather", "reduce_scatter"):
        return bus
    return bus * n / ring_steps(collective, n)


def nvls_net_graph(s: System, c: dict) -> tuple[int, float, float]:
    """NCCL's NVLS graph of a node on the network (search.cc, pattern NVLS): one channel per head GPU, each with a
    NIC of its own (at most the node's GPUs, one channel per NIC); returns (channels, bwIntra, bwInter). Every
    GPU pulls each channel through its NVLinks and the head twice (ncclTopoSearchTryNvls), so a GPU's links
    carry (channels + 1) x bwIntra: bwIntra is the fastest speed of the inter-node ladder within that and the
    NIC's path; the second pass raises bwInter alone while it stays below 2 x bwIntra and within the NIC."""
    nics = sorted((p.gbps for p in s.nics), reverse=True)[:max(1, int(s.ppn))] or [c["net_bw_default"]]
    nch = len(nics)
    ladders = c["speed_ladder_inter"]
    ladder = ladders.get("sm90" if s.sm >= 90 else "default", ladders["default"])
    nic_gbps = min(nics)
    fits = [x for x in ladder if x <= nic_gbps + 1e-9 and (nch + 1) * x <= s.ring.link_gbps + 1e-9]
    bw_intra = fits[0] if fits else ladder[-1]
    raised = [x for x in ladder if bw_intra <= x < 2 * bw_intra and x <= nic_gbps + 1e-9]
    return nch, bw_intra, max(raised, default=bw_intra)


def nvls_channel_gbps(s: System, c: dict, algo: str) -> float:
    """GB/s of one NVLS channel: the ring graph's bandwidth over NCCL's NVLS channels, across nodes at most the
    network's share (tuning.cc: NVLS min(bwIntra, bwInter); NVLS tree min(bwIntra, bwInter / 2) beyond 2 nodes)."""
    per_ch = s.ring.total_gbps / c["nvls_channels"]
    if s.n_nodes > 1:
        per_ch = min(per_ch, s.inter_gbps / c["nvls_channels"] / (2 if algo == "nvls_tree" and s.n_nodes > 2 else 1))
    return per_ch


def latency_us(s: System, c: dict, collective: str, algo: str, proto: str) -> float:
    """NCCL's latency (us) of one ``algo``/``proto`` call of ``collective`` on ``s``."""
    base = c["base_latency_us"][algo][proto]
    hw = c["hw_latency_us"]
    intra = hw[s.ring.link].get(algo, {}).get(proto, 0.0)
    net = hw["net"]
    inter = (net["tree"] if s.ppn == 1 else net.get(algo, {})).get(proto, 0.0) + s.net_extra_us
    n, nodes = s.n_ranks, s.n_nodes
    nsteps = ring_steps(collective, n)
    if algo == "ring":
        step = hw[s.hw]["ring"][proto]
        if collective in RING_ONLY:
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


def tree_size_factor(c: dict, collective: str, proto: str, nbytes: int) -> float:
    """NCCL's size correction of the tree's bandwidth (tuning.cc treeCorrectionFactor, per protocol and
    log2(nBytes / 64)); 1 outside its table."""
    log_size = int(math.log2(nbytes >> 6)) if nbytes >= 64 else -1
    if 0 <= log_size < 23 and (collective == "all_reduce" or c["tree_correction_all_collectives"]):
        return c["tree_correction"][proto][log_size]
    return 1.0


@dataclass(frozen=True)
class Tuned:
    """One entry of NCCL's tuning table: the latency (us) and algorithm bandwidth (GB/s) of an algorithm and
    protocol for a collective (comm->latencies / comm->bandwidths)."""

    latency_us: float
    bandwidth_gbps: float


@dataclass(frozen=True)
class TuningTable:
    """What ncclTopoTuneModel fills once per communicator: every (collective, algorithm, protocol) the hardware
    and the version offer (NVLS included where the switches multicast: NCCL_NVLS_ENABLE is applied at the
    choice), in NCCL's order (algorithms, then protocols)."""

    family: str
    entries: dict[tuple[str, str, str], Tuned]

    def offered(self, collective: str) -> list[tuple[str, str, Tuned]]:
        return [(a, p, e) for (coll, a, p), e in self.entries.items() if coll == collective]


def fill_table(s: System, c: dict) -> TuningTable:
    """NCCL's tuning table of ``s`` for the constants ``c``: NCCL's formula for every collective it tunes."""
    entries = {}
    for collective in TUNED_COLLECTIVES:
        for algo in ALGORITHMS:
            for proto in PROTOCOLS:
                if enabled(s, c, collective, algo, proto, True):
                    bw = bus_bandwidth(s, c, collective, algo, proto)
                    if bw > 0:
                        entries[(collective, algo, proto)] = Tuned(latency_us(s, c, collective, algo, proto), bw)
    return TuningTable(c["family"], entries)


def tuning_table(s: System, c: dict) -> TuningTable:
    """The tuning table of ``s``, filled on first use and kept on the `System` (NCCL fills it once per
    communicator and reads it for every call, whatever its size)."""
    if c["family"] not in s.tables:
        s.tables[c["family"]] = fill_table(s, c)
    return s.tables[c["family"]]


def nccl_time_us(s: System, c: dict, collective: str, algo: str, proto: str, nbytes: int) -> float:
    """``ncclTopoGetAlgoTime``: latency + nBytes / bandwidth from the tuning table, with its size corrections;
    -1 when the table has no entry (disabled)."""
    entry = tuning_table(s, c).entries.get((collective, algo, proto))
    if entry is None:
        return -1.0
    return estimate_us(s, c, collective, algo, proto, entry, nbytes)


def estimate_us(s: System, c: dict, collective: str, algo: str, proto: str, entry: Tuned, nbytes: int) -> float:
    """NCCL's estimate (us) of one call of ``nbytes`` from its table ``entry``."""
    bw, lat = entry.bandwidth_gbps, entry.latency_us
    if algo == "tree":
        bw *= tree_size_factor(c, collective, proto, nbytes)
    if algo == "ring" and proto == "Simple" and s.n_nodes > 1 and collective == "all_reduce" \
            and nbytes / (s.ring.channels * s.n_ranks) >= 64:
        lat *= c["ring_plateau_factor"]["below_sm80" if s.sm < 80 else "sm80_and_up"]
    return lat + nbytes / (1000 * bw)
