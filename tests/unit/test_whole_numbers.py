"""One gate before int() on text: ASCII digits only (`units.is_digits`). str.isdigit() takes '²', which int()
refuses, so it is no gate; the guard below keeps it (and its cousins) out of the source."""
import ast
from pathlib import Path

import pytest

import meshscale
from meshscale.units import is_digits

SRC = Path(meshscale.__file__).parent


@pytest.mark.parametrize("text", ["0", "7", "0042", "9" * 4000])
def test_ascii_digits_pass_and_int_reads_them(text):
    assert is_digits(text) and int(text) >= 0


@pytest.mark.parametrize("text", ["", "²", "①", "٣", "𝟙", "1²", " 1", "1\n", "-1", "+1", "1.0", "1_000", "9" * 5001,
                                  None, 3, b"12"])
def test_anything_else_is_refused(text):
    assert not is_digits(text)


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_no_unicode_digit_gates_in_the_source(path):
    calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr in ("isdigit", "isnumeric", "isdecimal")]
    assert not calls, f"{path.name}:{calls[0].lineno}: use meshscale.units.is_digits (ASCII digits) before int()"
