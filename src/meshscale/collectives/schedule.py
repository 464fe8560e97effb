"""The schedule: the one plain data model every algorithm produces and the simulator and executor consume.

A `Schedule` moves pieces (chunks) of one logical buffer between ranks in an ordered list of steps.

Ranks. ``ranks[i]`` is the device index (nvidia-smi number) in the topology of rank ``i``; transfers name ranks
by position ``i`` (0..n-1), never by device index. ``root`` is a rank position too (None when the collective has
no root).

Logical buffer and chunks. ``chunks`` partition the collective's logical buffer: ``chunks[i].id == i``, in offset
order, contiguous, covering it exactly. Every rank keeps a working copy of the logical buffer and a chunk sits at
the same ``offset_bytes`` on every rank. The buffer's units (the whole buffer, one segment per rank, or for
all_to_all one block per (sender s, receiver d) pair, chunk id ``s*n + d``), which units each rank's input and
output are, and so the initial and required states, are the collective's record in
`meshscale.collectives.kinds`. Chunk sizes are multiples of ``meta["elem_bytes"]`` (default 4) so that an
executor can use typed tensors, and chunks never straddle a unit.

Symbolic state. ``state[r][c]`` is the set of ranks whose contribution chunk c on rank r holds (empty: nothing
valid). Initially rank r holds ``{r}`` on the chunks of its input units. Required at the end: on the chunks of
rank r's output units, the set of ranks whose input holds that unit (every rank for a reduction, the one
source otherwise). Other (rank, chunk) pairs are free.

Steps. All transfers of a step read the state from before the step (an executor receives into temporaries and
applies them after the step). ``copy`` replaces ``state[dst][c]`` with ``state[src][c]``; ``reduce`` adds
``state[src][c]`` into it. A transfer must read valid data; a reduce must not count a contribution twice and
needs valid data at dst; two copies, or a copy and a reduce, to one (dst, chunk) in one step are a race.
Several reduces into one (dst, chunk) in one step add up. ``channel`` (0..channels-1) groups transfers that
belong to one ring / tree / connection; it carries no semantics for validation.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from meshscale.collectives.kinds import kind, schedulable
from meshscale.errors import MeshscaleError
from meshscale.units import format_bytes

OPS = ("copy", "reduce")
SCHEMA = "meshscale-schedule/1"
DEFAULT_ELEM_BYTES = 4


@dataclass
class Chunk:
    """A piece ``[offset_bytes, offset_bytes + nbytes)`` of the logical buffer."""

    id: int
    offset_bytes: int
    nbytes: int


@dataclass
class Transfer:
    """Rank ``src`` sends chunk ``chunk`` (``nbytes``, equal to the chunk's size) to rank ``dst``."""

    src: int
    dst: int
    chunk: int
    nbytes: int
    op: str = "copy"
    channel: int = 0


@dataclass
class Step:
    """Transfers that may all run at once; they read the state from before the step."""

    transfers: list[Transfer] = field(default_factory=list)


@dataclass
class Schedule:
    """A collective as chunks and steps of transfers; see the module docstring for the exact semantics."""

    collective: str
    algorithm: str
    ranks: list[int]
    nbytes: int
    chunks: list[Chunk]
    steps: list[Step]
    root: int | None = None
    channels: int = 1
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def elem_bytes(self) -> int:
        return int(self.meta.get("elem_bytes", DEFAULT_ELEM_BYTES))

    def transfers(self) -> list[tuple[int, Transfer]]:
        """All transfers in order as (step index, transfer); the flat index is the position in this list."""
        return [(i, t) for i, step in enumerate(self.steps) for t in step.transfers]


# ---- buffer layout (what each collective is: `meshscale.collectives.kinds`) -------------------------------

def buffer_bytes(collective: str, n: int, nbytes: int) -> int:
    """Size of the logical buffer of a collective over n ranks with nccl-tests size ``nbytes``."""
    return kind(collective).buffer_bytes(n, nbytes)


def _spans(units: list[int], unit_bytes: int) -> list[tuple[int, int]]:
    """Units as (offset_bytes, nbytes) pieces in order, neighbouring units merged."""
    spans: list[tuple[int, int]] = []
    for u in units:
        if spans and spans[-1][0] + spans[-1][1] == u * unit_bytes:
            spans[-1] = (spans[-1][0], spans[-1][1] + unit_bytes)
        else:
            spans.append((u * unit_bytes, unit_bytes))
    return spans


def input_spans(schedule: Schedule, rank: int) -> list[tuple[int, int]]:
    """Where rank's input tensor lies in the logical buffer, as (offset_bytes, nbytes) pieces in input order;
    empty when the rank has no input (broadcast/scatter non-roots)."""
    k = kind(schedule.collective)
    return _spans(k.input_units(rank, schedule.n, schedule.root), k.unit_bytes(schedule.n, schedule.nbytes))


def output_spans(schedule: Schedule, rank: int) -> list[tuple[int, int]]:
    """Where rank's output tensor is read from the logical buffer at the end, in output order; empty when the
    rank has no output (reduce/gather non-roots)."""
    k = kind(schedule.collective)
    return _spans(k.output_units(rank, schedule.n, schedule.root), k.unit_bytes(schedule.n, schedule.nbytes))


def split_bytes(nbytes: int, parts: int, elem_bytes: int = DEFAULT_ELEM_BYTES, what: str = "buffer") -> list[int]:
    """Split nbytes into ``parts`` sizes that are multiples of elem_bytes and differ by at most one element."""
    if nbytes <= 0:
        raise MeshscaleError(f"{what} size must be positive, got {nbytes} bytes")
    if nbytes % elem_bytes:
        raise MeshscaleError(f"{what} of {nbytes} bytes is not a multiple of the {elem_bytes}-byte element; round it")
    elems = nbytes // elem_bytes
    if elems < parts:
        raise MeshscaleError(f"{what} of {nbytes} bytes cannot split into {parts} chunks of {elem_bytes}-byte "
                             f"elements; use at least {parts * elem_bytes} bytes or fewer chunks")
    base, extra = divmod(elems, parts)
    return [(base + (i < extra)) * elem_bytes for i in range(parts)]


def make_chunks(collective: str, n: int, nbytes: int, pieces: int = 1,
                elem_bytes: int = DEFAULT_ELEM_BYTES) -> list[Chunk]:
    """The chunk layout of a collective: each unit of its logical buffer (the whole buffer when unsegmented,
    each segment, each all_to_all block) cut into ``pieces`` chunks. Chunk ``unit * pieces + p`` is piece p of
    that unit."""
    k = kind(collective)
    if k.segmented and (nbytes <= 0 or nbytes % (n * elem_bytes)):
        raise MeshscaleError(f"{collective} of {nbytes} bytes does not split into {n} segments of whole "
                             f"{elem_bytes}-byte elements; use a multiple of {n * elem_bytes} bytes")
    units = k.units(n)
    sizes = split_bytes(k.unit_bytes(n, nbytes), 1 if k.chunk_per_unit else pieces, elem_bytes,
                        f"{collective} segment" if units > 1 else collective)
    chunks, offset = [], 0
    for _ in range(units):
        for size in sizes:
            chunks.append(Chunk(len(chunks), offset, size))
            offset += size
    return chunks


# ---- symbolic check --------------------------------------------------------------------------------------

State = list[list[frozenset]]


def unit_of(schedule: Schedule, chunk: Chunk) -> int:
    """The unit of the logical buffer a chunk lies in (for all_to_all: block s*n+d)."""
    return chunk.offset_bytes // kind(schedule.collective).unit_bytes(schedule.n, schedule.nbytes)


def initial_state(schedule: Schedule) -> State:
    """``state[r][c]``: the ranks whose contribution chunk c holds on rank r before the first step: its own,
    on the chunks of its input units."""
    k, n = kind(schedule.collective), schedule.n
    unit = [unit_of(schedule, ch) for ch in schedule.chunks]
    state: State = []
    for r in range(n):
        mine, own = set(k.input_units(r, n, schedule.root)), frozenset({r})
        state.append([own if u in mine else frozenset() for u in unit])
    return state


def required_state(schedule: Schedule) -> dict[tuple[int, int], frozenset]:
    """The (rank, chunk) -> contributions that must hold after the last step: on the chunks of a rank's output
    units, the ranks whose input holds that unit. Pairs not listed are free."""
    k, n, root = kind(schedule.collective), schedule.n, schedule.root
    sources = k.sources(n, root)
    unit = [unit_of(schedule, ch) for ch in schedule.chunks]
    need: dict[tuple[int, int], frozenset] = {}
    for r in range(n):
        mine = set(k.output_units(r, n, root))
        need.update({(r, c): sources[u] for c, u in enumerate(unit) if u in mine})
    return need


def _check_shape(s: Schedule) -> None:
    """Structure: names, ranks, chunk layout, transfer fields. Raises on the first problem."""
    ck = schedulable(s.collective)
    n = s.n
    if n < 1 or len(set(s.ranks)) != n:
        raise MeshscaleError(f"schedule ranks {s.ranks} must be a non-empty list of distinct devices")
    if ck.rooted:
        if s.root is None or not 0 <= s.root < n:
            raise MeshscaleError(f"{s.collective} needs a root rank in 0..{n - 1}, got {s.root}")
    if s.nbytes <= 0:
        raise MeshscaleError(f"schedule size must be positive, got {s.nbytes} bytes")
    if ck.segmented and s.nbytes % n:
        raise MeshscaleError(f"{s.collective} of {s.nbytes} bytes does not split into {n} equal segments; use a multiple of {n}")
    unit = ck.unit_bytes(n, s.nbytes)
    offset = 0
    for i, ch in enumerate(s.chunks):
        if ch.id != i or ch.offset_bytes != offset or ch.nbytes <= 0:
            raise MeshscaleError(f"chunk {i} ({ch}) breaks the layout: ids 0.., contiguous offsets, positive sizes")
        if ch.nbytes % s.elem_bytes or ch.offset_bytes // unit != (ch.offset_bytes + ch.nbytes - 1) // unit:
            raise MeshscaleError(f"chunk {i} ({ch}) is not whole elements of {s.elem_bytes} bytes inside one segment")
        offset += ch.nbytes
    if offset != ck.buffer_bytes(n, s.nbytes):
        raise MeshscaleError(f"chunks cover {offset} bytes but the {s.collective} buffer has {ck.buffer_bytes(n, s.nbytes)}")
    if ck.chunk_per_unit and len(s.chunks) != ck.units(n):
        raise MeshscaleError(f"{s.collective} needs exactly one chunk per block ({ck.units(n)}), got {len(s.chunks)}")
    for k, step in enumerate(s.steps):
        for t in step.transfers:
            where = f"step {k}: transfer {t.src}->{t.dst} chunk {t.chunk}"
            if not (0 <= t.src < n and 0 <= t.dst < n) or t.src == t.dst:
                raise MeshscaleError(f"{where}: ranks must be two different ranks in 0..{n - 1}")
            if not 0 <= t.chunk < len(s.chunks):
                raise MeshscaleError(f"{where}: no such chunk (the schedule has {len(s.chunks)})")
            if t.nbytes != s.chunks[t.chunk].nbytes:
                raise MeshscaleError(f"{where}: moves {t.nbytes} bytes but the chunk has {s.chunks[t.chunk].nbytes}")
            if t.op not in OPS:
                raise MeshscaleError(f"{where}: unknown op {t.op!r}; use copy or reduce")
            if not 0 <= t.channel < s.channels:
                raise MeshscaleError(f"{where}: channel {t.channel} outside 0..{s.channels - 1}")


def run_symbolic(schedule: Schedule) -> State:
    """Apply the steps to the initial state and return the final one; raises on an invalid transfer."""
    _check_shape(schedule)
    state = initial_state(schedule)
    for k, step in enumerate(schedule.steps):
        writes: dict[tuple[int, int], list[Transfer]] = defaultdict(list)
        for t in step.transfers:
            writes[(t.dst, t.chunk)].append(t)
        new = {}
        for (dst, c), ts in writes.items():
            where = f"step {k}: rank {dst} chunk {c}"
            for t in ts:
                if not state[t.src][c]:
                    raise MeshscaleError(f"{where}: rank {t.src} sends chunk {c} before it holds valid data")
            ops = {t.op for t in ts}
            if ops == {"copy"}:
                if len(ts) > 1:
                    raise MeshscaleError(f"{where}: {len(ts)} copies race into it in one step")
                new[(dst, c)] = state[ts[0].src][c]
                continue
            if "copy" in ops:
                raise MeshscaleError(f"{where}: a copy and a reduce race into it in one step")
            value = state[dst][c]
            if not value:
                raise MeshscaleError(f"{where}: reduce into a chunk that holds no valid data (copy it first)")
            for t in ts:
                if value & state[t.src][c]:
                    raise MeshscaleError(f"{where}: reduce from rank {t.src} counts rank(s) "
                                         f"{sorted(value & state[t.src][c])} twice")
                value = value | state[t.src][c]
            new[(dst, c)] = value
        for (dst, c), value in new.items():
            state[dst][c] = value
    return state


def validate(schedule: Schedule) -> None:
    """Check a schedule symbolically (no tensors): layout, transfers, and that every rank ends with what the
    collective requires. Raises MeshscaleError naming the first rank/chunk that is wrong."""
    state = run_symbolic(schedule)
    for (r, c), want in sorted(required_state(schedule).items()):
        if state[r][c] != want:
            have = sorted(state[r][c]) or "nothing"
            raise MeshscaleError(f"{schedule.algorithm} {schedule.collective}: rank {r} (device {schedule.ranks[r]}) "
                                 f"chunk {c} ends with contributions of {have}, needs {sorted(want)}")


# ---- dependencies ----------------------------------------------------------------------------------------

def dependencies(schedule: Schedule) -> list[list[int]]:
    """For each transfer (flat index, as in `Schedule.transfers`) the earlier transfers it must wait for: the
    last writes to (src, chunk) (the data it sends), and for its destination (dst, chunk) the last writes
    (a reduce adds to them; a copy must land after them) and the reads since then (they must not see the
    new value). Transfers of one step never depend on each other."""
    last_write: dict[tuple[int, int], list[int]] = {}
    reads_since: dict[tuple[int, int], list[int]] = defaultdict(list)
    deps: list[list[int]] = []
    flat = schedule.transfers()
    index = 0
    for step in schedule.steps:
        first = index
        for t in step.transfers:
            src_key, dst_key = (t.src, t.chunk), (t.dst, t.chunk)
            waits = set(last_write.get(src_key, [])) | set(last_write.get(dst_key, [])) | set(reads_since[dst_key])
            deps.append(sorted(waits))
            index += 1
        for i in range(first, index):  # update after the step: the step reads the state from before it
            t = flat[i][1]
            reads_since[(t.src, t.chunk)].append(i)
        step_writes: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i in range(first, index):
            t = flat[i][1]
            step_writes[(t.dst, t.chunk)].append(i)
        for key, writers in step_writes.items():
            last_write[key] = writers
            reads_since[key] = []
    return deps


# ---- JSON and text ---------------------------------------------------------------------------------------

def to_dict(schedule: Schedule) -> dict[str, Any]:
    """Plain data for JSON; transfers are compact lists [src, dst, chunk, nbytes, op, channel]."""
    return {
        "schema": SCHEMA,
        "collective": schedule.collective,
        "algorithm": schedule.algorithm,
        "ranks": list(schedule.ranks),
        "nbytes": schedule.nbytes,
        "root": schedule.root,
        "channels": schedule.channels,
        "meta": schedule.meta,
        "chunks": [[c.id, c.offset_bytes, c.nbytes] for c in schedule.chunks],
        "steps": [[[t.src, t.dst, t.chunk, t.nbytes, t.op, t.channel] for t in step.transfers]
                  for step in schedule.steps],
    }


def from_dict(data: dict[str, Any]) -> Schedule:
    """Inverse of `to_dict`; a clear error on anything that is not a schedule."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise MeshscaleError(f"not a meshscale schedule (no schema {SCHEMA!r}); give a file `meshscale plan` wrote")
    try:
        return Schedule(
            collective=data["collective"], algorithm=data["algorithm"], ranks=[int(r) for r in data["ranks"]],
            nbytes=int(data["nbytes"]), root=data.get("root"), channels=int(data.get("channels", 1)),
            meta=dict(data.get("meta") or {}),
            chunks=[Chunk(int(i), int(o), int(b)) for i, o, b in data["chunks"]],
            steps=[Step([Transfer(int(s), int(d), int(c), int(b), str(op), int(ch)) for s, d, c, b, op, ch in step])
                   for step in data["steps"]],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MeshscaleError(f"malformed schedule ({type(exc).__name__}: {exc}); write it with meshscale's to_dict") from None


def dumps(schedule: Schedule) -> str:
    return json.dumps(to_dict(schedule))


def loads(text: str) -> Schedule:
    try:
        return from_dict(json.loads(text))
    except json.JSONDecodeError as exc:
        raise MeshscaleError(f"schedule is not JSON ({exc.msg} at line {exc.lineno})") from None


def describe(schedule: Schedule, max_steps: int = 20) -> str:
    """A short text view: header, chunk layout, then one line per step (the first ``max_steps``)."""
    s = schedule
    root = f", root rank {s.root}" if s.root is not None else ""
    lines = [f"{s.algorithm} {s.collective}: {s.n} ranks (devices {s.ranks}){root}, {format_bytes(s.nbytes)}, "
             f"{len(s.chunks)} chunks, {len(s.steps)} steps, {len(s.transfers())} transfers, {s.channels} channel(s)"]
    for key, value in s.meta.items():
        if key != "elem_bytes":
            lines.append(f"  {key}: {value}")
    for k, step in enumerate(s.steps[:max_steps]):
        parts = [f"{t.src}{'+>' if t.op == 'reduce' else '->'}{t.dst}:c{t.chunk}" + (f"@{t.channel}" if s.channels > 1 else "")
                 for t in step.transfers]
        lines.append(f"  step {k:3d}: " + " ".join(parts))
    if len(s.steps) > max_steps:
        lines.append(f"  ... {len(s.steps) - max_steps} more steps")
    return "\n".join(lines)


__all__ = ["Chunk", "Transfer", "Step", "Schedule", "buffer_bytes", "input_spans", "output_spans", "split_bytes",
           "make_chunks", "unit_of", "initial_state", "required_state", "run_symbolic", "validate", "dependencies",
           "to_dict", "from_dict", "dumps", "loads", "describe"]
