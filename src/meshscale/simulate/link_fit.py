"""Fit the simulator's link efficiency and per-message latency to a machine's `bench p2p` measurements.

A `bench p2p` result (kind "bench-p2p") has rows with ``src``, ``dst`` (device indices), ``mode``,
``bandwidth_bytes_per_s`` and ``latency_s``. Each pair's route tells which link kinds it crosses:
- efficiency of a kind = median over the pairs whose route uses only that kind of measured / route bandwidth
  (capped at 1), the TLP overhead of P2P through an Intel CPU counted as load; kinds seen only on mixed routes (PCIe through QPI) get what their bottleneck link implies
  once the pure kinds are known;
- latency: measured = message latency of the route's slowest link kind + scale x the route's hop latency,
  fitted by least squares (scale >= 0).
Rows may name devices by index or by node name ("gpu0", as `bench p2p` writes them). Unidirectional rows are
used when present; bidirectional ones count half their bandwidth per direction; "staged" rows (through host
memory) are ignored. Kinds the file does not cover keep their defaults.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace
from statistics import median

import numpy as np

from meshscale.errors import MeshscaleError
from meshscale.results import Result
from meshscale.simulate.cost import Call
from meshscale.simulate.engine import p2p_overhead
from meshscale.simulate.models import cost_model
from meshscale.simulate.nccl.network import REFERENCE_NET_LATENCY_S
from meshscale.simulate.nccl.search import analyse
from meshscale.simulate.nccl.tables import constants
from meshscale.simulate.nccl.tuning import latency_us
from meshscale.simulate.params import SimParams
from meshscale.topology import Topology, route
from meshscale.topology.cluster import ClusterSpec, build_cluster, plan_cluster
from meshscale.topology.nvml_discovery import model_facts
from meshscale.units import is_digits


def measured_on(result: Result) -> str:
    """What a bench result ran on, in words: '2 CPU worker processes over Gloo', '8x NVIDIA H100 80GB HBM3 over
    NCCL (NVLink)'."""
    backend = result.meta.get("backend")
    n = result.meta.get("world_size") or len(result.meta.get("devices") or []) or "?"
    if backend == "gloo":
        return f"{n} CPU worker processes over Gloo"
    models = _gpu_models(result.meta.get("topology") or {})
    return f"{n}x {', '.join(models) or 'GPU'} over NCCL"


def _gpu_models(topology: dict) -> list[str]:
    return sorted({str(n.get("model")) for n in topology.get("nodes") or [] if n.get("kind") == "gpu" and n.get("model")})


def _family(model: str) -> str:
    """The GPU model table's name for ``model`` ('H100 SXM'), or the model itself where the table lacks it."""
    facts, known = model_facts(model)
    return facts["name"] if known else model


def check_measured_on(topo: Topology, result: Result, flag: str) -> None:
    """Refuse, in one line, a measurement from another kind of device than ``topo`` has: CPU workers over Gloo
    for a GPU system (or GPUs for a CPU one), or another GPU model. A fit to it would describe that device."""
    backend = result.meta.get("backend")
    gpus = topo.device_kind == "gpu"
    wanted = f"a run on {topo.name}'s kind of device"
    if backend == "gloo" and gpus or backend == "nccl" and not gpus:
        need = "GPUs over NCCL (`meshscale bench ... --gpus N --json FILE` there)" if gpus else "CPU workers (--cpus N)"
        raise MeshscaleError(f"{flag}: measured on {measured_on(result)}, but {topo.name} has "
                             f"{'GPUs' if gpus else 'CPU workers'}; give {wanted}: {need}")
    measured = {_family(m) for m in _gpu_models(result.meta.get("topology") or {})}
    system = {_family(topo.nodes[g].attrs.get("model", "")) for g in topo.gpus() if topo.nodes[g].attrs.get("model")}
    if gpus and measured and system and not measured & system:
        raise MeshscaleError(f"{flag}: measured on {measured_on(result)}, but {topo.name} has "
                             f"{', '.join(sorted(system))}; give {wanted} ({', '.join(sorted(system))})")


