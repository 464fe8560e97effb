"""The schedule: the one plain data model every algorithm produces and the simulator and executor consume.

A `Schedule` moves pieces (chunks) of one logical buffer between ranks in an ordered list of steps.

Ranks. ``ranks[i]`` is the device index (nvidia-smi number) in the topology of rank ``i``; transfers name ranks
by position ``i`` (0..n-1), never by device index. ``root`` is a rank position too (None when the collective has
no root).

Logical buffer and chunks. ``chunks`` partition the collective's logical buffer: ``chunks[i].id == i``, in offset
order, contiguous, covering it exactly. Every rank keeps a working copy of the logical buffer and a chunk sits at
the same ``offset_bytes`` on every rank. ``nbytes`` follows nccl-tests; with ``seg = nbytes / n``:

- all_reduce, reduce, broadcast: the nbytes tensor itself.
- reduce_scatter: the full nbytes input; rank r's output is segment r, ``[r*seg, (r+1)*seg)``.
- all_gather, gather: the gathered nbytes output; rank r's input is segment r.
- scatter: the root's nbytes input; rank r's output is segment r.
- all_to_all: ``n * nbytes``: rank s's send buffer (nbytes) at ``s*nbytes``. It is cut into the n*n blocks
  of ``seg`` bytes, one chunk each, chunk id ``s*n + d``: the block rank s sends to rank d. It lives at offset
  ``d*seg`` of s's input and lands at offset ``s*seg`` of d's output (see `input_spans` / `output_spans`).
Chunk sizes are multiples of ``meta["elem_bytes"]`` (default 4) so that an executor can use typed tensors, and
chunks never straddle a segment.

Symbolic state. ``state[r][c]`` is the set of ranks whose contribution chunk c on rank r holds (empty: nothing
valid). Initially: for all_reduce, reduce_scatter and reduce every rank holds ``{r}`` for every chunk; for
all_gather and gather rank r holds ``{r}`` for the chunks of its segment; for broadcast and scatter the root
holds ``{root}`` for every chunk; for all_to_all rank s holds ``{s}`` for its blocks ``s*n + d``. Required at the
end: all_reduce: every rank, every chunk = all ranks; reduce_scatter: rank r, chunks of segment r = all ranks;
reduce: the root, all chunks = all ranks; all_gather: every rank, chunk of segment s = ``{s}``; gather: the same
at the root; broadcast: every rank, every chunk = ``{root}``; scatter: rank r, chunks of segment r = ``{root}``;
all_to_all: rank d holds block ``s*n + d`` = ``{s}`` for every s. Other (rank, chunk) pairs are free.

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

from meshscale.errors import MeshscaleError, check_choice
from meshscale.units import format_bytes

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter", "all_to_all")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
SEGMENTED = ("all_gather", "reduce_scatter", "gather", "scatter", "all_to_all")  # nbytes splits into n segments
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


# ---- buffer layout ---------------------------------------------------------------------------------------

def buffer_bytes(collective: str, n: int, nbytes: int) -> int:
    """Size of the logical buffer of a collective over n ranks with nccl-tests size ``nbytes``."""
    return n * nbytes if collective == "all_to_all" else nbytes


def segment_bytes(collective: str, n: int, nbytes: int) -> int:
    """Bytes of one rank's segment (one block for all_to_all); the whole buffer for unsegmented collectives."""
    return nbytes // n if collective in SEGMENTED else nbytes


def owner(schedule: Schedule, chunk: Chunk) -> int:
    """The segment a chunk lies in (for all_to_all: the sender s of block s*n+d)."""
    if schedule.collective == "all_to_all":
        return chunk.offset_bytes // schedule.nbytes
    return chunk.offset_bytes // segment_bytes(schedule.collective, schedule.n, schedule.nbytes)


def input_spans(schedule: Schedule, rank: int) -> list[tuple[int, int]]:
    """Where rank's input tensor lies in the logical buffer, as (offset_bytes, nbytes) pieces in input order;
    empty when the rank has no input (broadcast/scatter non-roots)."""
    c, n, nb = schedule.collective, schedule.n, schedule.nbytes
    seg = segment_bytes(c, n, nb)
    if c in ("all_reduce", "reduce_scatter", "reduce"):
        return [(0, nb)]
    if c in ("all_gather", "gather"):
        return [(rank * seg, seg)]
    if c in ("broadcast", "scatter"):
        return [(0, nb)] if rank == schedule.root else []
    return [(rank * nb, nb)]  # all_to_all


def output_spans(schedule: Schedule, rank: int) -> list[tuple[int, int]]:
    """Where rank's output tensor is read from the logical buffer at the end, in output order; empty when the
    rank has no output (reduce/gather non-roots)."""
    c, n, nb = schedule.collective, schedule.n, schedule.nbytes
    seg = segment_bytes(c, n, nb)
    if c in ("all_reduce", "all_gather", "broadcast"):
        return [(0, nb)]
    if c in ("reduce", "gather"):
        return [(0, nb)] if rank == schedule.root else []
    if c in ("reduce_scatter", "scatter"):
        return [(rank * seg, seg)]
    return [(s * nb + rank * seg, seg) for s in range(n)]  # all_to_all: block (s, rank) for every s


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
    """The chunk layout of a collective: each of its segments (the whole buffer when unsegmented; each block
    for all_to_all) cut into ``pieces`` chunks. Chunk ``seg * pieces + p`` is piece p of segment seg."""
    if collective in SEGMENTED and (nbytes <= 0 or nbytes % (n * elem_bytes)):
        raise MeshscaleError(f"{collective} of {nbytes} bytes does not split into {n} segments of whole "
                             f"{elem_bytes}-byte elements; use a multiple of {n * elem_bytes} bytes")
    segments = n * n if collective == "all_to_all" else n if collective in SEGMENTED else 1
    seg = segment_bytes(collective, n, nbytes)
    sizes = split_bytes(seg, pieces, elem_bytes, f"{collective} segment" if segments > 1 else collective)
    chunks, offset = [], 0
    for _ in range(segments):
        for size in sizes:
            chunks.append(Chunk(len(chunks), offset, size))
            offset += size
    return chunks


