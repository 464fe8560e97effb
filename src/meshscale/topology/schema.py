"""Reading and writing system descriptions (YAML or JSON), with validation that names the file, the entry
and the fix. The same schema serves the shipped catalog, user files and the JSON that `topo` writes.

    name: my-server                 # required
    title: free text
    gpu_count: 4                    # optional check against the gpu nodes
    defaults:                       # merged into every node of that kind / link of that kind
      gpu: {model: Tesla V100-SXM2-16GB, memory_bytes: 17179869184}
      nvlink: {generation: 2}
    nodes:
      - {name: gpu0, kind: gpu, index: 0, numa: 0}
      - {name: nvswitch0, kind: nvswitch, pos: [2, 3]}   # any other key is an attr; pos places it in diagrams
    links:
      - {a: gpu0, b: gpu1, kind: nvlink, count: 2}
      - {a: cpu0, b: cpu1, kind: qpi, bandwidth_gb_per_s: 25.6}
"""
from __future__ import annotations

import json
from dataclasses import asdict
import re
from pathlib import Path
from typing import Any

from meshscale.errors import MeshscaleError, TopologyError
import meshscale.topology.links as calc
from meshscale.topology.limits import MAX_NODES
from meshscale.topology.model import DEFAULT_LATENCY_S, LINK_KINDS, NODE_KINDS, Link, Node, Topology
from meshscale.validation import Range, load_structured

SCHEMA = "meshscale-topology/1"
_LINK_KEYS = {"a", "b", "kind", "count", "generation", "width", "rate", "bandwidth_bytes_per_s",
              "bandwidth_gb_per_s", "latency_s"}
_TOP_KEYS = {"schema", "name", "title", "gpu_count", "defaults", "nodes", "links", "attrs", "fabric"}


# Sane ranges of a system file's numbers: a link is between a slow NIC (1 kB/s) and 1 PB/s, a hop takes at most
# a second, a bundle has at most this many links (NVLink bonds are tens), an index is an nvidia-smi number.
BANDWIDTH_RANGE_BYTES_PER_S = (1e3, 1e15)
MAX_LATENCY_S = 1.0
MAX_LINK_COUNT = 1000
MAX_LINKS = 1_000_000
_WHOLE = Range(0, 1 << 20, integer=True)
NODE_ATTR_CHECKS = {  # attrs other layers read as numbers; any other attr is free text or data
    "index": _WHOLE, "numa": Range(-1, 1 << 16, integer=True), "board": _WHOLE, "node": _WHOLE, "host": _WHOLE,
    "memory_bytes": Range(0, 1 << 60), "memory_bandwidth_bytes_per_s": Range(*BANDWIDTH_RANGE_BYTES_PER_S),
    "latency_s": Range(0, MAX_LATENCY_S), "radix": Range(2, 1 << 16, integer=True),
    "pcie_generation": Range(1, 16, integer=True), "pcie_max_generation": Range(1, 16, integer=True),
    "pcie_width": Range(1, 32, integer=True), "pcie_max_width": Range(1, 32, integer=True),
    "nvlink_generation": Range(1, 16, integer=True),
}
# attrs other layers read as true or false: "false" (text) or [false] would read as true, so only true or false
BOOLEAN_NODE_ATTRS = ("gpudirect_rdma", "multicast", "rdma")
_LINK_NUMBERS = {"generation": Range(1, 16, integer=True), "width": Range(1, 32, integer=True),
                 "count": Range(1, MAX_LINK_COUNT, integer=True), "latency_s": Range(0, MAX_LATENCY_S),
                 "bandwidth_bytes_per_s": Range(), "bandwidth_gb_per_s": Range()}


def _fail(source: str, entry: str, problem: str, fix: str) -> TopologyError:
    return TopologyError(f"{source}: {entry}: {problem}; {fix}")


def _checked(source: str, check, value: Any, where: str) -> Any:
    """A `validation` check whose error is a TopologyError naming the file."""
    try:
        return check(value, f"{source}: {where}")
    except TopologyError:
        raise
    except MeshscaleError as exc:
        raise TopologyError(str(exc)) from None


