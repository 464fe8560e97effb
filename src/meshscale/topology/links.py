"""Link bandwidth from first principles: signalling rate x lanes x line-code efficiency.

All results are bytes per second in one direction. Sources: PCI-SIG base specs, NVIDIA NVLink generations,
InfiniBand Trade Association lane rates (docs/references.md lists them).
"""
from __future__ import annotations

from meshscale.errors import MeshscaleError

# PCIe generation -> (GT/s per lane, encoding efficiency)
PCIE_GENERATIONS = {
    1: (2.5, 8 / 10),
    2: (5.0, 8 / 10),
    3: (8.0, 128 / 130),
    4: (16.0, 128 / 130),
    5: (32.0, 128 / 130),
    6: (64.0, 242 / 256),  # PAM4 + FLIT mode: 242 useful bytes per 256-byte FLIT
}
PCIE_WIDTHS = (1, 2, 4, 8, 16, 32)

# NVLink generation -> bytes/s per link per direction (nominal)
NVLINK_GENERATIONS = {1: 20e9, 2: 25e9, 3: 25e9, 4: 25e9, 5: 50e9}

# InfiniBand rate -> (Gb/s signalling per lane, encoding efficiency)
INFINIBAND_RATES = {
    "sdr": (2.5, 8 / 10),
    "ddr": (5.0, 8 / 10),
    "qdr": (10.0, 8 / 10),
    "fdr10": (10.3125, 64 / 66),
    "fdr": (14.0625, 64 / 66),
    "edr": (25.78125, 64 / 66),
    # HDR/NDR: PAM4 lanes whose RS-FEC and 256b/257b transcoding sit on top of 64b/66b: 50 / 53.125 useful
    "hdr": (53.125, 50 / 53.125),
    "ndr": (106.25, 100 / 106.25),
    # XDR: 200 Gb/s of data per lane on 212.5 Gb/s PAM4 lanes (as 200G-per-lane Ethernet), 800 Gb/s over 4x;
    # ConnectX-8 and Quantum-X800 ports (NVIDIA ConnectX-8 SuperNIC and Quantum-X800 datasheets)
    "xdr": (212.5, 200 / 212.5),
}
INFINIBAND_WIDTHS = (1, 2, 4, 8, 12)


# QPI / UPI: per direction, from Intel's GT/s x 2 bytes per transfer (a 20-lane link carries 16 data bits).
QPI_DEFAULT_GT_S = 9.6  # Xeon E5 v4: 9.6 GT/s -> 19.2 GB/s per direction... see qpi_bandwidth
UPI_DEFAULT_GT_S = 10.4


def lane_bandwidth(what: str, rates: dict, rate, widths, width: int) -> float:
    """Bytes/s per direction of a serial link: lane rate (Gb/s or GT/s) x encoding efficiency x lanes / 8. PCIe and
    InfiniBand are both counted this way; ``what`` names the link kind in the one-line error."""
    if rate not in rates:
        raise MeshscaleError(f"unknown {what} rate {rate!r}: use one of {', '.join(map(str, rates))}")
    if width not in widths:
        raise MeshscaleError(f"unknown {what} width {width}: use one of {list(widths)}")
    per_lane, efficiency = rates[rate]
    return per_lane * 1e9 * efficiency * width / 8


def pcie_bandwidth(generation: int, width: int) -> float:
    """PCIe bytes/s per direction: GT/s x lanes x encoding / 8 (PCIe 3.0 x16 = 15.754e9)."""
    return lane_bandwidth("PCIe generation", PCIE_GENERATIONS, generation, PCIE_WIDTHS, width)


def nvlink_bandwidth(generation: int, count: int = 1) -> float:
    """NVLink bytes/s per direction for ``count`` bonded links of a generation (NVLink 1: 20e9 per link)."""
    if generation not in NVLINK_GENERATIONS:
        raise MeshscaleError(f"unknown NVLink generation {generation}: use one of {sorted(NVLINK_GENERATIONS)}")
    if count < 1:
        raise MeshscaleError(f"NVLink count must be at least 1, got {count}")
    return NVLINK_GENERATIONS[generation] * count


def infiniband_bandwidth(rate: str, width: int = 4) -> float:
    """InfiniBand data bytes/s per direction: lane rate x encoding x width / 8 (EDR 4x = 100 Gb/s = 12.5e9)."""
    return lane_bandwidth("InfiniBand", INFINIBAND_RATES, rate.lower(), INFINIBAND_WIDTHS, width)


def ethernet_bandwidth(gbits: float) -> float:
    """Ethernet bytes/s per direction for a nominal rate in Gb/s (10 GbE = 1.25e9)."""
    if gbits <= 0:
        raise MeshscaleError(f"Ethernet rate must be positive, got {gbits} Gb/s")
    return gbits * 1e9 / 8


def qpi_bandwidth(gt_per_s: float = QPI_DEFAULT_GT_S, links: int = 2) -> float:
    """QPI/UPI bytes/s per direction: GT/s x 2 bytes x links. Xeon E5-2698 v4: 9.6 GT/s x 2 B x 2 links = 38.4e9
    raw; about 25.6e9 is usable in practice, which the catalog states explicitly."""
    if gt_per_s <= 0 or links < 1:
        raise MeshscaleError("QPI/UPI needs a positive GT/s and at least one link")
    return gt_per_s * 1e9 * 2 * links


# A network rate stated by the user: "25GB/s,5us", "100Gb/s,2us", "12.5 GB/s, 1.3 us" (latency optional).
# B is bytes, b bits: the case of that letter matters, the prefix's does not
_RATE_UNITS = {"GB/s": 1e9, "GBps": 1e9, "Gb/s": 1e9 / 8, "Gbps": 1e9 / 8, "Gbit/s": 1e9 / 8,
               "MB/s": 1e6, "Mb/s": 1e6 / 8, "TB/s": 1e12, "Tb/s": 1e12 / 8}
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_network_rate(text: str) -> tuple[float, float | None]:
    """(bytes/s per direction, latency seconds or None) of a stated network rate: ``RATE[,LATENCY]`` with RATE in
    GB/s (bytes) or Gb/s (bits), LATENCY in ns, us or ms. One-line error when it does not parse."""
    import re

    def bad(why: str) -> MeshscaleError:
        return MeshscaleError(f"network rate {text!r} {why}; write RATE[,LATENCY] such as 25GB/s,5us or 100Gb/s,2us")

    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) > 2 or not parts[0]:
        raise bad("is not a rate")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-z]+/?s?)", parts[0], re.IGNORECASE)
    if not m:
        raise bad("is not a number with a unit")
    value, unit = float(m.group(1)), m.group(2)
    scale = _RATE_UNITS.get(unit[0].upper() + unit[1:])
    if scale is None:
        raise bad(f"has an unknown unit {unit!r} (GB/s for bytes, Gb/s for bits)")
    if value <= 0:
        raise bad("is not positive")
    latency_s = None
    if len(parts) == 2:
        t = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*(ns|us|ms|s)", parts[1], re.IGNORECASE)
        if not t:
            raise bad("has a latency that is not a number with ns, us or ms")
        latency_s = float(t.group(1)) * _TIME_UNITS[t.group(2).lower()]
        if latency_s <= 0:
            raise bad("has a latency that is not positive")
    return value * scale, latency_s
