"""`meshscale why-hung DIR`: which collective a hung job's ranks are in, which ranks never entered it, and the
last sequence number each rank completed, from PyTorch's Flight Recorder dumps (one file per rank) and NCCL's
`NCCL_DEBUG=INFO` log lines.

The dump format is PyTorch's (torch/csrc/distributed/c10d/FlightRecorder*, read by
torch/distributed/flight_recorder): a pickled dict {"version": "2.x", "pg_config": {group: {"name", "desc",
"ranks"}}, "pg_status": ..., "entries": [...]}, each entry a collective or p2p call with its process group,
`collective_seq_id` (the n-th collective of that group on this rank), `profiling_name` ("nccl:all_reduce"),
input sizes and `state` (scheduled, started, completed). The file name ends in the rank
(TORCH_FR_DUMP_TEMP_FILE + rank, by default /tmp/nccl_trace_rank_N); `_dump_fr_trace_json` writes the same dict
as JSON, read too. NCCL marks entries started/completed; Gloo records every entry as scheduled, so for Gloo
the last completed collective is unknown and the ranks' progress is told by the collectives they entered.

A rank whose last entered collective of a group is behind the others' never entered the one they wait in:
it is the rank to look at (it is stuck elsewhere, skipped the call, or died). Where every rank entered it, the
one not yet completed on some rank, or a call that differs between ranks at the same sequence number
(another op or other sizes: a mismatch), is named instead."""
from __future__ import annotations

import io
import json
import pickle
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from meshscale.errors import MeshscaleError
from meshscale.units import is_digits

SUPPORTED_MAJOR = 2  # dump format versions 2.x carry collective_seq_id and pg_config (older ones do not)
NEEDED_KEYS = ("version", "pg_config", "entries")
NEEDED_ENTRY_KEYS = ("collective_seq_id", "profiling_name", "process_group", "state")
_RANK_SUFFIX = re.compile(r"(\d+)(\.json)?$")
_NCCL_LINE = re.compile(r"^(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL (?P<level>INFO|WARN) (?P<text>.*)$")
_NCCL_INIT = re.compile(r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) .*Init COMPLETE")


@dataclass
class Call:
    """One collective a rank entered, from its dump."""

    seq: int
    op: str
    sizes: list
    state: str


@dataclass
class RankProgress:
    """Where one rank is in one process group."""

    rank: int
    file: str
    last_entered: Call | None
    last_completed_seq: int | None  # None: the backend records no completion (Gloo)


@dataclass
class GroupHang:
    """One process group's verdict."""

    group: str
    ranks: list[int]
    progress: list[RankProgress]
    front: Call | None            # the furthest collective any rank entered
    waiting: list[int]            # ranks inside it
    behind: list[int]             # ranks that never entered it
    not_completed: list[int]      # ranks that entered it and have not completed it (where completion is known)
    no_dump: list[int]            # ranks of the group with no dump file
    mismatch: str = ""            # the first sequence number where the ranks' calls differ


@dataclass
class NcclLog:
    """What NCCL's INFO/WARN lines say: communicators whose ranks did not all finish init, and the warnings."""

    files: list[str]
    incomplete_init: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class HangReport:
    groups: list[GroupHang]
    nccl: NcclLog | None
    completion_known: bool

    def lines(self) -> list[str]:
        """The verdict, one finding a line."""
        out = []
        for g in self.groups:
            out += _group_lines(g, self.completion_known)
        if self.nccl:
            out += [f"NCCL: {line}" for line in self.nccl.incomplete_init + self.nccl.warnings]
            if not (self.nccl.incomplete_init or self.nccl.warnings):
                out.append(f"NCCL: every communicator in {', '.join(self.nccl.files)} finished init; no WARN line")
        return out


class _DumpUnpickler(pickle.Unpickler):
    """Plain data only: a Flight Recorder dump holds dicts, lists, strings and numbers, never objects."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"it refers to {module}.{name}, which no Flight Recorder dump does")


def read_dump(path: Path) -> dict:
    """One rank's dump (pickle or JSON), checked for the keys why-hung reads; MeshscaleError naming the file."""
    raw = path.read_bytes()
    try:
        dump = json.loads(raw) if raw[:1] in (b"{", b"[") else _DumpUnpickler(io.BytesIO(raw)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, UnicodeDecodeError) as exc:
        raise MeshscaleError(f"{path}: truncated or not a Flight Recorder dump ({type(exc).__name__}: {exc})") from None
    if not isinstance(dump, dict):
        raise MeshscaleError(f"{path}: not a Flight Recorder dump (a {type(dump).__name__}, not a dict)")
    missing = [k for k in NEEDED_KEYS if k not in dump]
    if missing:
        raise MeshscaleError(f"{path}: missing {', '.join(missing)}: not a Flight Recorder dump of a torch this "
                             "reader knows (format 2.x)")
    version = str(dump["version"])
    if not is_digits(version.split(".")[0]) or int(version.split(".")[0]) != SUPPORTED_MAJOR:
        raise MeshscaleError(f"{path}: Flight Recorder format {version}; why-hung reads format {SUPPORTED_MAJOR}.x "
                             "(torch 2.5 and later)")
    for entry in dump["entries"]:
        gone = [k for k in NEEDED_ENTRY_KEYS if k not in entry]
        if gone:
            raise MeshscaleError(f"{path}: an entry lacks {', '.join(gone)} (format {version} from another torch?)")
    return dump


