"""Text views of a topology: the `nvidia-smi topo -m` matrix (plus bandwidth) and a one-line summary."""
from __future__ import annotations

from meshscale.topology.model import Topology
from meshscale.topology.queries import RELATION_LEGEND, pair_bandwidth, relation
from meshscale.units import gbps


def _labels(topo: Topology) -> tuple[list[str], list[str]]:
    """Row names as nvidia-smi prints them (GPU0.., NIC0..) and the node names behind them."""
    devices = topo.devices()
    prefix = "GPU" if topo.device_kind == "gpu" else "CPU"
    names = [f"{prefix}{topo.nodes[d].index}" for d in devices]
    nics = [n for n in topo.nodes_of("nic")]
    return names + [f"NIC{i}" for i in range(len(nics))], devices + nics


def host_view(topo: Topology, host: int = 0) -> Topology:
    """Host ``host`` of a system of several hosts (an NVL72 rack: 18 compute trays, each its own OS) with the
    NVLink switches its GPUs reach the others through: what `nvidia-smi topo -m` shows on that host. A system
    without ``host`` marks is its own view."""
    hosts = {n.attrs.get("host") for n in topo.nodes.values() if n.attrs.get("host") is not None}
    if len(hosts) < 2:
        return topo
    keep = {name: n for name, n in topo.nodes.items() if n.attrs.get("host") == host or n.kind == "nvswitch"}
    return Topology(f"{topo.name}/host{host}", keep, [l for l in topo.links if l.a in keep and l.b in keep],
                    topo.title, topo.attrs)


def relation_matrix(topo: Topology, bandwidth: bool = True) -> str:
    """The matrix of `nvidia-smi topo -m` (same layout and legend), then per-pair bandwidth in GB/s. A system of
    several hosts (an NVL72 rack): the first host's, as nvidia-smi shows it there, under a line on the others."""
    view = host_view(topo)
    if view is not topo:
        hosts = len({n.attrs["host"] for n in topo.nodes.values() if n.attrs.get("host") is not None})
        first = [topo.nodes[d].index for d in view.devices()]
        return (f"one host of {hosts} (GPUs {first[0]}-{first[-1]}, as nvidia-smi shows it there); the other hosts' "
                f"GPUs are as far over NVLink as these\n\n{relation_matrix(view, bandwidth)}")
    labels, nodes = _labels(topo)
    if not labels:  # a system of CPUs and switches only: drawable, but no matrix of devices
        return (f"{topo.name} has no GPUs or NICs: no device matrix to show ({len(topo.nodes)} nodes, "
                f"{len(topo.links)} links; --format svg draws them)")
    width = max([6, *(len(l) + 2 for l in labels)])
    lines = [" " * width + "".join(f"{l:<{width}}" for l in labels) + "CPU Affinity    NUMA Affinity"]
    for label, a in zip(labels, nodes):
        cells = "".join(f"{relation(topo, a, b):<{width}}" for b in nodes)
        attrs = topo.nodes[a].attrs
        lines.append(f"{label:<{width}}{cells}{str(attrs.get('cpu_affinity', 'N/A')):<16}{attrs.get('numa', 'N/A')}")
    lines += ["", "Legend:", ""]
    lines += [f"  {key:<4} = {text}" for key, text in RELATION_LEGEND]
    if topo.nodes_of("nic"):
        lines += ["", "NIC Legend:", ""]
        lines += [f"  NIC{i}: {n}" for i, n in enumerate(topo.nodes_of("nic"))]
    if bandwidth:
        devices = topo.devices()
        dlabels = labels[: len(devices)]
        lines += ["", "Bandwidth per direction, GB/s (best route; line rate, not measured):", ""]
        lines.append(" " * width + "".join(f"{l:>{width}}" for l in dlabels))
        for label, a in zip(dlabels, devices):
            cells = "".join(f"{'-' if a == b else f'{gbps(pair_bandwidth(topo, a, b)):.1f}':>{width}}" for b in devices)
            lines.append(f"{label:<{width}}{cells}")
    return "\n".join(lines)


def per_gpu_bandwidth(topo: Topology) -> tuple[float, float]:
    """(NVLink, PCIe) bytes/s per direction leaving the first device: the figures `systems` lists."""
    devices = topo.devices()
    if not devices:
        return 0.0, 0.0
    first = devices[0]
    nvlink = sum(l.bandwidth_bytes_per_s for l in topo.links_of(first, "nvlink"))
    pcie = sum(l.bandwidth_bytes_per_s for l in topo.links_of(first, "pcie"))
    return nvlink, pcie


def summary(topo: Topology) -> str:
    n = len(topo.devices())
    if topo.device_kind == "worker":
        shm = sum(l.bandwidth_bytes_per_s for l in topo.links_of(topo.devices()[0], "shm")) if n else 0.0
        source = topo.attrs.get("bandwidth_source", "")
        return (f"{topo.title or topo.name}: {n} CPU worker{'s' if n != 1 else ''} (Gloo), shared memory "
                f"{gbps(shm):.0f} GB/s per worker per direction{f', {source}' if source else ''}")
    nvlink, pcie = per_gpu_bandwidth(topo)
    c2c = sum(l.bandwidth_bytes_per_s for l in topo.links_of(topo.devices()[0], "c2c")) if n else 0.0
    c2c_text = f", NVLink-C2C {gbps(c2c):.0f} GB/s to its CPU" if c2c else ""
    from meshscale.topology.partitions import partition_lines
    return "\n".join([f"{topo.title or topo.name}: {n} GPU{'s' if n != 1 else ''} ({topo.gpu_model}), "
                      f"NVLink {gbps(nvlink):.0f} GB/s and PCIe {gbps(pcie):.1f} GB/s per device per direction"
                      f"{c2c_text}", *partition_lines(topo)])
