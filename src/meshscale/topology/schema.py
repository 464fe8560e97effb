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
import re
from pathlib import Path
from typing import Any

import yaml

from meshscale.errors import TopologyError
from meshscale.topology import links as calc
from meshscale.topology.model import DEFAULT_LATENCY_S, LINK_KINDS, NODE_KINDS, Link, Node, Topology

SCHEMA = "meshscale-topology/1"
_LINK_KEYS = {"a", "b", "kind", "count", "generation", "width", "rate", "bandwidth_bytes_per_s",
              "bandwidth_gb_per_s", "latency_s"}
_TOP_KEYS = {"schema", "name", "title", "gpu_count", "defaults", "nodes", "links", "attrs"}


def _fail(source: str, entry: str, problem: str, fix: str) -> TopologyError:
    return TopologyError(f"{source}: {entry}: {problem}; {fix}")


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
            gbits = float(re.sub(r"[^0-9.]", "", str(spec["rate"])) or 0)
            return calc.ethernet_bandwidth(gbits) * count
    except KeyError as missing:
        raise _fail(source, entry, f"{kind} link lacks {missing.args[0]!r}",
                    f"add {missing.args[0]}: ... or set bandwidth_gb_per_s") from None
    except TopologyError:
        raise
    except Exception as exc:  # MeshscaleError from a calculator, or a value that is not a number
        raise _fail(source, entry, str(exc), "correct the value") from None
    raise _fail(source, entry, f"{kind} link has no bandwidth", "set bandwidth_gb_per_s (GB/s per direction)")


def from_dict(data: Any, source: str = "<dict>") -> Topology:
    """Build and validate a `Topology` from parsed YAML/JSON; errors name ``source`` and the entry."""
    if not isinstance(data, dict):
        raise _fail(source, "top level", "is not a mapping", "start the file with 'name: ...', 'nodes:' and 'links:'")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise _fail(source, "top level", f"unknown key(s) {sorted(unknown)}", f"use only {sorted(_TOP_KEYS)}")
    name = data.get("name")
    if not name or not isinstance(name, str):
        raise _fail(source, "name", "missing", "add 'name: my-system'")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise _fail(source, "defaults", "is not a mapping", "write defaults as 'defaults: {gpu: {...}, nvlink: {...}}'")

    nodes: dict[str, Node] = {}
    for i, entry in enumerate(data.get("nodes") or []):
        where = f"nodes[{i}]"
        if not isinstance(entry, dict) or "name" not in entry or "kind" not in entry:
            raise _fail(source, where, "needs a name and a kind", "write it as {name: gpu0, kind: gpu, index: 0}")
        where = f"nodes[{i}] ({entry['name']})"
        if entry["kind"] not in NODE_KINDS:
            raise _fail(source, where, f"unknown node kind {entry['kind']!r}", f"use one of {', '.join(NODE_KINDS)}")
        if entry["name"] in nodes:
            raise _fail(source, where, f"duplicate node name {entry['name']!r}", "give every node a unique name")
        attrs = {**(defaults.get(entry["kind"]) or {}), **{k: v for k, v in entry.items() if k not in ("name", "kind")}}
        nodes[entry["name"]] = Node(str(entry["name"]), entry["kind"], attrs)

    links: list[Link] = []
    for i, entry in enumerate(data.get("links") or []):
        where = f"links[{i}]"
        if not isinstance(entry, dict) or not {"a", "b", "kind"} <= set(entry):
            raise _fail(source, where, "needs a, b and kind", "write it as {a: gpu0, b: gpu1, kind: nvlink, count: 1}")
        where = f"links[{i}] ({entry['a']} - {entry['b']})"
        if entry["kind"] not in LINK_KINDS:
            raise _fail(source, where, f"unknown link kind {entry['kind']!r}", f"use one of {', '.join(LINK_KINDS)}")
        spec = {**(defaults.get(entry["kind"]) or {}), **entry}
        unknown = set(spec) - _LINK_KEYS
        if unknown:
            raise _fail(source, where, f"unknown key(s) {sorted(unknown)}", f"use only {sorted(_LINK_KEYS)}")
        for end in ("a", "b"):
            if spec[end] not in nodes:
                raise _fail(source, where, f"links to missing node {spec[end]!r}", f"define {spec[end]!r} under nodes or fix the name")
        bandwidth = _link_bandwidth(spec, source, where)
        if not bandwidth > 0:
            raise _fail(source, where, f"bandwidth {bandwidth:g} B/s is not positive", "give a positive bandwidth")
        latency = float(spec.get("latency_s", DEFAULT_LATENCY_S[spec["kind"]]))
        if latency < 0:
            raise _fail(source, where, f"latency {latency:g} s is negative", "give latency_s >= 0")
        count = spec.get("count", 1)
        if not isinstance(count, int) or count < 1:
            raise _fail(source, where, f"count {count!r} is not a positive integer", "set count: 1 or more")
        links.append(Link(spec["a"], spec["b"], spec["kind"], bandwidth, latency, count,
                          spec.get("generation"), spec.get("width"), spec.get("rate")))

    gpus = [n for n in nodes.values() if n.kind == "gpu"]
    if "gpu_count" in data and data["gpu_count"] != len(gpus):
        raise _fail(source, "gpu_count", f"says {data['gpu_count']} but {len(gpus)} gpu nodes are defined",
                    "make gpu_count match the gpu entries under nodes")
    try:
        return Topology(name, nodes, links, str(data.get("title", "")), dict(data.get("attrs") or {}))
    except TopologyError as exc:
        raise TopologyError(f"{source}: {exc}") from None


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
    }


def load(path: str | Path) -> Topology:
    """Load a system file (.yaml, .yml or .json)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TopologyError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        # libyaml when present: 7x faster, and the catalog is read on every discovery and CLI call
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        first = str(exc).splitlines()[0]
        raise TopologyError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'} ({first})") from None
    data = data.get("topology", data) if isinstance(data, dict) and "topology" in data and "nodes" not in data else data
    return from_dict(data, str(path))


def dumps(topo: Topology) -> str:
    return json.dumps(to_dict(topo), indent=2)
