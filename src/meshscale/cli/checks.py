"""Range and path checks of command-line options, run by typer while it parses the command line, so a bad
value ends the command (one line, exit 2) before any work starts. An option declares its check once:
``typer.Option(5, "--iters", callback=checked(COUNT))``.
"""
from __future__ import annotations

import re
from typing import Any, Callable

import typer

from meshscale.errors import MeshscaleError
from meshscale.units import parse_bytes
from meshscale.safe_io import check_output_dir, check_output_file
from meshscale.validation import Check, Range, count_list, max_cpu_ranks, number

MAX_ITERS = 1_000_000          # iterations of a benchmark loop
MAX_BATCH = 1 << 16            # samples per rank in one step
MAX_GLOBAL_BATCH = 1 << 24
MAX_GPU_RANKS = 1 << 16        # a count of GPUs anywhere (a machine's own count is checked against it later)
MAX_SIZE_BYTES = 1 << 40       # one message of a sweep
MAX_TIMEOUT_S = 7 * 86400

COUNT = Range(1, MAX_ITERS, integer=True)
COUNT_OR_ZERO = Range(0, MAX_ITERS, integer=True)
GPU_COUNT = Range(1, MAX_GPU_RANKS, integer=True, optional=True)
CPU_COUNT = Range(1, max_cpu_ranks(), integer=True, optional=True)
BATCH = Range(1, MAX_BATCH, integer=True, optional=True)
GLOBAL_BATCH = Range(1, MAX_GLOBAL_BATCH, integer=True, optional=True)
TIMEOUT_S = Range(0, MAX_TIMEOUT_S, lo_open=True)
FACTOR = Range(2, 1 << 20, integer=True)
ROOT = Range(0, MAX_GPU_RANKS, integer=True)


def size_bytes(value: Any, where: str) -> Any:
    """A size such as 64M, between 1 byte and `MAX_SIZE_BYTES`."""
    try:
        number(parse_bytes(value), where, 1, MAX_SIZE_BYTES, integer=True)
    except MeshscaleError as exc:
        message = str(exc)
        raise MeshscaleError(message if message.startswith(where) else f"{where}: {message}") from None
    return value


def counts(lo: int = 1, hi: int = MAX_GPU_RANKS) -> Check:
    """A sweep's list of distinct counts, e.g. 1,2,4."""
    return lambda value, where: count_list(value, where, lo, hi)


def cpu_counts() -> Check:
    return counts(1, max_cpu_ranks())


def output_file(suffixes: tuple[str, ...] | None = None, plot: bool = False) -> Check:
    """A file the command will write (``plot``: a chart, so one of the plotting module's suffixes)."""
    def check(value: Any, where: str) -> Any:
        allowed = suffixes
        if plot:
            from meshscale.plots import SUFFIXES
            allowed = SUFFIXES
        return check_output_file(value, where, allowed)
    return check


def output_dir(value: Any, where: str) -> Any:
    return check_output_dir(value, where)


def checked(check: Check) -> Callable:
    """A typer callback that runs ``check(value, "--flag")`` on the parsed value (None, an option not given,
    passes) and hands the value on unchanged."""
    def callback(param: typer.CallbackParam, value: Any) -> Any:
        if value is not None:
            check(value, max(param.opts, key=len) if param.opts else param.name)
        return value
    return callback


def nccl_settings(value: Any, where: str) -> Any:
    """``--nccl-env KEY=VALUE`` (repeatable): NCCL's environment, every key and value checked."""
    from meshscale.simulate.nccl_env import parse_nccl_env

    parse_nccl_env(list(value))
    return value


NCCL_ENV_OPTION = typer.Option(
    None, "--nccl-env", callback=checked(nccl_settings),
    help="NCCL's environment as KEY=VALUE (repeatable, or several joined by commas): NCCL_MAX_NCHANNELS, "
         "NCCL_MIN_NCHANNELS, NCCL_P2P_DISABLE, NCCL_P2P_LEVEL, NCCL_SHM_DISABLE, NCCL_NET, NCCL_IB_DISABLE, "
         "NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD, NCCL_ALGO, NCCL_PROTO, NCCL_NVLS_ENABLE")


# ---- numbers as typed ------------------------------------------------------------------------------------------
# The text of a number option, read strictly: ASCII digits with one optional sign (and for a real a point and an
# exponent). Python's int() and float() -- and the parsers built on them -- also take ' 2' (spaces), '1_000', and
# other scripts' digits ('٢'); a value that only those readings make a number is refused in one line.
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,32}")
_REAL_TEXT = re.compile(r"[+-]?(?:[0-9]{1,64}(?:\.[0-9]{0,64})?|\.[0-9]{1,64})(?:[eE][+-]?[0-9]{1,4})?")


def _number_kind(annotation: Any) -> type | None:
    """int or float when the parameter takes numbers (alone, optional, or a list of them)."""
    from typing import get_args, get_origin

    if annotation in (int, float):
        return annotation
    if get_origin(annotation) is not None:
        kinds = {_number_kind(a) for a in get_args(annotation) if a is not type(None)}
        return next(iter(kinds)) if len(kinds) == 1 else None
    return None


def _check_number_text(value: Any, kind: type, where: str) -> None:
    for item in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(item, str) and not (_INT_TEXT if kind is int else _REAL_TEXT).fullmatch(item):
            want = "a whole number (digits 0-9, an optional sign)" if kind is int else "a number such as 2.5 or 1e-3"
            raise MeshscaleError(f"{where}: {item[:40]!r} is not {want}")


def strict_numbers(command: Any) -> Any:
    """``command`` (a click command or group, as typer builds it) with every number option and argument of it
    and of its subcommands read by `_check_number_text` before typer converts it."""
    for param in getattr(command, "params", []):
        descriptor = getattr(param, "type_descriptor", None)
        kind = _number_kind(getattr(descriptor, "annotation", None))
        if kind is None:
            continue
        where = max(param.opts, key=len) if getattr(param, "opts", None) else param.name

        def process_value(ctx: Any, value: Any, _original=param.process_value, _kind=kind, _where=where) -> Any:
            _check_number_text(value, _kind, _where)
            return _original(ctx, value)

        param.process_value = process_value
    for sub in getattr(command, "commands", {}).values():
        strict_numbers(sub)
    return command
