"""The one reader of PyTorch Flight Recorder dumps: every field why-hung uses checked for type and range, one
line naming the file and field otherwise.

A dump is JSON (`_dump_fr_trace_json`) or a pickle (`_dump_fr_trace`, the dump on timeout). A pickle is never
unpickled: its opcodes are parsed (pickletools) and only those that build plain data (dicts, lists, tuples,
strings, numbers, None, booleans) are followed, so no class is looked up and no code can run. Sizes are bounded
before reading (safe_io), nesting and opcode counts while reading."""
from __future__ import annotations

import json
import pickletools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshscale.errors import MeshscaleError
from meshscale.safe_io import read_bytes
from meshscale.validation import check_nesting, mapping, number, sequence, text

SUPPORTED_MAJOR = 2  # dump format versions 2.x carry collective_seq_id and pg_config (older ones do not)
MAX_DUMP_BYTES = 64 << 20      # a dump of the default 2,000 entries with their stack frames is a few MB
MAX_PICKLE_OPS = 8_000_000     # such a dump is ~200,000 opcodes; 8M parse in a few seconds
MAX_NESTING = 16               # a dump nests 5 levels (dump, entries, entry, input_sizes, one tensor's sizes)
MAX_ENTRIES = 1_000_000        # Flight Recorder's ring buffer (TORCH_FR_BUFFER_SIZE) is 2,000 by default
MAX_RANKS = 1 << 20            # beyond the largest jobs run (about 100,000 GPUs)
MAX_SEQ = (1 << 64) - 1        # the C++ counter is 64-bit
MAX_SIZES = 4096               # tensors a call takes, and dimensions of one (torch allows 64)
MAX_NAME_CHARS = 1024
STATES = ("scheduled", "started", "completed")
NEEDED_KEYS = ("version", "pg_config", "entries")
NEEDED_ENTRY_KEYS = ("collective_seq_id", "profiling_name", "process_group", "state")
_VERSION = re.compile(r"([0-9]{1,4})\.[0-9]{1,4}")


@dataclass
class Entry:
    """One collective or p2p call a rank recorded."""

    seq: int
    op: str
    sizes: list[list[int]]
    state: str
    group: str          # the process group's name, as pg_config keys it
    group_desc: str     # its description ("default_pg"), or ""
    p2p: bool


@dataclass
class Dump:
    """One rank's dump: its format version, each group's ranks (as pg_config lists them) and its entries."""

    version: str
    group_ranks: dict[str, list[int]]   # by group name, and by pg_config key where that differs
    entries: list[Entry]


def read_dump(path: Path) -> Dump:
    """One rank's dump (JSON or a pickle of plain data), every field why-hung reads checked."""
    raw = read_bytes(path, "Flight Recorder dump", MAX_DUMP_BYTES)
    data = _parse(raw, str(path))
    check_nesting(data, str(path), MAX_NESTING)
    dump = mapping(data, f"{path}")
    missing = [k for k in NEEDED_KEYS if k not in dump]
    if missing:
        raise MeshscaleError(f"{path}: missing {', '.join(missing)}: not a Flight Recorder dump of a torch this "
                             "reader knows (format 2.x)")
    version = dump["version"]
    match = _VERSION.fullmatch(version) if isinstance(version, str) else None
    if not match or int(match.group(1)) != SUPPORTED_MAJOR:
        shown = version if match else repr(version)[:40]
        raise MeshscaleError(f"{path}: version: Flight Recorder format {shown}; why-hung reads format "
                             f"{SUPPORTED_MAJOR}.x (torch 2.5 and later)")
    entries = sequence(dump["entries"], f"{path}: entries")
    if len(entries) > MAX_ENTRIES:
        raise MeshscaleError(f"{path}: entries: {len(entries)} entries; at most {MAX_ENTRIES} are read")
    return Dump(version, _group_ranks(dump["pg_config"], f"{path}: pg_config"),
                [_entry(e, f"{path}: entries[{i}]", version) for i, e in enumerate(entries)])


def _parse(raw: bytes, where: str) -> Any:
    if raw.lstrip()[:1] in (b"{", b"["):
        try:
            return json.loads(raw, parse_constant=lambda name: _refuse_constant(name, where))
        except RecursionError:
            raise MeshscaleError(f"{where}: nested too deeply (more than {MAX_NESTING} levels)") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise MeshscaleError(f"{where}: truncated or not a Flight Recorder dump (not valid JSON: "
                                 f"{str(exc)[:80]})") from None
    try:
        return _pickle_data(raw, where)
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise MeshscaleError(f"{where}: truncated or not a Flight Recorder dump ({type(exc).__name__}: "
                             f"{str(exc)[:80]})") from None


def _refuse_constant(name: str, where: str) -> None:
    raise MeshscaleError(f"{where}: {name} in the JSON, which no Flight Recorder dump holds (numbers are finite)")


_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_DICT": dict, "EMPTY_LIST": list,
              "EMPTY_TUPLE": tuple}
_VALUES = {"BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG", "BINFLOAT", "FLOAT", "BINUNICODE",
           "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE"}
_TUPLES = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}


