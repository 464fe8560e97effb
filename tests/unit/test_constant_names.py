"""Names that once meant different things in different modules (MAX_NODES 1,000,000 and 100,000; MODES and
PRECISIONS with different members) are each bound at module level in at most one module; each package names its
own set for what it is (TRAIN_MODES, PREDICTED_MODES, STEP_PRECISIONS, ...)."""
import ast
from collections import defaultdict
from pathlib import Path

import meshscale

SRC = Path(meshscale.__file__).parent
ONCE = ("MAX_NODES", "MODES", "PRECISIONS")


def _bindings() -> dict[str, list[str]]:
    """Each name of ONCE -> the modules (relative to src/meshscale) that assign it at module level."""
    where = defaultdict(list)
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC)
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in ONCE:
                    where[target.id].append(str(module))
    return where


def test_each_name_is_bound_in_one_module():
    assert not {name: modules for name, modules in _bindings().items() if len(modules) > 1}


def test_the_schema_and_the_cluster_share_one_node_bound():
    from meshscale.topology import limits, schema
    assert _bindings()["MAX_NODES"] == ["topology/limits.py"] and schema.MAX_NODES is limits.MAX_NODES