def calibrate(topo: Topology, p2p: Result, base: SimParams | None = None) -> SimParams:
    """SimParams whose efficiency and message latency match the measured point-to-point figures."""
    if p2p.kind != "bench-p2p":
        raise MeshscaleError(f"calibration needs a bench-p2p result, got kind {p2p.kind!r}; run `meshscale bench p2p --json FILE`")
    check_measured_on(topo, p2p, "--p2p")
    base = base or SimParams()
    pairs = _best_per_pair(topo, p2p.rows)
    if not pairs:
        raise MeshscaleError("the bench-p2p result has no usable rows (src, dst, bandwidth_bytes_per_s); measure again")
    efficiency = dict(base.efficiency)
    latency = dict(base.message_latency_s)
    pure, mixed, lat = defaultdict(list), [], defaultdict(list)
    for (src, dst), (bandwidth, latency_s) in pairs.items():
        r = route(topo, src, dst)
        links = [topo.links[i] for p in r.paths for i, _ in p.directed_links]
        kinds = {l.kind for l in links}
        if bandwidth:
            bandwidth *= p2p_overhead(topo, r.paths[0].nodes)  # what the links carried, TLP overhead included
            if len(kinds) == 1:
                pure[kinds.pop()].append(bandwidth / r.bandwidth_bytes_per_s)
            else:
                mixed.append((links, bandwidth))
        if latency_s is not None:
            slowest = min(links, key=lambda l: l.bandwidth_bytes_per_s).kind
            lat[slowest].append((r.latency_s, latency_s))
    fitted = {kind: min(1.0, median(ratios)) for kind, ratios in pure.items()}
    # a mixed route's rate is set by its slowest link after efficiency; unfitted kinds take the ratio it implies
    guesses = defaultdict(list)
    for links, bandwidth in mixed:
        unknown = [l for l in links if l.kind not in fitted]
        known = min((l.bandwidth_bytes_per_s * fitted[l.kind] for l in links if l.kind in fitted), default=float("inf"))
        if unknown and bandwidth < known * 0.98:
            slow = min(unknown, key=lambda l: l.bandwidth_bytes_per_s)
            guesses[slow.kind].append(bandwidth / slow.bandwidth_bytes_per_s)
    fitted.update({kind: min(1.0, median(r)) for kind, r in guesses.items()})
    efficiency.update(fitted)
    scale = _fit_latency(lat, latency)
    source = f"calibrated from bench p2p ({len(pairs)} pairs: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(fitted.items())) + ")"
    return SimParams(efficiency, latency, base.reduce_bytes_per_s, scale if lat else base.hop_latency_scale, source)


def _fit_latency(samples: dict[str, list[tuple[float, float]]], latency: dict[str, float]) -> float:
    """Least squares of measured = a[kind] + scale * hop_latency; fills ``latency`` with a, returns scale."""
    kinds = sorted(samples)
    if not kinds:
        return 1.0
    rows = [(kinds.index(k), hop, got) for k in kinds for hop, got in samples[k]]
    design = np.zeros((len(rows), len(kinds) + 1))
    for j, (k, hop, _) in enumerate(rows):
        design[j, k], design[j, -1] = 1.0, hop
    measured = np.array([got for _, _, got in rows])
    coef = np.linalg.lstsq(design, measured, rcond=None)[0]
    if coef[-1] < 0:  # latency that falls with hops is noise: fit the intercepts alone
        coef = np.linalg.lstsq(design[:, :-1], measured, rcond=None)[0].tolist() + [0.0]
    latency.update({k: max(0.0, float(coef[i])) for i, k in enumerate(kinds)})
    return float(coef[-1])


def _device(topo: Topology, name) -> str | None:
    """A row's src/dst as a device name: an index (int or digits) or a node name (on a cluster, a name of one node
    is its first node's: a bench p2p ran inside one node); None for 'host' and the like."""
    if isinstance(name, int) or is_digits(name):
        try:
            return topo.device(int(name))
        except MeshscaleError:
            return None
    if topo.cluster is not None and isinstance(name, str) and not name.startswith("n0/"):
        name = f"n0/{name}"
    return name if name in topo.nodes and name in topo.devices() else None


