"""The system file format as a JSON Schema (`meshscale systems --schema`) and an annotated file to start from
(`meshscale systems --template NAME`). Both are made from the checks `schema.from_dict` applies, so the
schema, the template's notes and the validator cannot drift apart; docs/systems.md explains the same fields."""
from __future__ import annotations

from typing import Any

from meshscale.topology.model import LINK_KINDS, NODE_KINDS
from meshscale.topology.schema import _LINK_NUMBERS, NODE_ATTR_CHECKS, SCHEMA
from meshscale.validation import Range

# what each field means, with its unit (the schema's descriptions and the template's header)
TOP_FIELDS = {
    "schema": f"format tag, {SCHEMA!r} (optional)",
    "name": "short name of the system, one line (required)",
    "title": "free text shown by `topo` and `systems`",
    "gpu_count": "number of gpu nodes, checked against the nodes (optional)",
    "attrs": "free data about the whole system (year, memory_bytes, ...)",
    "defaults": "per node kind or link kind, fields merged into every node / link of that kind",
    "nodes": "devices and the parts between them: gpus, cpus, PCIe and NVLink switches, NICs",
    "links": "one entry per connection (a bundle of `count` parallel links)",
    "fabric": "the network joining a cluster's nodes (node type, node count, ports, sizing, latency), as meshscale "
              "writes it out for a cluster; describe a cluster by a cluster file instead (docs/systems.md)",
}
NODE_FIELDS = {
    "name": "unique name, referred to by links (gpu0, cpu0, pcie1, nvswitch0)",
    "kind": f"one of {', '.join(NODE_KINDS)}",
    "index": "GPU number as nvidia-smi counts it (gpu nodes)",
    "numa": "NUMA node of the device (the CPU socket it hangs off)",
    "model": "GPU or CPU model as nvidia-smi names it (the GPU model table fills FLOP/s and memory from it)",
    "memory_bytes": "device memory, bytes",
    "memory_bandwidth_bytes_per_s": "device memory bandwidth, bytes per second",
    "fp32_flops": "peak FP32 FLOP/s (likewise fp64_flops, tf32_flops, bf16_flops, fp16_flops, fp8_flops, fp4_flops)",
    "sm_count": "streaming multiprocessors of a GPU",
    "nvlinks": "NVLink links of a GPU (0 for a PCIe card)",
    "pcie_relation": "a CPU's nvidia-smi relation for GPUs under it: PHB (one host bridge) or NODE (several)",
    "latency_s": "per-hop latency through this node, seconds",
    "radix": "ports of a switch",
    "pos": "[x, y] place in diagrams",
}
LINK_FIELDS = {
    "a": "name of one end (a node)",
    "b": "name of the other end",
    "kind": f"one of {', '.join(LINK_KINDS)}",
    "count": "parallel links in the bundle (NVLink bonds: 1-18)",
    "generation": "NVLink generation (1-5) or PCIe generation (1-6): sets the bandwidth per link",
    "width": "PCIe lanes (1-32) or InfiniBand lanes (default 4)",
    "rate": "InfiniBand rate (edr, hdr, ndr) or Ethernet rate (10gbe, 100gbe, 400gbe)",
    "bandwidth_gb_per_s": "stated bandwidth per direction, GB/s (overrides the kind's calculation)",
    "bandwidth_bytes_per_s": "the same in bytes per second",
    "latency_s": "one-hop latency, seconds (default per kind)",
}


def _number(check: Range, description: str) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "integer" if check.integer else "number", "description": description}
    if check.lo is not None:
        out["exclusiveMinimum" if check.lo_open else "minimum"] = check.lo
    if check.hi is not None:
        out["maximum"] = check.hi
    return out


def system_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a system file, YAML or JSON."""
    node_props: dict[str, Any] = {"name": {"type": ["string", "integer"], "description": NODE_FIELDS["name"]},
                                  "kind": {"enum": list(NODE_KINDS), "description": NODE_FIELDS["kind"]},
                                  "model": {"type": "string", "description": NODE_FIELDS["model"]},
                                  "pos": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2,
                                          "description": NODE_FIELDS["pos"]}}
    for key, check in NODE_ATTR_CHECKS.items():
        node_props[key] = _number(check, NODE_FIELDS.get(key, key.replace("_", " ")))
    link_props: dict[str, Any] = {"a": {"type": ["string", "integer"], "description": LINK_FIELDS["a"]},
                                  "b": {"type": ["string", "integer"], "description": LINK_FIELDS["b"]},
                                  "kind": {"enum": list(LINK_KINDS), "description": LINK_FIELDS["kind"]},
                                  "rate": {"type": ["string", "number"], "description": LINK_FIELDS["rate"]}}
    for key, check in _LINK_NUMBERS.items():
        link_props[key] = _number(check, LINK_FIELDS[key])
    link = {"type": "object", "required": ["a", "b", "kind"], "properties": link_props, "additionalProperties": False}
    node = {"type": "object", "required": ["name", "kind"], "properties": node_props,
            "additionalProperties": {"description": "any other key is a free attribute of the node"}}
    top = {"schema": {"const": SCHEMA}, "name": {"type": "string", "minLength": 1, "maxLength": 200},
           "title": {"type": ["string", "null"]}, "gpu_count": {"type": "integer", "minimum": 0},
           "attrs": {"type": "object"},
           "defaults": {"type": "object", "additionalProperties": {"type": ["object", "null"]}},
           "nodes": {"type": "array", "minItems": 1, "items": node}, "links": {"type": "array", "items": link},
           "fabric": {"type": "object"}}
    for key, prop in top.items():
        prop["description"] = TOP_FIELDS[key]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA,
            "title": "meshscale system file",
            "description": "A machine as devices (nodes) and connections (links); bandwidth per direction. "
                           "See docs/systems.md.",
            "type": "object", "required": ["name", "nodes"], "properties": top, "additionalProperties": False}


def template(name: str) -> str:
    """The catalog file of ``name`` (its own comments kept) under a header that explains every field: a file
    to copy and edit. A one-line error for an unknown name."""
    from meshscale.errors import MeshscaleError
    from meshscale.topology.shipped import SYSTEMS, system_file_name, system_names
    if name not in system_names():
        raise MeshscaleError(f"--template {name!r}: not a catalog system; choose one of {', '.join(system_names())}")
    body = (SYSTEMS / system_file_name(name)).read_text()
    if system_file_name(name).endswith(".json"):  # JSON is YAML too: a file to save as .yaml and edit
        body = body.replace(f'"name": "{name}"', f'"name": "my-{name}"', 1)
    lines = [f"# A meshscale system file, from the catalog's {name}: edit it to describe your machine, then pass",
             "# it to any command as --system FILE.yaml. Bandwidth is per direction. Fields (docs/systems.md):"]
    for title, fields in (("top level", TOP_FIELDS), ("nodes[]", NODE_FIELDS), ("links[]", LINK_FIELDS)):
        lines.append(f"# {title}:")
        lines += [f"#   {key}: {text}" for key, text in fields.items()]
    lines.append("# Checked against `meshscale systems --schema` when loaded; an error names the entry and the rule.")
    return "\n".join(lines) + "\n\n" + body.replace(f"name: {name}\n", f"name: my-{name}\n", 1)
