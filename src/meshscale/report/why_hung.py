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

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from meshscale.errors import MeshscaleError, one_line
from meshscale.report.fr_dump import MAX_RANKS, Dump, read_dump
from meshscale.safe_io import read_bytes

# NCCL_DEBUG=INFO prints a few hundred lines (tens of kB) per rank at init: a 1,024-rank job's log is tens of MB.
MAX_LOG_BYTES = 64 << 20       # one log
MAX_LOGS_BYTES = 256 << 20     # all logs together
MAX_LOG_FILES = 16_384         # one log per rank of a 16k-GPU job
MAX_NCCL_LINES = 1 << 20       # lines naming NCCL, all logs together: a few hundred per rank
MAX_LINE_CHARS = 4096          # an NCCL line is under 1 kB; the rest of a longer line is not read
MAX_COMMUNICATORS = 1 << 16    # communicators in the logs: one per process group and rank set
MAX_WARNINGS = 50              # WARN lines shown (then their count)
_MARK = b" NCCL "
_RANK_SUFFIX = re.compile(r"(\d{1,7})(\.json)?$")
_NCCL_LINE = re.compile(r"^(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL (?P<level>INFO|WARN) (?P<text>.*)$")
_NCCL_INIT = re.compile(r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>[0-9]{1,12}) "
                        r"nranks (?P<nranks>[0-9]{1,12}) .*Init COMPLETE")


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
        """The verdict, one finding a line; text from the files (names, ops, NCCL lines) with control characters
        escaped, so that none reaches the terminal."""
        out = []
        for g in self.groups:
            out += _group_lines(g, self.completion_known)
        if self.nccl:
            out += [f"NCCL: {line}" for line in self.nccl.incomplete_init + self.nccl.warnings]
            if not (self.nccl.incomplete_init or self.nccl.warnings):
                out.append(f"NCCL: every communicator in {', '.join(self.nccl.files)} finished init; no WARN line")
        return [one_line(line) for line in out]


def find_dumps(directory: Path) -> dict[int, Path]:
    """{rank: dump file} of DIR: files whose names end in the rank (nccl_trace_rank_3, trace_3.json)."""
    if not directory.is_dir():
        raise MeshscaleError(f"{directory}: not a directory")
    found: dict[int, Path] = {}
    entries = []
    for entry in directory.iterdir():  # counted as listed: a folder of millions of files is refused, not sorted
        entries.append(entry)
        if len(entries) > MAX_RANKS + MAX_LOG_FILES:
            raise MeshscaleError(f"{one_line(str(directory))}: more than {MAX_RANKS + MAX_LOG_FILES:,} files; give "
                                 "the folder of one job's dumps")
    for path in sorted(entries):
        match = _RANK_SUFFIX.search(path.name)
        if path.is_file() and match and not path.name.endswith((".log", ".txt")):
            rank = int(match.group(1))
            if rank >= MAX_RANKS:
                raise MeshscaleError(f"{one_line(path.name)}: rank {rank} in the file name; ranks are below "
                                     f"{MAX_RANKS}")
            if rank in found:
                raise MeshscaleError(f"{directory}: two dumps for rank {rank} ({found[rank].name}, {path.name}); "
                                     "keep one run's dumps per directory")
            found[rank] = path
    if not found:
        raise MeshscaleError(f"{directory}: no Flight Recorder dump (one file per rank, named PREFIX<rank>, e.g. "
                             "nccl_trace_rank_0: set TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
                             "TORCH_FR_DUMP_TEMP_FILE=DIR/nccl_trace_rank_)")
    return found


def explain(dumps: dict[int, Dump], files: dict[int, Path], nccl: NcclLog | None = None) -> HangReport:
    """The verdict of every process group seen in the dumps."""
    calls: dict[str, dict[int, list[Call]]] = defaultdict(lambda: defaultdict(list))
    members: dict[str, set[int]] = defaultdict(set)
    completion_known = False
    for rank, dump in dumps.items():
        for entry in dump.entries:
            if entry.p2p:
                continue
            key = f"{entry.group} ({entry.group_desc})" if entry.group_desc else entry.group
            calls[key][rank].append(Call(entry.seq, entry.op, entry.sizes, entry.state))
            completion_known |= entry.state in ("started", "completed")
            # the default group spans every rank, also one that dumped no collective (Gloo's pg_config keys it "")
            members[key] |= (set(dump.group_ranks.get(entry.group, [])) | {rank}
                             | (set(dumps) if entry.group_desc == "default_pg" else set()))
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
    """NCCL_DEBUG=INFO output: communicators whose ranks did not all print Init COMPLETE, and the WARN lines
    (the first `MAX_WARNINGS`, then their count). Read by `nccl_lines` within its limits."""
    if not paths:
        return None
    inits: dict[str, tuple[int, set[int]]] = {}
    warnings, more = [], 0
    for path, line in nccl_lines(paths):
        m = _NCCL_LINE.match(line)
        if not m:
            continue
        if m["level"] == "WARN":
            if len(warnings) < MAX_WARNINGS:
                warnings.append(f"WARN on {m['host']} pid {m['pid']} GPU {m['dev']}: {m['text']}")
            else:
                more += 1
        init = _NCCL_INIT.search(m["text"])
        if init:
            if init["comm"] not in inits and len(inits) >= MAX_COMMUNICATORS:
                raise MeshscaleError(f"{one_line(str(path))}: more than {MAX_COMMUNICATORS:,} communicators; a job "
                                     f"has one per process group and rank set")
            count = _rank_count(init, path)
            nranks, done = inits.get(init["comm"], (count, set()))
            if count != nranks:
                raise MeshscaleError(f"{one_line(str(path))}: communicator {init['comm']} said to have both "
                                     f"{nranks} and {count} ranks")
            done.add(int(init["rank"]))
            inits[init["comm"]] = (nranks, done)
    incomplete = [f"communicator {comm}: ranks {ranks_text(_missing(n, done))} never printed Init COMPLETE "
                  f"({len(done)} of {n} did)" for comm, (n, done) in inits.items() if len(done) < n]
    if more:
        warnings.append(f"{more:,} more WARN lines (the first {MAX_WARNINGS} are shown)")
    return NcclLog([p.name for p in paths], incomplete, warnings)


