"""What each collective is: one `CollectiveKind` record per collective, read by the schedule format, the
algorithms, the bound, the simulator, the executor and the benchmark alike. Adding a collective means adding
one record here (and the algorithms that do it).

The model (as nccl-tests and msccl-tools see a collective). ``nbytes`` is the size nccl-tests prints. The
collective's logical buffer is cut into ``units(n)`` equal units of `unit_bytes` bytes (the whole buffer when
unsegmented, one segment per rank when segmented, one block per (sender, receiver) pair for all_to_all). Rank
r's input is the units ``input_units(r, n, root)`` in that order, its output the units ``output_units(r, n,
root)``. From these two lists follow the precondition (rank r holds its own contribution ``{r}`` on each of
its input units, nothing elsewhere) and the postcondition (rank r's output unit u holds the contributions of
every rank that has u as input: all of them for a reduction, its one source otherwise).

Figures. algbw = nbytes / time and busbw = algbw x ``busbw_factor(n)`` (nccl-tests' doc/PERFORMANCE.md), so
that busbw compares with a link's bandwidth whatever the rank count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from meshscale.errors import MeshscaleError

Units = Callable[[int, int, int], list[int]]  # (rank, n, root) -> unit indices in tensor order


@dataclass(frozen=True)
class CollectiveKind:
    """One collective: its shape (units, spans), its figures and the names other libraries give it."""

    name: str
    summary: str
    units: Callable[[int], int]  # units in the logical buffer of n ranks
    input_units: Units
    output_units: Units
    busbw_factor: Callable[[int], float]  # nccl-tests' algbw -> busbw factor for n ranks
    rooted: bool = False  # takes a root rank
    reducing: bool = False  # takes a reduction op (several ranks contribute to one output unit)
    segmented: bool = False  # nbytes splits into n segments (nccl-tests' count is per rank)
    aliases: tuple[str, ...] = ()  # nccl-tests' binary names and other spellings
    schedulable: bool = True  # meshscale schedules, algorithms and the simulator do it
    chunk_per_unit: bool = False  # schedules keep one chunk per unit (algorithms address unit ids directly)
    places: tuple[str, ...] = ("out", "in")  # out-of-place / in-place forms torch.distributed offers
    min_ranks: int = 1
    torch_call: str = ""  # the torch.distributed function (`meshscale.execute.torch_collectives.CALLS`)
    nccl_function: str | None = None  # NCCL's one C entry point, if any (else a group of ncclSend/ncclRecv)
    bound: str = "ring"  # its traffic pattern in `meshscale.collectives.bounds.PATTERNS`: ring, exchange, root, pairs
    headline: bool = False  # among the collectives a short tour measures
    variable: bool = False  # each (sender, receiver) block has a size of its own: no bound, no prediction

    @property
    def from_root(self) -> bool:
        """A rooted collective whose data leaves the root (only the root has input: broadcast, scatter)."""
        return self.rooted and not self.input_units(1, 2, 0)

    # ---- layout -----------------------------------------------------------------------------------------

    def unit_bytes(self, n: int, nbytes: int) -> int:
        """Bytes of one unit: a segment (nbytes / n) when segmented, else nbytes."""
        return nbytes // n if self.segmented else nbytes

    def buffer_bytes(self, n: int, nbytes: int) -> int:
        """Bytes of the logical buffer."""
        return self.units(n) * self.unit_bytes(n, nbytes)

    def count(self, size_bytes: int, n: int, elem_bytes: int) -> int:
        """nccl-tests' count column: elements of one unit (also the count NCCL's call takes)."""
        return self.unit_bytes(n, size_bytes) // elem_bytes

    def unit_elems(self, rank: int, n: int, root: int, in_elems: int, out_elems: int) -> int:
        """Elements of one unit, read off a rank's input and output tensors: the input's when it holds units
        (or, unsegmented, is the one buffer the call works in place), else the output's."""
        k_in = len(self.input_units(rank, n, root))
        if in_elems and (k_in or not self.segmented):
            return in_elems // max(1, k_in)
        return out_elems // max(1, len(self.output_units(rank, n, root)))

    def sources(self, n: int, root: int) -> dict[int, frozenset]:
        """Unit -> the ranks whose input holds it: what the unit must hold at the end wherever it is an output."""
        found: dict[int, set] = {}
        for r in range(n):
            for u in self.input_units(r, n, root):
                found.setdefault(u, set()).add(r)
        return {u: frozenset(ranks) for u, ranks in found.items()}

    def algbw_busbw(self, size_bytes: float, time_s: float, n: int) -> tuple[float, float]:
        """(algbw, busbw) in bytes/s of one operation; see `algbw`."""
        alg = algbw(size_bytes, time_s)
        return alg, alg * self.busbw_factor(n)


def algbw(size_bytes: float, time_s: float) -> float:
    """nccl-tests' algorithm bandwidth, bytes/s: size / time; 0.0 for a time that is not a positive finite
    number (nothing measured, or a simulation that gave up), for measured and predicted figures alike."""
    return size_bytes / time_s if 0 < time_s < math.inf else 0.0


def _every(rank: int, n: int, root: int) -> list[int]:
    return list(range(n))


def _whole(rank: int, n: int, root: int) -> list[int]:
    return [0]


def _own(rank: int, n: int, root: int) -> list[int]:
    return [rank]


def _at_root(units: Units) -> Units:
    return lambda rank, n, root: units(rank, n, root) if rank == root else []


def _ring_factor(n: int) -> float:
    return (n - 1) / n


