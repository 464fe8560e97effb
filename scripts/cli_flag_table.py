"""Print the flag table of every meshscale command (Markdown), the body of docs/cli.md after its introduction.
Run: PYTHONPATH=src python scripts/cli_flag_table.py"""
from __future__ import annotations

import typer.main

from meshscale.cli import app


def commands(cmd, path: list[str]):
    """(words after `meshscale`, command) of every command, sub-apps walked, in name order."""
    if hasattr(cmd, "commands"):
        for name in sorted(cmd.commands):
            yield from commands(cmd.commands[name], path + [name])
    else:
        yield path, cmd


def flag_table() -> str:
    lines = []
    for path, cmd in commands(typer.main.get_command(app), []):
        lines += [f"### `meshscale {' '.join(path)}`", "", " ".join((cmd.help or "").split("\n\n")[0].split()), "",
                  "| flag | meaning |", "|---|---|"]
        for p in cmd.params:
            if p.name == "help":
                continue
            text = " ".join((getattr(p, "help", "") or "").split()).replace("|", "/")
            if getattr(p, "param_type_name", "") == "argument":
                lines.append(f"| `{p.name.upper()}` (argument) | {text} |")
            else:
                lines.append(f"| {', '.join(f'`{o}`' for o in [*p.opts, *p.secondary_opts])} | {text} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(flag_table())