# ---- symbolic check --------------------------------------------------------------------------------------

State = list[list[frozenset]]


def initial_state(schedule: Schedule) -> State:
    """``state[r][c]``: the ranks whose contribution chunk c holds on rank r before the first step."""
    c, n, root = schedule.collective, schedule.n, schedule.root
    state: State = [[frozenset() for _ in schedule.chunks] for _ in range(n)]
    for ch in schedule.chunks:
        for r in range(n):
            if c in ("all_reduce", "reduce_scatter", "reduce"):
                state[r][ch.id] = frozenset({r})
            elif c in ("all_gather", "gather", "all_to_all") and owner(schedule, ch) == r:
                state[r][ch.id] = frozenset({r})
            elif c in ("broadcast", "scatter") and r == root:
                state[r][ch.id] = frozenset({r})
    return state


def required_state(schedule: Schedule) -> dict[tuple[int, int], frozenset]:
    """The (rank, chunk) -> contributions that must hold after the last step; pairs not listed are free."""
    c, n, root = schedule.collective, schedule.n, schedule.root
    everyone = frozenset(range(n))
    need: dict[tuple[int, int], frozenset] = {}
    for ch in schedule.chunks:
        seg_owner = owner(schedule, ch)
        if c == "all_reduce":
            need.update({(r, ch.id): everyone for r in range(n)})
        elif c == "reduce_scatter":
            need[(seg_owner, ch.id)] = everyone
        elif c == "reduce":
            need[(root, ch.id)] = everyone
        elif c == "all_gather":
            need.update({(r, ch.id): frozenset({seg_owner}) for r in range(n)})
        elif c == "gather":
            need[(root, ch.id)] = frozenset({seg_owner})
        elif c == "broadcast":
            need.update({(r, ch.id): frozenset({root}) for r in range(n)})
        elif c == "scatter":
            need[(seg_owner, ch.id)] = frozenset({root})
        else:  # all_to_all: block s*n+d must reach d
            need[(ch.id % n, ch.id)] = frozenset({seg_owner})
    return need


def _check_shape(s: Schedule) -> None:
    """Structure: names, ranks, chunk layout, transfer fields. Raises on the first problem."""
    check_choice(s.collective, COLLECTIVES, "collective")
    n = s.n
    if n < 1 or len(set(s.ranks)) != n:
        raise MeshscaleError(f"schedule ranks {s.ranks} must be a non-empty list of distinct devices")
    if s.collective in ROOTED:
        if s.root is None or not 0 <= s.root < n:
            raise MeshscaleError(f"{s.collective} needs a root rank in 0..{n - 1}, got {s.root}")
    if s.nbytes <= 0:
        raise MeshscaleError(f"schedule size must be positive, got {s.nbytes} bytes")
    seg = segment_bytes(s.collective, n, s.nbytes)
    if s.collective in SEGMENTED and s.nbytes % n:
        raise MeshscaleError(f"{s.collective} of {s.nbytes} bytes does not split into {n} equal segments; use a multiple of {n}")
    offset = 0
    for i, ch in enumerate(s.chunks):
        if ch.id != i or ch.offset_bytes != offset or ch.nbytes <= 0:
            raise MeshscaleError(f"chunk {i} ({ch}) breaks the layout: ids 0.., contiguous offsets, positive sizes")
        if ch.nbytes % s.elem_bytes or (s.collective in SEGMENTED and ch.offset_bytes // seg != (ch.offset_bytes + ch.nbytes - 1) // seg):
            raise MeshscaleError(f"chunk {i} ({ch}) is not whole elements of {s.elem_bytes} bytes inside one segment")
        offset += ch.nbytes
    if offset != buffer_bytes(s.collective, n, s.nbytes):
        raise MeshscaleError(f"chunks cover {offset} bytes but the {s.collective} buffer has "
                             f"{buffer_bytes(s.collective, n, s.nbytes)}")
    if s.collective == "all_to_all" and len(s.chunks) != n * n:
        raise MeshscaleError(f"all_to_all needs exactly n*n = {n * n} chunks (one per block), got {len(s.chunks)}")
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


def size_of(schedule: Schedule) -> dict[str, int]:
    """Counts for summaries: steps, transfers, bytes moved."""
    flat = schedule.transfers()
    return {"steps": len(schedule.steps), "transfers": len(flat), "bytes_moved": sum(t.nbytes for _, t in flat)}


__all__ = ["COLLECTIVES", "ROOTED", "SEGMENTED", "Chunk", "Transfer", "Step", "Schedule", "buffer_bytes",
           "segment_bytes", "input_spans", "output_spans", "split_bytes", "initial_state", "required_state",
           "run_symbolic", "validate", "dependencies", "to_dict", "from_dict", "dumps", "loads", "describe", "make_chunks"]