def find_dumps(directory: Path) -> dict[int, Path]:
    """{rank: dump file} of DIR: files whose names end in the rank (nccl_trace_rank_3, trace_3.json)."""
    if not directory.is_dir():
        raise MeshscaleError(f"{directory}: not a directory")
    found: dict[int, Path] = {}
    for path in sorted(directory.iterdir()):
        match = _RANK_SUFFIX.search(path.name)
        if path.is_file() and match and not path.name.endswith((".log", ".txt")):
            rank = int(match.group(1))
            if rank in found:
                raise MeshscaleError(f"{directory}: two dumps for rank {rank} ({found[rank].name}, {path.name}); "
                                     "keep one run's dumps per directory")
            found[rank] = path
    if not found:
        raise MeshscaleError(f"{directory}: no Flight Recorder dump (one file per rank, named PREFIX<rank>, e.g. "
                             "nccl_trace_rank_0: set TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
                             "TORCH_FR_DUMP_TEMP_FILE=DIR/nccl_trace_rank_)")
    return found


def _group_of(entry: dict) -> tuple[str, str]:
    """(name as pg_config keys it, label for the reader) of an entry's process group."""
    group = entry["process_group"]
    name, desc = (str(group[0]), str(group[1])) if isinstance(group, (list, tuple)) and len(group) > 1 else (str(group), "")
    return name, f"{name} ({desc})" if desc else name


def _group_ranks(dump: dict, name: str) -> list[int]:
    """The ranks of process group ``name`` as the dump's pg_config lists them ([] where it does not)."""
    config = dump["pg_config"].get(name) or next(
        (c for c in dump["pg_config"].values() if isinstance(c, dict) and c.get("name") == name), {})
    ranks = config.get("ranks", "[]") if isinstance(config, dict) else "[]"
    try:
        return sorted(int(r) for r in (json.loads(ranks) if isinstance(ranks, str) else ranks))
    except (ValueError, TypeError):
        return []


def explain(dumps: dict[int, dict], files: dict[int, Path], nccl: NcclLog | None = None) -> HangReport:
    """The verdict of every process group seen in the dumps."""
    calls: dict[str, dict[int, list[Call]]] = defaultdict(lambda: defaultdict(list))
    members: dict[str, set[int]] = defaultdict(set)
    completion_known = False
    for rank, dump in dumps.items():
        for entry in dump["entries"]:
            if entry.get("is_p2p"):
                continue
            name, key = _group_of(entry)
            calls[key][rank].append(Call(int(entry["collective_seq_id"]), str(entry["profiling_name"]),
                                         entry.get("input_sizes", []), str(entry["state"])))
            completion_known |= entry["state"] in ("started", "completed")
            # the default group spans every rank, also one that dumped no collective (Gloo's pg_config keys it "")
            members[key] |= set(_group_ranks(dump, name)) | {rank} | (set(dumps) if key.endswith("(default_pg)") else set())
    groups = [_judge(key, sorted(members[key]), calls[key], files, completion_known) for key in sorted(calls)]
    return HangReport(groups, nccl, completion_known)


def _judge(group: str, ranks: list[int], calls: dict[int, list[Call]], files: dict[int, Path],
           completion_known: bool) -> GroupHang:
    progress = []
    for rank in ranks:
        mine = sorted(calls.get(rank, []), key=lambda c: c.seq)
        done = [c.seq for c in mine if c.state == "completed"]
        progress.append(RankProgress(rank, files[rank].name if rank in files else "", mine[-1] if mine else None,
                                     (max(done) if done else 0) if completion_known else None))
    seen = [p for p in progress if p.rank in files]
    front_seq = max((p.last_entered.seq for p in seen if p.last_entered), default=0)
    front = next((p.last_entered for p in seen if p.last_entered and p.last_entered.seq == front_seq), None)
    waiting = [p.rank for p in seen if p.last_entered and p.last_entered.seq == front_seq]
    behind = [p.rank for p in seen if p.rank not in waiting]
    not_completed = [p.rank for p in seen if p.rank in waiting and completion_known
                     and (p.last_completed_seq or 0) < front_seq]
    return GroupHang(group, ranks, progress, front, waiting, behind, not_completed,
                     [r for r in ranks if r not in files], _mismatch(calls))


