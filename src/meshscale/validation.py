"""Checks of every input before any work starts: numbers, types, text files and output paths.

Each checker takes the value and ``where`` (the file and field, or the option, as the user would name it) and
raises `MeshscaleError` with one line naming it; it returns the value it accepted. The same checkers serve system
files, result files and command-line options, so a NaN is refused the same way wherever it comes from.
"""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from meshscale.errors import MeshscaleError
from meshscale.safe_io import read_text
from meshscale.units import is_digits

MAX_NESTING = 32            # the deepest a system or result file legitimately nests is about 5
MAX_CPU_RANKS_PER_CORE = 8
MAX_CPU_RANKS = 256

Check = Callable[[Any, str], Any]


def max_cpu_ranks() -> int:
    """CPU worker ranks one machine may start: a few per core, never more than `MAX_CPU_RANKS`."""
    return min(MAX_CPU_RANKS, MAX_CPU_RANKS_PER_CORE * (os.cpu_count() or 1))


# ---- numbers and types ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Range:
    """A finite number (an integer if ``integer``) in [lo, hi]; ``lo_open`` makes the low end exclusive."""

    lo: float | None = None
    hi: float | None = None
    integer: bool = False
    lo_open: bool = False
    optional: bool = False  # None passes (an option left at its default)

    def __call__(self, value: Any, where: str) -> Any:
        if value is None and self.optional:
            return None
        return number(value, where, self.lo, self.hi, integer=self.integer, lo_open=self.lo_open)

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        low = "" if self.lo is None else f"{'>' if self.lo_open else '>='} {_bound(self.lo)}"
        high = "" if self.hi is None else f"<= {_bound(self.hi)}"
        return f"{kind} {' and '.join(x for x in (low, high) if x)}".strip()


def _bound(x: float) -> str:
    """A range's end as a reader types it: whole numbers in full (16777216, not 1.67772e+07)."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e18 else f"{x:g}"


def number(value: Any, where: str, lo: float | None = None, hi: float | None = None, *, integer: bool = False,
           lo_open: bool = False) -> float | int:
    """``value`` if it is a finite number (an int if ``integer``) within [lo, hi] (lo excluded if ``lo_open``)."""
    want = Range(lo, hi, integer, lo_open).describe()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MeshscaleError(f"{where}: {_show(value)} is not a number; give {want}")
    if integer and isinstance(value, float):
        if not (math.isfinite(value) and value == int(value)):
            raise MeshscaleError(f"{where}: {_show(value)} is not a whole number; give {want}")
        value = int(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise MeshscaleError(f"{where}: {_show(value)} is not finite; give {want}")
    too_low = lo is not None and (value <= lo if lo_open else value < lo)
    if too_low or (hi is not None and value > hi):
        raise MeshscaleError(f"{where}: {_show(value)} is out of range; give {want}")
    return value


def typed(value: Any, where: str, types: tuple[type, ...], what: str) -> Any:
    """``value`` if it is one of ``types`` (true/false counts as a bool only, not as a number); else one line
    saying ``what`` was expected."""
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise MeshscaleError(f"{where}: expected {what}, got {_kind(value)}")
    return value


def mapping(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise MeshscaleError(f"{where}: expected a mapping (key: value), got {_kind(value)}")
    return value


def sequence(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise MeshscaleError(f"{where}: expected a list, got {_kind(value)}")
    return value


def text(value: Any, where: str, max_chars: int = 4096) -> str:
    if not isinstance(value, str) or not value.strip():
        raise MeshscaleError(f"{where}: expected a non-empty string, got {_kind(value)}")
    if len(value) > max_chars or "\n" in value or "\x00" in value:
        raise MeshscaleError(f"{where}: expected one short line of text")
    return value


def word(value: Any, where: str) -> str:
    """A name typed as one word: not empty, no spaces around it, printable (a profile, a share, a name)."""
    if not isinstance(value, str) or not value or value != value.strip() or not value.isprintable() \
            or len(value) > 200:
        raise MeshscaleError(f"{where}: {_show(value)} is not a name; give it without spaces around it, e.g. 3g.40gb")
    return value


def count_list(text_value: Any, where: str, lo: int = 1, hi: int | None = None) -> list[int]:
    """A comma-separated list of distinct whole counts such as ``1,2,4`` (a sweep: no value twice)."""
    parts = [p.strip() for p in str(text_value).split(",")]
    if not text_value or not all(is_digits(p.removeprefix("+")) for p in parts):
        raise MeshscaleError(f"{where}: {_show(text_value)} is not a comma-separated list of whole numbers, e.g. 1,2,4")
    values = [number(int(p), where, lo, hi, integer=True) for p in parts]
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise MeshscaleError(f"{where}: repeats {', '.join(map(str, twice))}; list each value once")
    return values


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"a {type(value).__name__} ({_show(value)})"


def _show(value: Any) -> str:
    """``value`` as a short quote: bounded however long or deep it is (reprlib), and an integer too long for
    Python to write as text (over 4,300 digits) said so instead of raising."""
    import reprlib
    try:
        shown = reprlib.repr(value)
    except ValueError:
        shown = "an integer of thousands of digits"
    return shown if len(shown) <= 40 else shown[:37] + "..."


# ---- files in -------------------------------------------------------------------------------------------

def load_structured(path: str | Path, what: str = "file", yaml_ok: bool = False) -> Any:
    """Parse ``path`` as JSON (or YAML when ``yaml_ok`` and the suffix is not .json), refusing unreadable or
    non-UTF-8 text, syntax errors and too deep nesting. The values (NaN tokens included) are the caller's to check."""
    path = Path(path)
    source = read_text(path, what)
    as_json = not yaml_ok or path.suffix.lower() == ".json"
    try:
        if as_json:
            data = json.loads(source)
        else:
            import yaml
            data = yaml.load(source, Loader=yaml_loader())
    except RecursionError:
        raise MeshscaleError(f"{path}: nested too deeply for a {what} (at most {MAX_NESTING} levels)") from None
    except json.JSONDecodeError as exc:
        raise MeshscaleError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except Exception as exc:  # yaml.YAMLError and the odd ValueError of a constructor (a bad date, say)
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise MeshscaleError(f"{path}: not valid {'JSON' if as_json else 'YAML'} ({first})") from None
    check_nesting(data, str(path))
    return data


_YAML_LOADER: list = []
# YAML 1.1 (PyYAML) reads 25e9 and 1e-6 as strings (its floats need a dot and a signed exponent); YAML 1.2 and
# JSON read them as numbers, as a person writing a bandwidth means them
_EXPONENT_FLOAT = r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"


def yaml_loader():
    """PyYAML's safe loader (the C one where built), reading exponent numbers without a dot as floats."""
    if not _YAML_LOADER:
        import re

        import yaml

        class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            pass

        Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_EXPONENT_FLOAT), list("-+0123456789."))
        _YAML_LOADER.append(Loader)
    return _YAML_LOADER[0]


def check_nesting(data: Any, where: str, limit: int = MAX_NESTING) -> None:
    """Refuse containers nested deeper than ``limit`` (without recursion; shared YAML aliases counted once)."""
    seen: set[int] = set()
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if not isinstance(value, (dict, list)) or id(value) in seen:
            continue
        if depth > limit:
            raise MeshscaleError(f"{where}: nested too deeply (more than {limit} levels)")
        seen.add(id(value))
        children: Iterable = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children)