def _link_bandwidth(spec: dict[str, Any], source: str, entry: str) -> float:
    """Bytes/s per direction of a link entry: explicit if given, else from its kind's calculator."""
    if "bandwidth_bytes_per_s" in spec:
        return float(spec["bandwidth_bytes_per_s"])
    if "bandwidth_gb_per_s" in spec:
        return float(spec["bandwidth_gb_per_s"]) * 1e9
    kind, count = spec["kind"], int(spec.get("count", 1))
    try:
        if kind == "nvlink":
            return calc.nvlink_bandwidth(int(spec["generation"]), count)
        if kind == "pcie":
            return calc.pcie_bandwidth(int(spec["generation"]), int(spec["width"])) * count
        if kind == "infiniband":
            return calc.infiniband_bandwidth(str(spec["rate"]), int(spec.get("width", 4))) * count
        if kind == "ethernet":
            gbits = float(re.sub(r"[^0-9.]", "", str(spec["rate"]))[:32] or 0)
            return calc.ethernet_bandwidth(gbits) * count
    except KeyError as missing:
        raise _fail(source, entry, f"{kind} link lacks {missing.args[0]!r}",
                    f"add {missing.args[0]}: ... or set bandwidth_gb_per_s") from None
    except TopologyError:
        raise
    except Exception as exc:  # MeshscaleError from a calculator, or a value that is not a number
        raise _fail(source, entry, str(exc), "correct the value") from None
    raise _fail(source, entry, f"{kind} link has no bandwidth", "set bandwidth_gb_per_s (GB/s per direction)")


def _name(value: Any, source: str, where: str) -> str:
    if (isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip()
            or len(str(value)) > 200 or any(c in str(value) for c in "\n\r\x00")):
        raise _fail(source, where, f"name {str(value)[:40]!r} is not a name", "give a short string such as gpu0 "
                    "(one line)")
    return str(value)


def _check_link_numbers(spec: dict[str, Any], source: str, where: str) -> None:
    for key, check in _LINK_NUMBERS.items():
        if key in spec and not (key in ("generation", "width") and spec[key] is None):
            _checked(source, check, spec[key], f"{where}: {key}")
    if "rate" in spec and spec["rate"] is not None and not isinstance(spec["rate"], (str, int, float)):
        raise _fail(source, where, f"rate {spec['rate']!r} is not a rate", "write e.g. rate: edr or rate: 100gbe")


def from_dict(data: Any, source: str = "<dict>") -> Topology:
    """Build and validate a `Topology` from parsed YAML/JSON; errors name ``source`` and the entry. Every field
    is type-checked and every number must be finite and in a sane range, and a system needs a rank device."""
    name, defaults = _checked_top_level(data, source)
    nodes = _nodes(data.get("nodes") or [], defaults, source)
    links = [_link(i, entry, defaults, nodes, source) for i, entry in enumerate(data.get("links") or [])]
    gpus = [n for n in nodes.values() if n.kind == "gpu"]
    if "gpu_count" in data and data["gpu_count"] != len(gpus):
        raise _fail(source, "gpu_count", f"says {data['gpu_count']!r} but {len(gpus)} gpu nodes are defined",
                    "make gpu_count match the gpu entries under nodes")
    try:
        return Topology(name, nodes, links, str(data.get("title") or ""), dict(data.get("attrs") or {}),
                        _fabric(data.get("fabric"), source))
    except TopologyError as exc:
        raise TopologyError(f"{source}: {exc}") from None


def _checked_top_level(data: Any, source: str) -> tuple[str, dict]:
    """The file's name and defaults, once its top-level keys and their types are checked."""
    if not isinstance(data, dict):
        raise _fail(source, "top level", "is not a mapping", "start the file with 'name: ...', 'nodes:' and 'links:'")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise _fail(source, "top level", f"unknown key(s) {sorted(map(str, unknown))}", f"use only {sorted(_TOP_KEYS)}")
    name = data.get("name")
    if not name or not isinstance(name, str) or len(name) > 200 or "\x00" in name or "\n" in name:
        raise _fail(source, "name", "missing" if not name else f"{name!r} is not a usable name",
                    "add 'name: my-system' (one line)")
    if not isinstance(data.get("title", ""), (str, type(None))):
        raise _fail(source, "title", f"{data['title']!r} is not text", "write title: free text")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict) or not all(isinstance(v, (dict, type(None))) for v in defaults.values()):
        raise _fail(source, "defaults", "is not a mapping of mappings", "write defaults as 'defaults: {gpu: {...}, nvlink: {...}}'")
    for key in ("nodes", "links"):
        if not isinstance(data.get(key) or [], list):
            raise _fail(source, key, f"is {type(data[key]).__name__}, not a list", f"write {key} as a list of entries ('- {{...}}')")
    if len(data.get("nodes") or []) > MAX_NODES or len(data.get("links") or []) > MAX_LINKS:
        raise _fail(source, "nodes", "too many entries", f"a system has at most {MAX_NODES} nodes and {MAX_LINKS} links")
    if not isinstance(data.get("attrs") or {}, dict):
        raise _fail(source, "attrs", "is not a mapping", "write attrs as 'attrs: {key: value}'")
    return name, defaults


