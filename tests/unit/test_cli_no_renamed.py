"""Guard: the CLI keeps no table of old spellings (a `RENAMED` of a release that never shipped was removed). An
option a command does not have gets the parser's usage error, like any other typo."""
import ast
import sys
from pathlib import Path

import pytest

from meshscale import cli

CLI = Path(cli.__file__).parent


def _option_keyed_dicts(tree: ast.Module):
    """Module-level names bound to a dict literal keyed by tuples that hold an option spelling ("-x", "--xy")."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        if not isinstance(value, ast.Dict):
            continue
        for key in value.keys:
            words = [e.value for e in getattr(key, "elts", []) if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if any(w.startswith("-") for w in words):
                yield from (ast.unparse(t) for t in targets)
                break


@pytest.mark.parametrize("path", sorted(CLI.glob("*.py")), ids=lambda p: p.name)
def test_no_table_of_old_spellings(path):
    tree = ast.parse(path.read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        t for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef)) for t in [n.name]}
    assert not {n for n in names if "renamed" in n.lower()}, f"{path.name}: a table of renamed options is back"
    assert not list(_option_keyed_dicts(tree)), f"{path.name}: a dict keyed by (command, option) is back"


def test_main_leaves_the_command_line_to_the_parser():
    source = ast.get_source_segment(Path(cli.__file__).read_text(),
                                    next(n for n in ast.parse(Path(cli.__file__).read_text()).body
                                         if isinstance(n, ast.FunctionDef) and n.name == "main"))
    assert "argv" not in source


def test_an_unknown_option_is_the_parsers_usage_error(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["meshscale", "topo", "-f", "svg"])
    with pytest.raises(SystemExit) as info:
        cli.main()
    out = capsys.readouterr()
    assert info.value.code == 2 and out.out == ""
    assert "No such option: -f" in out.err
