"""The system file format as users meet it: the JSON Schema (`systems --schema`) agrees with the loader on every
catalog file and on broken ones, every `--template` loads back to its catalog system, and a bad field is one
line naming the field, its place in the file and the rule."""
import json
import re

import pytest
import yaml

from meshscale.topology import load_system, system_names, to_dict
from meshscale.topology.json_schema import system_schema
from meshscale.topology.schema import _LINK_KEYS, _TOP_KEYS, NODE_ATTR_CHECKS
from meshscale.topology.text import relation_matrix

TYPES = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float), "null": type(None)}


def _errors(value, schema, where="$"):
    """The subset of JSON Schema the system schema uses, checked independently of meshscale's loader."""
    out = []
    if "const" in schema and value != schema["const"]:
        out.append(where)
    if "enum" in schema and value not in schema["enum"]:
        out.append(where)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if isinstance(value, bool) or not any(isinstance(value, TYPES[t]) for t in types):
            return out + [where]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"] or "maximum" in schema and value > schema["maximum"]:
            out.append(where)
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            out.append(where)
    if isinstance(value, dict):
        out += [f"{where}.{k}" for k in schema.get("required", []) if k not in value]
        for key, item in value.items():
            if key in schema.get("properties", {}):
                out += _errors(item, schema["properties"][key], f"{where}.{key}")
            elif schema.get("additionalProperties") is False:
                out.append(f"{where}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                out += _errors(item, schema["additionalProperties"], f"{where}.{key}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            out.append(where)
        for i, item in enumerate(value):
            out += _errors(item, schema.get("items", {}), f"{where}[{i}]")
    return out


def test_the_schema_names_every_field_the_loader_reads():
    schema = system_schema()
    assert set(schema["properties"]) == _TOP_KEYS
    link = schema["properties"]["links"]["items"]["properties"]
    assert set(link) == _LINK_KEYS
    assert set(NODE_ATTR_CHECKS) <= set(schema["properties"]["nodes"]["items"]["properties"])
    assert all(prop.get("description") for prop in [*schema["properties"].values(), *link.values()])


@pytest.mark.parametrize("name", system_names())
def test_every_catalog_file_and_its_json_pass_the_schema(name):
    from importlib import resources
    from meshscale.topology.shipped import system_file_name
    raw = yaml.safe_load((resources.files("meshscale.topology") / "systems" / system_file_name(name)).read_text())
    schema = system_schema()
    assert _errors(raw, schema) == []
    assert _errors(json.loads(json.dumps(to_dict(load_system(name)))), schema) == []


BROKEN = [({"links": [{"a": "gpu0", "b": "gpu0", "kind": "nvlink", "count": 2, "speed": 5}]}, "links[0]", "speed"),
          ({"links": [{"a": "gpu0", "b": "gpu0", "kind": "warp"}]}, "links[0]", "kind"),
          ({"links": [{"a": "gpu0", "b": "gpu0", "kind": "nvlink", "count": 0}]}, "links[0]", "count"),
          ({"nodes": [{"name": "gpu0", "kind": "gpu", "index": -3}]}, "nodes[0]", "index"),
          ({"colour": "red"}, "top level", "colour")]


@pytest.mark.parametrize("change, entry, field", BROKEN)
def test_a_file_failing_the_schema_is_one_line_naming_the_field_and_the_rule(cli, tmp_path, change, entry, field):
    data = {"name": "bad", "nodes": [{"name": "gpu0", "kind": "gpu", "index": 0}], "links": [], **change}
    assert _errors(data, system_schema())  # the schema refuses it too
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    run = cli("topo", "--system", str(path))
    assert run.exit_code == 2
    assert re.fullmatch(r"meshscale: error: [^\n]+\n", run.stderr), run.stderr
    assert str(path) in run.stderr and entry in run.stderr and field in run.stderr


@pytest.mark.parametrize("name", system_names())
def test_every_template_loads_back_to_its_catalog_system(cli, tmp_path, name):
    run = cli("systems", "--template", name)
    assert run.exit_code == 0, run.output
    path = tmp_path / "mine.yaml"
    path.write_text(run.stdout)
    mine = load_system(str(path))
    assert mine.name == f"my-{name}"
    assert relation_matrix(mine) == relation_matrix(load_system(name))


def test_schema_prints_as_json(cli):
    run = cli("systems", "--schema")
    assert run.exit_code == 0 and json.loads(run.stdout) == system_schema()
    assert cli("systems", "--schema", "--template", "dgx2").exit_code == 2
