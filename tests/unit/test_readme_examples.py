"""The README's console examples are real: each command runs again and prints what the README shows (a line
`...` ends a shown excerpt)."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
BLOCK = re.compile(r"```console\n\$ (meshscale [^\n]+)\n(.*?)```", re.S)


def examples():
    return BLOCK.findall((ROOT / "README.md").read_text())


def test_the_readme_has_examples_and_stays_short():
    assert len(examples()) >= 3
    assert len((ROOT / "README.md").read_text().splitlines()) <= 120


@pytest.mark.parametrize("command,shown", examples(), ids=lambda v: v[:60] if isinstance(v, str) else v)
def test_a_readme_example_prints_what_the_readme_shows(command, shown):
    env = {**os.environ, "COLUMNS": "110", "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run([sys.executable, "-m", *shlex.split(command)], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr[-400:]
    want = shown.rstrip("\n").split("\n")
    if want[-1] == "...":
        want = want[:-1]
        got = run.stdout.split("\n")[:len(want)]
    else:
        got = run.stdout.rstrip("\n").split("\n")
    assert [line.rstrip() for line in got] == [line.rstrip() for line in want]