def _nodes(entries: list, defaults: dict, source: str) -> dict[str, Node]:
    """The ``nodes:`` entries, by name, each with its kind's defaults under its own attributes."""
    nodes: dict[str, Node] = {}
    for i, entry in enumerate(entries):
        where = f"nodes[{i}]"
        if not isinstance(entry, dict) or "name" not in entry or "kind" not in entry:
            raise _fail(source, where, "needs a name and a kind", "write it as {name: gpu0, kind: gpu, index: 0}")
        node_name = _name(entry["name"], source, where)
        where = f"nodes[{i}] ({node_name})"
        if not isinstance(entry["kind"], str) or entry["kind"] not in NODE_KINDS:
            raise _fail(source, where, f"unknown node kind {entry['kind']!r}", f"use one of {', '.join(NODE_KINDS)}")
        if node_name in nodes:
            raise _fail(source, where, f"duplicate node name {node_name!r}", "give every node a unique name")
        attrs = {**(defaults.get(entry["kind"]) or {}), **{k: v for k, v in entry.items() if k not in ("name", "kind")}}
        _check_node_attrs(attrs, source, where)
        nodes[node_name] = Node(node_name, entry["kind"], attrs)
    if not nodes:
        raise _fail(source, "nodes", "no node", "describe at least one {name: gpu0, kind: gpu, index: 0}")
    return nodes


def _check_node_attrs(attrs: dict[str, Any], source: str, where: str) -> None:
    for key, check in NODE_ATTR_CHECKS.items():
        if attrs.get(key) is not None:
            _checked(source, check, attrs[key], f"{where}: {key}")
    for key in BOOLEAN_NODE_ATTRS:
        if attrs.get(key) is not None and not isinstance(attrs[key], bool):
            raise _fail(source, where, f"{key} {str(attrs[key])[:40]!r} is not true or false",
                        f"write {key}: true or {key}: false (unquoted)")
    if "pos" in attrs and not (isinstance(attrs["pos"], list) and len(attrs["pos"]) == 2):
        raise _fail(source, where, f"pos {attrs['pos']!r} is not [x, y]", "write pos: [2, 3]")
    for k, xy in enumerate(attrs.get("pos") or []):
        _checked(source, Range(-1e6, 1e6), xy, f"{where}: pos[{k}]")
    if "model" in attrs and not isinstance(attrs["model"], str):
        raise _fail(source, where, f"model {attrs['model']!r} is not text", "write model: Tesla V100-SXM2-16GB")
    if "mig_mode" in attrs or "mig_instances" in attrs:
        from meshscale.topology.partitions import check_mig_instances
        _checked(source, check_mig_instances, attrs, where)


