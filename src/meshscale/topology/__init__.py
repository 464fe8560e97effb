"""Layer 1: the machine as a graph of devices and links, the reference catalog, and discovery."""
from meshscale.topology.catalog import load_catalog, load_system, system_names
from meshscale.topology.model import Link, Node, Topology
from meshscale.topology.queries import (Route, bisection_bandwidth, bottleneck_bandwidth, pair_bandwidth,
                                        relation, route, shared_links, subset)
from meshscale.topology.schema import dumps, from_dict, load, to_dict

__all__ = ["Link", "Node", "Topology", "Route", "route", "pair_bandwidth", "bottleneck_bandwidth", "relation",
           "subset", "bisection_bandwidth", "shared_links", "load", "from_dict", "to_dict", "dumps",
           "load_system", "load_catalog", "system_names"]
