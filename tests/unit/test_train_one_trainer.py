"""One trainer: the data-parallel modes and the parallel layouts run the same step, checkpoint and summary code,
and train's modules import each other without a cycle (function-level imports included)."""
import ast
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[2] / "src" / "meshscale" / "train"


def _module(path: Path) -> str:
    parts = path.relative_to(TRAIN.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _trees() -> dict[str, ast.Module]:
    return {_module(p): ast.parse(p.read_text()) for p in TRAIN.rglob("*.py")}


def test_the_step_checkpoint_and_summary_are_written_once():
    defined: dict[str, list[str]] = {}
    for name, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                defined.setdefault(node.name, []).append(name)
    for function in ("forward_backward", "train_step", "run_step", "save_checkpoint", "restore", "train_worker"):
        assert len(defined.get(function, [])) == 1, (function, defined.get(function))
    assert "meshscale.train.parallel.worker" not in _trees()  # the layout worker and its trainer are gone


def test_train_has_no_import_cycle():
    trees = _trees()
    graph = {name: set() for name in trees}
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in trees:
                graph[name].add(node.module)
                graph[name].update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in trees)
    graph = {name: deps - {name} for name, deps in graph.items()}
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join(path[path.index(name):] + (name,))
        if name not in done:
            for dep in graph[name]:
                visit(dep, path + (name,))
            done.add(name)
    for name in graph:
        visit(name, ())