def _link(i: int, entry: Any, defaults: dict, nodes: dict[str, Node], source: str) -> Link:
    """The ``links[i]`` entry, between two of ``nodes``, with its kind's defaults under its own fields."""
    where = f"links[{i}]"
    if not isinstance(entry, dict) or not {"a", "b", "kind"} <= set(entry):
        raise _fail(source, where, "needs a, b and kind", "write it as {a: gpu0, b: gpu1, kind: nvlink, count: 1}")
    ends = [_name(entry[end], source, where) for end in ("a", "b")]
    where = f"links[{i}] ({ends[0]} - {ends[1]})"
    if not isinstance(entry["kind"], str) or entry["kind"] not in LINK_KINDS:
        raise _fail(source, where, f"unknown link kind {entry['kind']!r}", f"use one of {', '.join(LINK_KINDS)}")
    spec = {**(defaults.get(entry["kind"]) or {}), **entry, "a": ends[0], "b": ends[1]}
    unknown = set(spec) - _LINK_KEYS
    if unknown:
        raise _fail(source, where, f"unknown key(s) {sorted(map(str, unknown))}", f"use only {sorted(_LINK_KEYS)}")
    for end in ("a", "b"):
        if spec[end] not in nodes:
            raise _fail(source, where, f"links to missing node {spec[end]!r}", f"define {spec[end]!r} under nodes or fix the name")
    count = spec.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise _fail(source, where, f"count {count!r} is not a positive integer", "set count: 1 or more")
    _check_link_numbers(spec, source, where)
    bandwidth = _link_bandwidth(spec, source, where)
    if not bandwidth > 0:
        raise _fail(source, where, f"bandwidth {bandwidth:g} B/s is not positive", "give a positive bandwidth")
    lo, hi = BANDWIDTH_RANGE_BYTES_PER_S
    if not lo <= bandwidth <= hi:
        raise _fail(source, where, f"bandwidth {bandwidth:g} B/s is out of range",
                    f"give between {lo / 1e9:g} and {hi / 1e9:g} GB/s per direction")
    latency = float(spec.get("latency_s", DEFAULT_LATENCY_S[spec["kind"]]))
    if latency < 0:
        raise _fail(source, where, f"latency {latency:g} s is negative", "give latency_s >= 0")
    return Link(spec["a"], spec["b"], spec["kind"], bandwidth, latency, count,
                spec.get("generation"), spec.get("width"), spec.get("rate"))


def _fabric(data: Any, source: str):
    """The `Cluster` a serialized cluster topology carries under ``fabric`` (None when it has none)."""
    if data is None:
        return None
    from dataclasses import fields

    from meshscale.topology.fabric import Cluster, NetLink

    def number(value, integer: bool = False) -> bool:
        return (isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
                and 0 <= value < 1e12)

    try:
        values = {f.name: data[f.name] for f in fields(Cluster) if f.name in data}
        net = NetLink(**data["net"])
        values["net"], values["switches"] = net, tuple(data["switches"])
        whole = [values[k] for k in ("nodes", "nics", "levels", "nodes_per_leaf", "radix") if k in values]
        whole += [*values["switches"], net.radix]
        real = [values[k] for k in ("latency_s", "oversubscription") if k in values]
        real += [net.bandwidth_bytes_per_s, net.nominal_gbits, net.switch_latency_s, net.system_latency_s,
                 net.whitepaper_encoding]
        texts = [values[k] for k in ("node", "link", "network", "placement") if k in values] + [net.name, net.kind]
        if not (all(number(v, True) for v in whole) and all(number(v) for v in real)
                and all(isinstance(t, str) for t in texts) and isinstance(values.get("gpudirect", True), bool)):
            raise ValueError
        return Cluster(**values)
    except (TypeError, KeyError, ValueError):
        raise _fail(source, "fabric", "is not a cluster's network", "write it as `to_dict` does, or leave it out") from None


def to_dict(topo: Topology) -> dict[str, Any]:
    """The full model as plain data (every node and link expanded, bandwidth explicit): `from_dict` inverts it."""
    return {
        "schema": SCHEMA,
        "name": topo.name,
        "title": topo.title,
        "gpu_count": len(topo.gpus()),
        "attrs": topo.attrs,
        "nodes": [{"name": n.name, "kind": n.kind, **n.attrs} for n in topo.nodes.values()],
        "links": [
            {k: v for k, v in vars(l).items() if v is not None}
            for l in topo.links
        ],
        **({"fabric": asdict(topo.cluster)} if topo.cluster is not None else {}),
    }


def load(path: str | Path) -> Topology:
    """Load a system file (.yaml, .yml or .json)."""
    path = Path(path)
    try:  # libyaml when present: 7x faster, and the catalog is read on every discovery and CLI call
        data = load_structured(path, "system file", yaml_ok=True)
    except TopologyError:
        raise
    except MeshscaleError as exc:
        raise TopologyError(str(exc)) from None
    data = data.get("topology", data) if isinstance(data, dict) and "topology" in data and "nodes" not in data else data
    return from_dict(data, str(path))


def dumps(topo: Topology) -> str:
    return json.dumps(to_dict(topo), indent=2)


def require_devices(topology: Topology) -> Topology:
    """The topology, if it has a GPU (or worker) to run a collective or a model on; a one-line error if not
    (a system of CPUs and switches alone can still be drawn and listed)."""
    if not topology.devices():
        raise TopologyError(f"{topology.name}: nodes: no gpu node; describe at least one "
                            "{name: gpu0, kind: gpu, index: 0}")
    return topology