def _pickle_data(raw: bytes, where: str) -> Any:
    """The plain data a pickle describes, built from its opcodes without unpickling (no class, no call)."""
    stack: list = []
    marks: list[int] = []
    memo: dict = {}
    for count, (op, arg, _pos) in enumerate(pickletools.genops(raw)):
        name = op.name
        if count >= MAX_PICKLE_OPS:
            raise MeshscaleError(f"{where}: more than {MAX_PICKLE_OPS} pickle opcodes; not a Flight Recorder dump")
        if name in ("PROTO", "FRAME"):
            continue
        if name in _CONSTANTS:
            value = _CONSTANTS[name]
            stack.append(value() if isinstance(value, type) else value)
        elif name in _VALUES:
            stack.append(arg)
        elif name == "MARK":
            marks.append(len(stack))
        elif name in ("TUPLE", "LIST", "DICT", "APPENDS", "SETITEMS"):
            start = marks.pop()
            items, stack[start:] = stack[start:], []
            _collect(stack, name, items)
        elif name in _TUPLES:
            n = _TUPLES[name]
            items, stack[len(stack) - n:] = stack[len(stack) - n:], []
            stack.append(tuple(items))
        elif name == "APPEND":
            stack[-2].append(stack.pop())
        elif name == "SETITEM":
            value, key = stack.pop(), stack.pop()
            stack[-1][key] = value
        elif name in ("MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"):
            memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1]
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            stack.append(memo[arg])
        elif name == "STOP":
            return stack.pop()
        else:
            raise MeshscaleError(f"{where}: a pickle with opcode {name}, which no Flight Recorder dump holds "
                                 "(plain data only: nothing is loaded)")
    raise ValueError("no STOP opcode")


def _collect(stack: list, name: str, items: list) -> None:
    """Apply a MARK-delimited opcode to the items above the mark."""
    if name == "TUPLE":
        stack.append(tuple(items))
    elif name == "LIST":
        stack.append(items)
    elif name == "APPENDS":
        stack[-1].extend(items)
    else:
        target = {} if name == "DICT" else stack[-1]
        if len(items) % 2:
            raise ValueError(f"{name} with an odd number of items")
        target.update(zip(items[::2], items[1::2]))
        if name == "DICT":
            stack.append(target)


def _group_ranks(config: Any, where: str) -> dict[str, list[int]]:
    """{group name (and pg_config key): its ranks} from pg_config ({key: {"name", "desc", "ranks": "[0, 1]"}})."""
    out: dict[str, list[int]] = {}
    for key, group in mapping(config, where).items():
        at = f"{where}[{str(key)[:40]!r}]"
        key = _name(key, f"{at} (its key)", empty_ok=True)
        group = mapping(group, at)
        ranks = group.get("ranks", [])
        if isinstance(ranks, str):
            if len(ranks) > 16 * MAX_RANKS:
                raise MeshscaleError(f"{at}.ranks: longer than a list of {MAX_RANKS} ranks")
            try:
                ranks = json.loads(ranks, parse_constant=lambda name: _refuse_constant(name, f"{at}.ranks"))
            except (ValueError, RecursionError):
                raise MeshscaleError(f"{at}.ranks: {ranks[:40]!r} is not a list of ranks") from None
        ranks = sequence(ranks, f"{at}.ranks")
        if len(ranks) > MAX_RANKS:
            raise MeshscaleError(f"{at}.ranks: {len(ranks)} ranks; at most {MAX_RANKS}")
        ranks = sorted(number(r, f"{at}.ranks", 0, MAX_RANKS - 1, integer=True) for r in ranks)
        out[key] = ranks
        out.setdefault(_name(group.get("name", key), f"{at}.name", empty_ok=True), ranks)
    return out


def _name(value: Any, where: str, empty_ok: bool = False) -> str:
    """A short one-line string (a group's name, an op): escaped when printed, bounded here."""
    if empty_ok and value == "":
        return value
    return text(value, where, MAX_NAME_CHARS)


def _entry(entry: Any, where: str, version: str) -> Entry:
    entry = mapping(entry, where)
    gone = [k for k in NEEDED_ENTRY_KEYS if k not in entry]
    if gone:
        raise MeshscaleError(f"{where}: lacks {', '.join(gone)} (format {version} from another torch?)")
    state = entry["state"]
    if state not in STATES:
        raise MeshscaleError(f"{where}.state: {str(state)[:40]!r} is not one of {', '.join(STATES)}")
    group = entry["process_group"]
    if isinstance(group, (list, tuple)) and len(group) == 2:
        name, desc = (_name(g, f"{where}.process_group", empty_ok=True) for g in group)
    else:
        name, desc = _name(group, f"{where}.process_group", empty_ok=True), ""
    p2p = entry.get("is_p2p", False)
    if not isinstance(p2p, bool):
        raise MeshscaleError(f"{where}.is_p2p: expected true or false, got {str(p2p)[:40]!r}")
    return Entry(number(entry["collective_seq_id"], f"{where}.collective_seq_id", 0, MAX_SEQ, integer=True),
                 _name(entry["profiling_name"], f"{where}.profiling_name"),
                 _sizes(entry.get("input_sizes", []), f"{where}.input_sizes"), state, name, desc, p2p)


def _sizes(value: Any, where: str) -> list[list[int]]:
    """input_sizes: a list of tensors' shapes, each a list of whole dimensions."""
    shapes = sequence(value, where)
    if len(shapes) > MAX_SIZES:
        raise MeshscaleError(f"{where}: {len(shapes)} tensors; at most {MAX_SIZES}")
    out = []
    for i, shape in enumerate(shapes):
        dims = sequence(list(shape) if isinstance(shape, tuple) else shape, f"{where}[{i}]")
        if len(dims) > MAX_SIZES:
            raise MeshscaleError(f"{where}[{i}]: {len(dims)} dimensions; at most {MAX_SIZES}")
        out.append([number(d, f"{where}[{i}]", 0, MAX_SEQ, integer=True) for d in dims])
    return out