KINDS: tuple[CollectiveKind, ...] = (
    CollectiveKind("all_reduce", "every rank ends with the sum of all inputs", lambda n: 1, _whole, _whole,
                   lambda n: 2 * (n - 1) / n, reducing=True, torch_call="all_reduce",
                   places=("in",), nccl_function="ncclAllReduce", headline=True),
    CollectiveKind("all_gather", "every rank ends with every rank's segment", lambda n: n, _own, _every,
                   _ring_factor, segmented=True, torch_call="all_gather_into_tensor",
                   nccl_function="ncclAllGather", headline=True),
    CollectiveKind("reduce_scatter", "rank r ends with segment r summed over all ranks", lambda n: n, _every, _own,
                   _ring_factor, reducing=True, segmented=True,
                   torch_call="reduce_scatter_tensor", nccl_function="ncclReduceScatter", headline=True),
    CollectiveKind("broadcast", "every rank ends with the root's buffer", lambda n: 1, _at_root(_whole), _whole,
                   lambda n: 1.0, rooted=True, places=("in",), torch_call="broadcast",
                   nccl_function="ncclBroadcast", headline=True),
    CollectiveKind("reduce", "the root ends with the sum of all inputs", lambda n: 1, _whole, _at_root(_whole),
                   lambda n: 1.0, rooted=True, reducing=True, places=("in",), torch_call="reduce",
                   nccl_function="ncclReduce"),
    CollectiveKind("all_to_all", "block (s, d) of rank s's input ends in rank d's output at s", lambda n: n * n,
                   lambda r, n, root: [r * n + d for d in range(n)], lambda r, n, root: [s * n + r for s in range(n)],
                   _ring_factor, segmented=True, chunk_per_unit=True, aliases=("alltoall",), places=("out",),
                   torch_call="all_to_all_single", nccl_function="ncclAlltoAll", bound="exchange", headline=True),
    # nccl-tests' alltoallv: each rank sends a different amount to each peer (`meshscale.bench.cases.alltoallv_bytes`),
    # the units here are all_to_all's blocks at their even size; an exchange, which no schedule, bound or cost
    # model prices (they assume even blocks: `variable`)
    CollectiveKind("all_to_allv", "block (s, d), of a size that depends on d - s, of rank s's input ends in rank d's "
                   "output", lambda n: n * n,
                   lambda r, n, root: [r * n + d for d in range(n)], lambda r, n, root: [s * n + r for s in range(n)],
                   _ring_factor, segmented=True, chunk_per_unit=True, aliases=("alltoallv",), places=("out",),
                   torch_call="all_to_all_single", schedulable=False, bound="exchange", variable=True),
    CollectiveKind("gather", "the root ends with every rank's segment", lambda n: n, _own, _at_root(_every),
                   _ring_factor, rooted=True, segmented=True, places=("out",), torch_call="gather",
                   nccl_function="ncclGather", bound="root"),
    CollectiveKind("scatter", "rank r ends with segment r of the root's input", lambda n: n, _at_root(_every), _own,
                   _ring_factor, rooted=True, segmented=True, places=("out",), torch_call="scatter",
                   nccl_function="ncclScatter", bound="root"),
    CollectiveKind("send_recv", "rank r sends its buffer to rank r+1 and receives rank r-1's", lambda n: n, _own,
                   lambda r, n, root: [(r - 1) % n], lambda n: 1.0, aliases=("sendrecv",), schedulable=False,
                   places=("out",), min_ranks=2, torch_call="send_recv", bound="pairs"),
)

NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)
SCHEDULABLE: tuple[str, ...] = tuple(k.name for k in KINDS if k.schedulable)
_BY_NAME = {spelling: k for k in KINDS for spelling in (k.name, *k.aliases)}


def kind(name: str) -> CollectiveKind:
    """The record of a collective by name or alias (any case, ``-`` for ``_``); a one-line error otherwise."""
    found = _BY_NAME.get(str(name).strip().lower().replace("-", "_"))
    if found is None:
        raise MeshscaleError(f"unknown collective {name!r}; use one of {', '.join(NAMES)}")
    return found


def schedulable(name: str) -> CollectiveKind:
    """The record of a collective that meshscale can schedule; a one-line error for the others."""
    k = kind(name)
    if not k.schedulable:
        raise MeshscaleError(f"{k.name} has no meshscale schedule; use one of {', '.join(SCHEDULABLE)}")
    return k


def direct_peers(k: CollectiveKind, rank: int, n: int, root: int) -> list[tuple[int, int | None, int | None]]:
    """(peer, index of the input unit sent to it or None, index of the output unit received from it or None)
    per peer in rank order: a collective without reduction done as one group of sends and receives, each unit
    straight from its source to where it is an output (nccl-tests' alltoall, gather, scatter, sendrecv)."""
    if k.reducing:
        raise MeshscaleError(f"{k.name} reduces: it has no form as sends and receives alone")
    mine_in, mine_out = k.input_units(rank, n, root), k.output_units(rank, n, root)
    pattern = []
    for peer in range(n):
        theirs_out, theirs_in = k.output_units(peer, n, root), k.input_units(peer, n, root)
        send = next((i for i, u in enumerate(mine_in) if u in theirs_out), None)
        recv = next((i for i, u in enumerate(mine_out) if u in theirs_in), None)
        if send is not None or recv is not None:
            pattern.append((peer, send, recv))
    return pattern


__all__ = ["CollectiveKind", "KINDS", "NAMES", "SCHEDULABLE", "kind", "schedulable", "algbw", "direct_peers"]