def _best_per_pair(topo: Topology, rows: list[dict]) -> dict[tuple[str, str], tuple[float | None, float | None]]:
    """(src, dst) device names -> (best per-direction bandwidth, lowest latency). Bandwidth from one-way rows
    ("unidirectional"), else from "bidirectional" ones halved; "staged" rows (through host memory) are not
    what a collective uses and are ignored. Latency from any row that has one."""
    kinds = {str(r.get("mode", "")).lower() for r in rows if r.get("bandwidth_bytes_per_s")}
    one_way = any(not k.startswith(("bi", "staged")) for k in kinds)
    best: dict[tuple[str, str], tuple[float | None, float | None]] = {}
    for row in rows:
        src, dst = _device(topo, row.get("src")), _device(topo, row.get("dst"))
        if src is None or dst is None or src == dst:
            continue
        mode = str(row.get("mode", "")).lower()
        bandwidth = row.get("bandwidth_bytes_per_s")
        if mode.startswith("staged") or (mode.startswith("bi") and one_way):
            bandwidth = None
        elif bandwidth is not None and mode.startswith("bi"):
            bandwidth = bandwidth / 2
        latency_s = row.get("latency_s")
        old_bw, old_lat = best.get((src, dst), (None, None))
        best[(src, dst)] = (max((x for x in (old_bw, bandwidth) if x), default=None),
                            min((x for x in (old_lat, latency_s) if x is not None), default=None))
    return {pair: v for pair, v in best.items() if v != (None, None)}


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def calibrate_collective(topo: Topology, bench: Result, params: SimParams, collective: str = "all_reduce") -> SimParams:
    """Refine ``params`` so the simulator's busbw matches a measured collective (a `bench collective` result)
    at its largest size: the efficiency of the link kinds the ranks' routes use is scaled by measured /
    predicted. Copy engines (what `bench p2p` sees) reach more of a link than NCCL's SM-driven kernels do;
    this folds that difference in, for predictions at other rank counts of the same fabric."""
    if bench.kind != "bench-collective":
        raise MeshscaleError(f"collective calibration needs a bench-collective result, got kind {bench.kind!r}")
    check_measured_on(topo, bench, "--bench")
    rows = [r for r in bench.rows if r.get("collective") == collective and _positive(r.get("busbw_bytes_per_s"))
            and _positive(r.get("size_bytes"))]
    if not rows:
        raise MeshscaleError(f"the bench-collective result has no {collective} rows; measure it with "
                             f"`meshscale bench collective {collective} --json FILE`")
    row = max(rows, key=lambda r: r["size_bytes"])
    n = bench.meta.get("world_size") or 0
    if not isinstance(n, int) or isinstance(n, bool):
        raise MeshscaleError(f"the bench-collective result's meta.world_size {n!r} is not a rank count; measure again")
    ranks = topo.device_indices()[:n]
    if n < 2 or len(ranks) < n:
        raise MeshscaleError(f"the measured run had {n} ranks; the topology {topo.name} has {len(ranks)} devices")
    kinds = {topo.links[i].kind for a in ranks for b in ranks if a != b
             for p in route(topo, topo.device(a), topo.device(b)).paths for i, _ in p.directed_links}
    efficiency, ratio = dict(params.efficiency), 1.0
    for _ in range(3):  # latency terms make busbw not quite proportional to efficiency: a few fixed-point steps
        trial = SimParams(efficiency, params.message_latency_s, params.reduce_bytes_per_s, params.hop_latency_scale)
        call = Call(collective, int(row["size_bytes"]), tuple(ranks))
        predicted = cost_model(topo, "nccl", params=trial).predict(call, topo).busbw_bytes_per_s
        ratio = row["busbw_bytes_per_s"] / predicted if predicted > 0 else math.nan
        if not (math.isfinite(ratio) and ratio > 0):  # a fit that would never settle
            raise MeshscaleError(f"cannot fit to the measured {collective} busbw {row['busbw_bytes_per_s']!r} B/s; "
                                 "give a bench-collective result with positive, finite figures")
        efficiency.update({k: min(1.0, trial.efficiency_of(k) * ratio) for k in kinds})
    fitted = ", ".join(f"{k} {efficiency[k]:.2f}" for k in sorted(kinds))
    source = f"{params.source}; {collective} busbw of {n} ranks at {row['size_bytes']} B fitted ({fitted})"
    return SimParams(efficiency, params.message_latency_s, params.reduce_bytes_per_s, params.hop_latency_scale, source)