def _missing(n: int, done: set[int]) -> list[tuple[int, int]]:
    """The ranks below ``n`` not in ``done``, as (first, last) runs, in time of ``done`` (not of ``n``)."""
    runs, start = [], 0
    for rank in sorted(done):
        if rank > start:
            runs.append((start, rank - 1))
        start = rank + 1
    if start < n:
        runs.append((start, n - 1))
    return runs


def ranks_text(runs: list[tuple[int, int]], most: int = 8) -> str:
    """Runs of ranks as ``0, 2-4, 7``, at most ``most`` runs and then how many more."""
    shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:most])
    return shown + (f" and {len(runs) - most:,} more runs" if len(runs) > most else "")


def nccl_lines(paths: list[Path]):
    """(path, line) of every line naming NCCL in ``paths``, each line at most `MAX_LINE_CHARS`: the files are
    regular files within `MAX_LOG_BYTES` each and `MAX_LOGS_BYTES` together (checked before reading), their NCCL
    lines counted before any is parsed (at most `MAX_NCCL_LINES`); lines are found by a byte search, so a file
    of anything else costs no per-line work."""
    if len(paths) > MAX_LOG_FILES:
        raise MeshscaleError(f"{len(paths):,} NCCL logs; give at most {MAX_LOG_FILES:,}")
    total, found = 0, 0
    for path in paths:
        data = read_bytes(path, "NCCL log", MAX_LOG_BYTES)
        total += len(data)
        found += data.count(_MARK)
        if total > MAX_LOGS_BYTES or found > MAX_NCCL_LINES:
            raise MeshscaleError(f"{one_line(str(path))}: NCCL logs of more than {MAX_LOGS_BYTES >> 20} MiB or "
                                 f"{MAX_NCCL_LINES:,} NCCL lines together; give the logs of the hung job's ranks")
        start = 0
        while (at := data.find(_MARK, start)) >= 0:
            line_start = max(start, data.rfind(b"\n", start, at) + 1)
            line_end = data.find(b"\n", at)
            line_end = len(data) if line_end < 0 else line_end
            yield path, data[line_start:min(line_end, line_start + MAX_LINE_CHARS)].decode("utf-8", "replace").strip()
            start = line_end + 1


def _rank_count(init: re.Match, path: Path) -> int:
    """The communicator's rank count an Init COMPLETE line announces, checked before any work grows with it."""
    nranks, rank = int(init["nranks"]), int(init["rank"])
    if not 0 < nranks <= MAX_RANKS or rank >= nranks:
        raise MeshscaleError(f"{one_line(str(path))}: an Init COMPLETE line of rank {rank} of {nranks} ranks; a "
                             f"communicator has 1 to {MAX_RANKS} ranks, each below the count")
    return nranks


def nccl_logs_in(directory: Path) -> list[Path]:
    """Text files of DIR (*.log, *.txt) that hold NCCL lines (at most `MAX_LOG_FILES` looked at)."""
    candidates = []
    for p in sorted(directory.iterdir()):
        if p.suffix in (".log", ".txt") and p.is_file():
            candidates.append(p)
            if len(candidates) > MAX_LOG_FILES:
                raise MeshscaleError(f"{one_line(str(directory))}: more than {MAX_LOG_FILES:,} *.log and *.txt files; "
                                     "give the NCCL logs with --nccl-log")
    return [p for p in candidates if any(True for _ in nccl_lines([p]))]


def why_hung(directory: Path, nccl_logs: list[Path] | None = None) -> HangReport:
    """Read DIR's dumps (and NCCL logs: those given, else DIR's *.log/*.txt) and explain the hang."""
    files = find_dumps(directory)
    dumps = {rank: read_dump(path) for rank, path in files.items()}
    logs = nccl_logs if nccl_logs else nccl_logs_in(directory)
    return explain(dumps, files, read_nccl_logs(logs))
