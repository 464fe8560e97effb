"""Layer 1: the machine as a graph of devices and links, the reference catalog, and discovery.

The names resolve on first use: a command that only parses its options (``-h``, ``--version``) does not pay for
the graph libraries behind them."""
from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "meshscale.topology.catalog": ("load_system",),
    "meshscale.topology.model": ("Link", "Node", "Topology"),
    "meshscale.topology.queries": ("Route", "bisection_bandwidth", "bottleneck_bandwidth", "pair_bandwidth",
                                   "relation", "route", "shared_links", "subset"),
    "meshscale.topology.schema": ("dumps", "from_dict", "load", "to_dict"),
    "meshscale.topology.shipped": ("load_catalog", "system_names"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_HOME_OF)


def __getattr__(name: str) -> Any:
    if name in _HOME_OF:
        return getattr(importlib.import_module(_HOME_OF[name]), name)
    raise AttributeError(f"module 'meshscale.topology' has no attribute {name!r}")
