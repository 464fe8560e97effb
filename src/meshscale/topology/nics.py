"""This node's network ports from sysfs: Ethernet interfaces (/sys/class/net) and InfiniBand ports
(/sys/class/infiniband), each with its state, rate, NUMA node and PCI path, and the PCIe relation between a
port and a GPU (what GPUDirect RDMA depends on). Every reader takes a root directory so tests fake the tree.

Interfaces without a PCI device behind them (lo, bridges, veth, ifb) are left out: they carry no traffic
between hosts of their own. An IB device's Ethernet-side netdev (ib0) is left to the InfiniBand list.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from meshscale.units import is_digits

# nvidia-smi's PCIe relations, nearest first
RELATIONS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_BUS_ID = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]$")


@dataclass
class Port:
    """One network port: an Ethernet interface or an InfiniBand device's port."""

    name: str                      # eth0, or mlx5_0/1 for an InfiniBand port
    kind: str                      # "ethernet" or "infiniband" (the link kinds of the topology model)
    state: str                     # up / down for Ethernet, ACTIVE / DOWN / INIT... for InfiniBand
    rate_gbits: float | None       # data rate per direction, None when the kernel does not say
    numa: int | None = None
    pci_path: tuple[str, ...] = ()  # PCI bridges from the root complex down to the device itself
    link_layer: str = ""           # InfiniBand or Ethernet (RoCE) for an InfiniBand port
    rate_text: str = ""            # the kernel's own words, "400 Gb/sec (4X NDR)"

    @property
    def usable(self) -> bool:
        return self.state.upper() in ("UP", "ACTIVE")

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        return self.rate_gbits * 1e9 / 8 if self.rate_gbits else None

    def to_dict(self) -> dict:
        return asdict(self)


def sysfs_dirs(root: str | Path = "/") -> tuple[Path, Path]:
    """(net, infiniband) class directories under ``root``."""
    root = Path(root)
    return root / "sys/class/net", root / "sys/class/infiniband"


def discover_ports(root: str | Path = "/") -> list[Port]:
    """Every network port of this node with a PCI device behind it: InfiniBand ports first, then Ethernet."""
    net_dir, ib_dir = sysfs_dirs(root)
    return infiniband_ports(ib_dir) + ethernet_ports(net_dir, ib_dir)


def infiniband_ports(ib_dir: Path) -> list[Port]:
    out = []
    for dev in _children(ib_dir):
        numa, path = _pci(dev / "device")
        for port in _children(dev / "ports"):
            rate_text = read_sysfs(port / "rate")
            number = re.match(r"\s*([\d.]+)\s*Gb", rate_text)
            out.append(Port(f"{dev.name}/{port.name}", "infiniband", read_sysfs(port / "state").split(":")[-1].strip(),
                            float(number.group(1)) if number else None, numa, path, read_sysfs(port / "link_layer"),
                            rate_text))
    return out


def ethernet_ports(net_dir: Path, ib_dir: Path | None = None) -> list[Port]:
    """Interfaces with a PCI device behind them, except the netdevs of InfiniBand devices."""
    ib_buses = {p.pci_path[-1] for p in infiniband_ports(ib_dir) if p.pci_path} if ib_dir else set()
    out = []
    for iface in _children(net_dir):
        if not (iface / "device").exists():
            continue
        numa, path = _pci(iface / "device")
        if path and path[-1] in ib_buses:
            continue
        speed = read_sysfs(iface / "speed")
        mbits = int(speed) if is_digits(speed.removeprefix("-")) else -1
        out.append(Port(iface.name, "ethernet", read_sysfs(iface / "operstate"), mbits / 1000 if mbits > 0 else None,
                        numa, path))
    return out


def interface_names(net_dir: Path) -> list[str]:
    """Every interface name, lo and virtual ones included (what NCCL_SOCKET_IFNAME may name)."""
    return [p.name for p in _children(net_dir)]


def gpu_pci_path(bus_id: str, root: str | Path = "/") -> tuple[int | None, tuple[str, ...]]:
    """(NUMA node, PCI path) of a GPU from its NVML bus id ('00000000:18:00.0')."""
    return _pci(Path(root) / "sys/bus/pci/devices" / bus_id[-12:].lower())


def pci_relation(a: tuple[str, ...], numa_a: int | None, b: tuple[str, ...], numa_b: int | None) -> str:
    """nvidia-smi's relation of two PCI devices from their paths: PIX (one switch between them), PXB (several
    switches, no host bridge), PHB (through the host bridge), NODE (same NUMA node), SYS (across sockets)."""
    above_a, above_b = a[:-1], b[:-1]
    shared = 0
    while shared < min(len(above_a), len(above_b)) and above_a[shared] == above_b[shared]:
        shared += 1
    if shared >= 2:  # a bridge below the root complex is common: the same PCIe switch tree
        return "PIX" if above_a == above_b or shared >= max(len(above_a), len(above_b)) - 1 else "PXB"
    if shared == 1:
        return "PHB"
    return "NODE" if numa_a is not None and numa_a == numa_b else "SYS"


def _pci(device: Path) -> tuple[int | None, tuple[str, ...]]:
    """NUMA node and PCI path of a sysfs device link (the bus ids on its resolved path, root complex first)."""
    try:
        resolved = Path(os.path.realpath(device))
    except OSError:
        return None, ()
    path = tuple(p for p in resolved.parts if _BUS_ID.match(p) or p.startswith("pci"))
    numa = read_sysfs(device / "numa_node")
    numa_node = int(numa) if is_digits(numa) else None
    return numa_node, path if any(_BUS_ID.match(p) for p in path) else ()


def _children(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def read_sysfs(path: Path, missing: str = "") -> str:
    """A sysfs attribute's text, stripped; ``missing`` when it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return missing