def fit_network(topo: Topology, bench: Result, collective: str = "all_reduce"):
    """The cluster ``topo`` with its network fitted to a measured multi-node ``collective`` (a bench-collective
    result with rows at several sizes), and the fit. Least squares of time = latency + size / rate over the
    rows; the rate a ring moves, size / time x 2(n-1)/n, is what the node's NICs carry together (the network is
    the ring's bottleneck across nodes); the latency beyond NCCL's own ring latency is spread over the ring's
    2 (nodes-1) network steps. Returns (topology, NetworkFit)."""

    cluster = topo.cluster
    if cluster is None:
        raise MeshscaleError("fitting the network needs a cluster: give --nodes N (and --link) or a cluster file")
    if bench.kind != "bench-collective":
        raise MeshscaleError(f"the network fit needs a bench-collective result, got kind {bench.kind!r}")
    gpus_per_node = len(topo.devices()) // cluster.nodes
    ranks = int(bench.meta.get("world_size") or 0)
    nodes = int(bench.meta.get("nodes") or (ranks // gpus_per_node if gpus_per_node else 0))
    if nodes < 2 or ranks < 2:
        raise MeshscaleError(f"the measured run has {ranks} rank(s) on {max(nodes, 1)} node(s) of {gpus_per_node} GPUs; "
                             "the network fit needs a multi-node result (meta world_size, or nodes, of 2 or more)")
    rows = [r for r in bench.rows if r.get("collective") == collective]
    if any(not (r.get("size_bytes") or 0) > 0 or not (r.get("time_s") or 0) > 0 for r in rows):
        raise MeshscaleError(f"the measured {collective} has a row whose size_bytes or time_s is not positive; "
                             "measure again")
    sizes = sorted({r["size_bytes"] for r in rows})
    if len(sizes) < 2:
        raise MeshscaleError(f"the network fit needs {collective} rows at two sizes or more, got {len(sizes)}")
    # least squares of the relative error: a row's noise grows with its time (a 1 MiB and a 512 MiB row span
    # three decades), so an absolute fit would let one slow large row set the latency
    design = np.array([[1.0, float(r["size_bytes"])] for r in rows])
    times = np.array([float(r["time_s"]) for r in rows])
    weight = 1.0 / times
    intercept_s, s_per_byte = np.linalg.lstsq(design * weight[:, None], times * weight, rcond=None)[0]
    if s_per_byte <= 0:
        raise MeshscaleError(f"the measured {collective} times do not grow with size; the fit needs a sweep "
                             "that reaches bandwidth-bound sizes (e.g. -b 1M -e 1G)")
    node_bytes_per_s = 2 * (ranks - 1) / ranks / s_per_byte
    nics = cluster.nics
    spec = ClusterSpec(node=cluster.node, nodes=cluster.nodes, nics=nics, link=cluster.link, levels=cluster.levels,
                       gpudirect=cluster.gpudirect, network=cluster.network, oversubscription=cluster.oversubscription,
                       placement=cluster.placement)
    # NCCL's ring latency on the measured cluster, without the network's own latency beyond the reference one
    measured = build_cluster(plan_cluster(replace(spec, nodes=nodes)))
    s = analyse(measured, list(range(ranks)))
    steps = 2 * (nodes - 1)
    base = latency_us(s, constants(), collective, "ring", "Simple") - s.net_extra_us * steps
    extra_s = max(0.0, intercept_s - base * 1e-6) / steps
    latency_s = REFERENCE_NET_LATENCY_S + extra_s
    rate = node_bytes_per_s / nics
    spec.link = f"{rate / 1e9:.4g}GB/s,{latency_s * 1e6:.4g}us"
    fitted = build_cluster(plan_cluster(spec))
    fit = NetworkFit(rate, latency_s, spec.link, len(rows), ranks, nodes, float(intercept_s), 1 / float(s_per_byte))
    return fitted, fit


@dataclass
class NetworkFit:
    """A network fitted to a measured multi-node collective: per-NIC rate and NIC-to-NIC latency."""

    rate_bytes_per_s: float
    latency_s: float
    link: str                 # the stated link it amounts to (``--link`` spelling)
    rows: int
    ranks: int
    nodes: int
    intercept_s: float        # the fit's time at size 0
    algbw_bytes_per_s: float  # the fit's size / time for large sizes

    @property
    def source(self) -> str:
        return (f"calibrated: network fitted to a measured {self.nodes}-node all_reduce ({self.rows} rows): "
                f"{self.rate_bytes_per_s / 1e9:.2f} GB/s per NIC, {self.latency_s * 1e6:.2f} us")


@dataclass(frozen=True)
class Calibrated:
    """A fabric under the measurements a command was given: the topology (on a cluster with a measured
    multi-node all_reduce, its network fitted: ``network_fit``) and the links' calibration."""

    topology: Topology
    params: SimParams
    network_fit: NetworkFit | None = None


def calibrated(topo: Topology, p2p: Result | None = None, bench: Result | None = None) -> Calibrated:
    """What ``--p2p`` and ``--bench`` make of ``topo``, the same for every command: on a cluster a measured
    all_reduce fits the network (`fit_network`), not the links inside a node; otherwise the links are fitted to
    ``p2p`` (`calibrate`), then to ``bench`` (`calibrate_collective`)."""
    fit = None
    if bench is not None and topo.cluster is not None:
        topo, fit = fit_network(topo, bench)
        bench = None
    params = calibrate(topo, p2p) if p2p is not None else SimParams()
    if bench is not None:
        params = calibrate_collective(topo, bench, params)
    if fit is not None:
        params = replace(params, source=fit.source)
    return Calibrated(topo, params, fit)
