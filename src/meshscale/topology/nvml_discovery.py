"""Build a `Topology` of this machine's NVIDIA GPUs from NVML. (Being written: see issue 2.)"""
from __future__ import annotations

from meshscale.topology.model import Topology


class NoGPU(Exception):
    """NVML or its GPUs are not there; the message says which."""


def nvml_topology(nvml=None) -> Topology:
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as exc:
        raise NoGPU(f"NVML unavailable: {type(exc).__name__}") from None
    raise NoGPU("NVML discovery is not built yet")
