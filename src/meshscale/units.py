"""Parsing and formatting of sizes and rates. Decimal GB/s for bandwidth (as nccl-tests prints), binary K/M/G for sizes."""
from __future__ import annotations

import re

from meshscale.errors import MeshscaleError

_SIZE_SUFFIX = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)

GB = 1e9  # bandwidths are decimal GB/s, as nvidia-smi and nccl-tests report them
# ASCII digits only, and fewer than the 4,300 int() reads by default (sys.get_int_max_str_digits)
_DIGITS = re.compile(r"[0-9]{1,4000}")


def is_digits(text) -> bool:
    """True for a string of ASCII digits 0-9 that int() reads: the gate before int(). ``str.isdigit()`` is none:
    it takes '²' (and int() raises on it), and no limit on length. A sign is the caller's to strip
    (``text.removeprefix("-")``: one sign, never several)."""
    return isinstance(text, str) and _DIGITS.fullmatch(text) is not None


def parse_bytes(text: str | int) -> int:
    """Parse a size such as ``8``, ``1K``, ``64M``, ``1G`` or ``1GiB`` (binary multiples) into bytes."""
    if isinstance(text, int):
        if text < 0:
            raise MeshscaleError(f"size must not be negative: {text}")
        return text
    match = _SIZE_RE.match(str(text))
    if not match:
        raise MeshscaleError(f"cannot read size {text!r}: use a number with an optional K, M, G or T suffix (e.g. 64M)")
    number, suffix = match.groups()
    return int(float(number) * _SIZE_SUFFIX[suffix.upper()])


def format_bytes(n: float) -> str:
    """Short binary size: 1024 -> '1K', 3 << 20 -> '3M'; non-round values get one decimal."""
    for suffix, factor in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= factor:
            value = n / factor
            return f"{value:.0f}{suffix}" if value == int(value) else f"{value:.1f}{suffix}"
    return f"{int(n)}B"


def format_count(n: float) -> str:
    """Short decimal number: 1000 -> '1K', 2.5e6 -> '2.5M', 100 -> '100', 0.01 -> '0.01' (plain text, for
    axis ticks)."""
    for suffix, factor in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= factor:
            return f"{n / factor:.3g}{suffix}"
    return f"{n:.3g}"


def format_rate(per_s: float, what: str = "bytes") -> str:
    """A rate with its unit. Bytes in decimal units, as disks, NICs and nccl-tests quote them (262.4e6 ->
    '262.4 MB/s', 2e9 -> '2.0 GB/s'); anything else counted whole: format_rate(1234.5, "samples") -> '1,234
    samples/s'."""
    if what != "bytes":
        return f"{per_s:,.0f} {what}/s"
    for suffix, factor in (("TB/s", 1e12), ("GB/s", GB), ("MB/s", 1e6), ("kB/s", 1e3)):
        if per_s >= factor:
            return f"{per_s / factor:.1f} {suffix}"
    return f"{per_s:.0f} B/s"


def gbps(bytes_per_s: float) -> float:
    """Bytes per second to decimal GB/s."""
    return bytes_per_s / GB


def parse_ints(text: str, what: str, minimum: int | None = None) -> list[int]:
    """A comma-separated list of integers such as ``1,2,4`` (``what`` names the option in the error)."""
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise MeshscaleError(f"{what} must be a comma-separated list of integers, e.g. 1,2,4; got {text!r}") from None
    if not values:
        raise MeshscaleError(f"{what} is empty; give integers such as 1,2,4")
    if minimum is not None and min(values) < minimum:
        raise MeshscaleError(f"{what} needs integers >= {minimum}, got {text!r}")
    return values


def sweep_sizes(min_bytes: str | int, max_bytes: str | int, factor: int = 2, step_bytes: str | int | None = None) -> list[int]:
    """min, min*factor, ... up to max (inclusive), as nccl-tests' -b/-e/-f, or min, min+step, ... with
    ``step_bytes`` (its -i); sizes as `parse_bytes` reads them."""
    lo, hi = parse_bytes(min_bytes), parse_bytes(max_bytes)
    if lo < 1:
        raise MeshscaleError(f"--min-bytes {min_bytes} makes no sweep: use at least 1 byte")
    if hi < lo:
        raise MeshscaleError(f"--max-bytes {max_bytes} is smaller than --min-bytes {min_bytes}, which makes no sweep; swap them")
    if step_bytes is not None:
        step = parse_bytes(step_bytes)
        if step < 1:
            raise MeshscaleError(f"--step-bytes {step_bytes} makes no sweep: use at least 1 byte")
        if (hi - lo) // step >= 10_000:
            raise MeshscaleError(f"--step-bytes {step_bytes} makes {(hi - lo) // step + 1} sizes; use a larger step")
        return list(range(lo, hi + 1, step))
    if factor < 2:
        raise MeshscaleError(f"--factor {factor} makes no sweep: use 2 or more")
    sizes = [lo]
    while sizes[-1] * factor <= hi:
        sizes.append(sizes[-1] * factor)
    return sizes
