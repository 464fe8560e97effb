"""The knobs of the simulator: how much of a link's line rate a protocol gets, the per-message overhead and the
reduction rate. Defaults are public figures; `calibrate` replaces them with a machine's measured ones."""
from __future__ import annotations

from dataclasses import dataclass, field

# Share of the line rate (per direction) that a bulk GPU-to-GPU copy achieves, per link kind. NVLink: NCCL
# rings reach about 80% (DGX-1 P100: 4 links x 20 GB/s -> "over 60 GB/s"). PCIe: "GPU & CUDA multi-machine communication" measured 10.59 of
# 15.75 GB/s between two GPUs under one switch (0.67); crossing a CPU costs more (INTEL_P2P_OVERHEAD).
DEFAULT_EFFICIENCY = {
    "nvlink": 0.8,
    "c2c": 0.8,         # NVLink-C2C: NVLink's share
    "pcie": 0.7,
    "qpi": 0.6,
    "upi": 0.6,
    "infiniband": 0.9,
    "ethernet": 0.9,
    "shm": 0.8,
}

# GPU peer-to-peer traffic through an Intel CPU (its root complex, and QPI/UPI to the other socket) travels in
# 64-byte TLPs and costs this much of each link's bandwidth (NCCL src/graph/topo.h INTEL_P2P_OVERHEAD(bw) =
# bw*6/5). "GPU & CUDA multi-machine communication" measured 9.15 GB/s across QPI, 10.59 under one switch.
INTEL_P2P_OVERHEAD = 1.2

# Per-message software overhead (launch, handshake, flag polling) added to a route's hop latency, per kind of
# the route's slowest link; "default" for kinds not named. NCCL's small-message floor is a few us per step.
DEFAULT_MESSAGE_LATENCY_S = {"default": 2.0e-6, "infiniband": 3.0e-6, "ethernet": 15.0e-6, "shm": 5.0e-6}

# Reduction throughput of a rank when the topology does not say (bytes of incoming data reduced per second).
# A GPU reads two operands and writes one, so about a third of its memory bandwidth; CPU workers far less.
DEFAULT_GPU_REDUCE_BYTES_PER_S = 200e9
DEFAULT_CPU_REDUCE_BYTES_PER_S = 4e9


@dataclass
class SimParams:
    """Simulator parameters. ``reduce_bytes_per_s`` None: a third of the GPU's memory bandwidth (or defaults)."""

    efficiency: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_EFFICIENCY))
    message_latency_s: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MESSAGE_LATENCY_S))
    reduce_bytes_per_s: float | None = None
    hop_latency_scale: float = 1.0  # multiplies the topology's per-hop latencies (calibration fits it)
    source: str = "defaults"  # where the figures come from (shown by `plan`)

    def efficiency_of(self, kind: str) -> float:
        return self.efficiency.get(kind, DEFAULT_EFFICIENCY.get(kind, 0.8))

    def message_latency_of(self, kind: str) -> float:
        return self.message_latency_s.get(kind, self.message_latency_s.get("default", DEFAULT_MESSAGE_LATENCY_S["default"]))
