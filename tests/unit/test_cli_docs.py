"""docs/cli.md's flag table is the commands' own: regenerated, it is what the file holds."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_flag_table_in_docs_cli_md_matches_every_command():
    spec = importlib.util.spec_from_file_location("cli_flag_table", ROOT / "scripts" / "cli_flag_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.flag_table()
    assert table.strip() in (ROOT / "docs" / "cli.md").read_text(), \
        "docs/cli.md is out of date: PYTHONPATH=src python scripts/cli_flag_table.py"
