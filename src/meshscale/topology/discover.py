"""Discovery of the real machine. With NVIDIA GPUs: NVML (nvidia-ml-py). Without: a CPU-only topology of one
host and N worker processes over shared memory, with a one-line notice saying so (never a traceback)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from meshscale.errors import MeshscaleError
from meshscale.topology.model import Link, Node, Topology
from meshscale.topology.multinode import hostname
from meshscale.topology.nvml_discovery import NoGPU, nvml_topology
from meshscale.units import is_digits

# Shared-memory copy rate assumed for CPU workers until `bench p2p` measures it (a modest DDR4 memcpy).
ASSUMED_SHM_BYTES_PER_S = 10e9


@dataclass
class Discovery:
    """What discovery found: the topology and a notice for the user (on GPUs: only what was assumed about
    a GPU model outside the table of known models)."""

    topology: Topology
    notice: str = ""
    cpu_only: bool = False  # no GPU: the topology is this machine's CPU worker processes


def cpu_topology(workers: int | None = None) -> Topology:
    """One host, its CPU socket(s) and ``workers`` rank processes joined by shared memory."""
    workers = workers or min(4, os.cpu_count() or 1)
    sockets = _numa_nodes()
    nodes = {"host": Node("host", "host", {"hostname": hostname()})}
    links = []
    for s in range(sockets):
        nodes[f"cpu{s}"] = Node(f"cpu{s}", "cpu", {"numa": s, "pcie_relation": "NODE"})
        links.append(Link(f"cpu{s}", "host", "shm", ASSUMED_SHM_BYTES_PER_S * 4, 0.0))
    for w in range(workers):
        name = f"worker{w}"
        nodes[name] = Node(name, "worker", {"index": w, "model": "CPU process (Gloo)", "numa": w % sockets})
        links.append(Link(name, f"cpu{w % sockets}", "shm", ASSUMED_SHM_BYTES_PER_S, 2.0e-6))
    return Topology("cpu-host", nodes, links, f"this machine: {workers} CPU workers over shared memory",
                    {"bandwidth_source": "assumed (measure with `meshscale bench p2p`)"})


def _numa_nodes() -> int:
    try:
        return max(1, len([d for d in os.listdir("/sys/devices/system/node") if d.startswith("node") and is_digits(d[4:])]))
    except OSError:
        return 1


def discover(workers: int | None = None, nvml=None) -> Discovery:
    """The topology of this machine: from NVML when NVIDIA GPUs are present, else CPU workers."""
    try:
        topo = nvml_topology(nvml)
        return Discovery(topo, "; ".join(topo.attrs.get("assumed", [])))
    except NoGPU as reason:
        topo = cpu_topology(workers)
        notice = f"no NVIDIA GPU found ({reason}): using {len(topo.devices())} CPU workers over Gloo and the simulator"
        return Discovery(topo, notice, cpu_only=True)
    except MeshscaleError:
        raise
    except Exception as exc:  # an NVML answer discovery did not expect: one line, never a traceback
        raise MeshscaleError(f"NVML discovery failed ({type(exc).__name__}: {exc}); "
                             "name a system instead with --system NAME|FILE") from None