def _mismatch(calls: dict[int, list[Call]]) -> str:
    """The first sequence number at which two ranks called different collectives or sizes ("" if none)."""
    by_seq: dict[int, dict[int, Call]] = defaultdict(dict)
    for rank, mine in calls.items():
        for c in mine:
            by_seq[c.seq][rank] = c
    for seq in sorted(by_seq):
        seen = by_seq[seq]
        kinds = {(c.op, json.dumps(c.sizes)) for c in seen.values()}
        if len(kinds) > 1:
            said = "; ".join(f"rank {r} {c.op} sizes {c.sizes}" for r, c in sorted(seen.items()))
            return f"collective #{seq} differs between ranks: {said}"
    return ""


def _call_text(c: Call) -> str:
    return f"#{c.seq} {c.op} (sizes {c.sizes})"


def _group_lines(g: GroupHang, completion_known: bool) -> list[str]:
    head = f"process group {g.group}, ranks {g.ranks}"
    if g.front is None:
        return [f"{head}: no collective recorded"]
    out = []
    if g.behind:
        detail = "; ".join(f"rank {p.rank} last entered {_call_text(p.last_entered) if p.last_entered else 'nothing'}"
                           for p in g.progress if p.rank in g.behind)
        out.append(f"{head}: ranks {g.waiting} wait in {_call_text(g.front)}; rank(s) {g.behind} never entered it "
                   f"({detail}): look at what rank(s) {g.behind} do instead (a skipped call, a hang elsewhere, a crash)")
    elif g.not_completed:
        out.append(f"{head}: every rank entered {_call_text(g.front)}; not completed on ranks {g.not_completed}")
    else:
        out.append(f"{head}: every rank entered {_call_text(g.front)}"
                   + ("" if completion_known else " (the backend records no completion: Gloo)"))
    if g.no_dump:
        out.append(f"{head}: no dump from ranks {g.no_dump} (they may have died or never dumped): suspect them first")
    if g.mismatch:
        out.append(f"{head}: mismatch: {g.mismatch}")
    done = ", ".join(f"rank {p.rank} #{p.last_completed_seq}" for p in g.progress if p.last_completed_seq is not None)
    if done:
        out.append(f"{head}: last completed: {done}")
    return out


def read_nccl_logs(paths: list[Path]) -> NcclLog | None:
    """NCCL_DEBUG=INFO output: communicators whose ranks did not all print Init COMPLETE, and every WARN line."""
    if not paths:
        return None
    inits: dict[str, tuple[int, set[int]]] = {}
    warnings = []
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError as exc:
            raise MeshscaleError(f"{path}: cannot read the NCCL log ({exc.strerror})") from None
        for line in text.splitlines():
            m = _NCCL_LINE.match(line.strip())
            if not m:
                continue
            if m["level"] == "WARN":
                warnings.append(f"WARN on {m['host']} pid {m['pid']} GPU {m['dev']}: {m['text']}")
            init = _NCCL_INIT.search(m["text"])
            if init:
                nranks, done = inits.get(init["comm"], (int(init["nranks"]), set()))
                done.add(int(init["rank"]))
                inits[init["comm"]] = (nranks, done)
    incomplete = [f"communicator {comm}: ranks {sorted(set(range(n)) - done)} never printed Init COMPLETE "
                  f"({len(done)} of {n} did)" for comm, (n, done) in inits.items() if len(done) < n]
    return NcclLog([p.name for p in paths], incomplete, warnings)


def nccl_logs_in(directory: Path) -> list[Path]:
    """Text files of DIR (*.log, *.txt) that hold NCCL lines."""
    return [p for p in sorted(directory.iterdir()) if p.is_file() and p.suffix in (".log", ".txt")
            and " NCCL " in p.read_text(errors="replace")]


def why_hung(directory: Path, nccl_logs: list[Path] | None = None) -> HangReport:
    """Read DIR's dumps (and NCCL logs: those given, else DIR's *.log/*.txt) and explain the hang."""
    files = find_dumps(directory)
    dumps = {rank: read_dump(path) for rank, path in files.items()}
    logs = nccl_logs if nccl_logs else nccl_logs_in(directory)
    return explain(dumps, files, read_nccl_logs(logs))
