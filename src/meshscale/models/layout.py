"""A parallel layout: how many ways the world is split along each dimension, and where each group's ranks sit.

Ranks are laid out as torchtitan's device mesh and Megatron-LM's default order lay them out, the fastest-varying
dimension first: tensor (tp), context (cp), sharded data (fsdp), replicated data (dp), pipeline (pp). So a tp group
is consecutive ranks (inside a node first), and pipeline stages are the farthest apart.

Expert parallelism (ep) is no dimension of its own: as in torchtitan's device mesh, its groups borrow the
data-parallel ranks, cp first, then fsdp, then dp (ep consecutive positions of the combined cp x fsdp x dp index).
Each ep group holds every expert once (experts / ep per rank); the experts are then sharded over what is left of
cp x fsdp (`expert_fsdp`, torchtitan's dp_shard_mod_ep) and replicated over the rest (`expert_dp`).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from meshscale.errors import MeshscaleError

# inner (consecutive ranks) to outer
DIMENSIONS = ("tp", "cp", "fsdp", "dp", "pp")
# The most ranks a layout may span: 5x the largest GPU cluster announced (xAI's Colossus, 100,000 Hopper GPUs being
# doubled to 200,000; docs/references.md), so a product of degrees is refused before any work sized by it.
MAX_LAYOUT_RANKS = 1 << 20
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
CHECKPOINTING = ("none", "selective", "full")


@dataclass(frozen=True)
class ParallelLayout:
    """Degrees of parallelism (each >= 1; their product is the world size) and the pipeline's schedule."""

    dp: int = 1     # replicated data parallel (DDP-style all-reduce of gradients)
    fsdp: int = 1   # sharded data parallel (FSDP2 / ZeRO-3: parameters, gradients and optimizer state sharded)
    tp: int = 1     # tensor (and sequence) parallel inside each layer
    pp: int = 1     # pipeline stages
    cp: int = 1     # context parallel: the sequence split across ranks, attention exchanged in a ring
    pp_schedule: str = "1f1b"
    micro_batches: int = 1          # per step, per pipeline (>= pp for a pipeline to fill)
    stages_per_rank: int = 1        # interleaved-1f1b: virtual stages per rank
    ep: int = 1                     # expert parallel: the experts split over ep of the data-parallel ranks

    @property
    def world_size(self) -> int:
        return prod(self.degrees().values())

    @property
    def data_parallel(self) -> int:
        """Ranks that see different samples: replicas x shards."""
        return self.dp * self.fsdp

    def degrees(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in DIMENSIONS}

    @property
    def borrowable(self) -> int:
        """The data-parallel ranks an expert-parallel group borrows from: cp x fsdp x dp."""
        return self.cp * self.fsdp * self.dp

    @property
    def expert_fsdp(self) -> int:
        """Ranks each expert's parameters are sharded over: what ep leaves of cp x fsdp (1 where ep takes
        them all and more)."""
        return max(1, self.cp * self.fsdp // self.ep)

    @property
    def expert_dp(self) -> int:
        """Replicas of each expert shard."""
        return self.borrowable // (self.ep * self.expert_fsdp)

    def expert_groups(self, rank: int = 0) -> dict[str, list[int]]:
        """``rank``'s expert-parallel group ("ep"), the group its experts are sharded over ("expert_fsdp") and
        their replicas ("expert_dp"), as global ranks: positions of the combined cp x fsdp x dp index."""
        return {name: list(group) for name, group in self.expert_ranges(rank).items()}

    def expert_ranges(self, rank: int = 0) -> dict[str, range]:
        """`expert_groups` as ranges. The combined cp x fsdp x dp index is contiguous in the rank order (tp
        innermost, pp outermost), position i at ``base + tp * i``, so every such group is an arithmetic
        progression: named in constant time, whatever its size."""
        c = self.coordinates(rank)
        base = c["tp"] + self.stride("pp") * c["pp"]
        index = c["cp"] + self.cp * (c["fsdp"] + self.fsdp * c["dp"])
        start = index - index % self.ep
        shard_span = self.ep * self.expert_fsdp
        first = index - index % shard_span + index % self.ep

        def progression(at: int, step: int, count: int) -> range:
            return range(base + self.tp * at, base + self.tp * (at + step * count), self.tp * step)
        return {"ep": progression(start, 1, self.ep),
                "expert_fsdp": progression(first, self.ep, self.expert_fsdp),
                "expert_dp": progression(index % shard_span, shard_span, self.expert_dp)}

    def describe(self) -> str:
        parts = [f"{name}{n}" for name, n in self.degrees().items() if n > 1]
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        text = " ".join(parts) or "one rank"
        if self.pp > 1:
            text += f" ({self.pp_schedule}, {self.micro_batches} micro-batches)"
        return text

    def coordinates(self, rank: int) -> dict[str, int]:
        """Rank -> its index along each dimension."""
        out = {}
        for name in DIMENSIONS:
            n = getattr(self, name)
            out[name], rank = rank % n, rank // n
        return out

    def rank_of(self, coords: dict[str, int]) -> int:
        rank, stride = 0, 1
        for name in DIMENSIONS:
            rank += coords.get(name, 0) * stride
            stride *= getattr(self, name)
        return rank

    def groups(self, dim: str) -> list[list[int]]:
        """Every group of ranks that communicate along ``dim`` (each a list of global ranks, in order)."""
        if dim not in DIMENSIONS:
            raise MeshscaleError(f"unknown parallel dimension {dim!r}; use one of {', '.join(DIMENSIONS)}")
        seen: dict[tuple, list[int]] = {}
        for rank in range(self.world_size):
            c = self.coordinates(rank)
            key = tuple(v for k, v in c.items() if k != dim)
            seen.setdefault(key, []).append(rank)
        return list(seen.values())

    def group_of(self, dim: str, rank: int = 0) -> list[int]:
        return list(self.group_ranks(dim, rank))

    def group_ranks(self, dim: str, rank: int = 0) -> range:
        """`group_of` as a range: the ranks that differ from ``rank`` only along ``dim`` are ``stride(dim)``
        apart, so a group of any size is named in constant time."""
        stride = self.stride(dim)
        start = rank - self.coordinates(rank)[dim] * stride
        return range(start, start + getattr(self, dim) * stride, stride)

    def stride(self, dim: str) -> int:
        """How far apart in rank two neighbours along ``dim`` are: the product of the inner dimensions."""
        out = 1
        for name in DIMENSIONS[:DIMENSIONS.index(dim)]:
            out *= getattr(self, name)
        return out


def filled_degrees(given: dict[str, int], world: int, fill: str) -> dict[str, int]:
    """The degrees ``given`` with what they leave of ``world`` taken by ``fill`` (fsdp for transformers, dp for
    replicated models) when it was not given, else by dp (replicas of the shards: FSDP2's hybrid mode) when dp
    was not; unchanged where nothing is left. One line where the given degrees do not divide the world."""
    found = dict(given)
    others = 1
    for v in found.values():
        others *= v
    taker = fill if fill not in found else ("dp" if "dp" not in found else None)
    if taker is None or others == world:
        return found
    if world % others:
        raise MeshscaleError(f"{' x '.join(f'--{k} {v}' for k, v in given.items())} = {others} does not divide "
                             f"the {world} ranks")
    found[taker] = world // others
    return found


def check_degrees(degrees: dict[str, int]) -> int:
    """The product of ``degrees`` (by dimension name), if it is within `MAX_LAYOUT_RANKS`; one line otherwise."""
    total = 1
    for n in degrees.values():
        total *= n if isinstance(n, int) and n > 0 else 1
    if total > MAX_LAYOUT_RANKS:
        shown = " x ".join(f"--{k} {v}" for k, v in degrees.items() if v != 1)
        raise MeshscaleError(f"layout {shown} = {total:,} ranks, above meshscale's limit of {MAX_LAYOUT_RANKS:,} "
                             "(5x the largest GPU cluster announced, 200,000 GPUs)")
    return total


def check_layout(layout: ParallelLayout, world_size: int | None = None, model=None, seq_len: int | None = None,
                 batch: int | None = None) -> ParallelLayout:
    """Refuse, in one line naming the field and the rule, a layout that cannot run: degrees below 1, a product
    that is not the world size, tp not dividing the heads (and key/value heads), pp above the layers, cp not
    dividing the sequence into 2 x cp chunks (load-balanced causal attention), micro-batches below the stages."""
    for name, n in layout.degrees().items():
        if not isinstance(n, int) or n < 1:
            raise MeshscaleError(f"--{name} {n}: must be a whole number >= 1")
    check_degrees(layout.degrees())
    if layout.pp_schedule not in PP_SCHEDULES:
        raise MeshscaleError(f"--pp-schedule {layout.pp_schedule}: use one of {', '.join(PP_SCHEDULES)}")
    if world_size is not None and layout.world_size != world_size:
        shown = " x ".join(f"{k} {v}" for k, v in layout.degrees().items() if v > 1) or "1"
        raise MeshscaleError(f"layout {shown} = {layout.world_size} ranks, but the world has {world_size}; "
                             "the product of --dp --fsdp --tp --pp --cp must equal the number of workers")
    if layout.micro_batches < 1:
        raise MeshscaleError(f"--micro-batches {layout.micro_batches}: must be >= 1")
    check_ep(layout, model)
    if layout.pp > 1 and layout.micro_batches < layout.pp:
        raise MeshscaleError(f"--micro-batches {layout.micro_batches}: a pipeline of {layout.pp} stages needs at "
                             f"least {layout.pp} micro-batches")
    if batch is not None and layout.pp > 1 and batch % layout.micro_batches:
        raise MeshscaleError(f"--batch {batch}: must be divisible by --micro-batches {layout.micro_batches}")
    if model is not None:
        if model.heads % layout.tp:
            raise MeshscaleError(f"--tp {layout.tp}: must divide the model's {model.heads} attention heads")
        if model.kv_heads % layout.tp and layout.tp % model.kv_heads:
            raise MeshscaleError(f"--tp {layout.tp}: must divide the model's {model.kv_heads} key/value heads "
                                 "(or be a multiple of them)")
        if model.ffn_dim % layout.tp:
            raise MeshscaleError(f"--tp {layout.tp}: must divide the model's FFN size {model.ffn_dim}")
        stages = layout.pp * (layout.stages_per_rank if layout.pp_schedule == "interleaved-1f1b" else 1)
        if stages > model.layers:
            raise MeshscaleError(f"--pp {layout.pp}: {stages} pipeline stages for {model.layers} layers; each stage "
                                 "needs at least one layer")
        if seq_len is not None:
            if seq_len > model.max_seq_len:
                raise MeshscaleError(f"--seq-len {seq_len}: longer than the model's {model.max_seq_len} positions")
            if layout.cp > 1 and seq_len % (2 * layout.cp):
                raise MeshscaleError(f"--seq-len {seq_len}: context parallelism of {layout.cp} splits the sequence "
                                     f"into {2 * layout.cp} chunks; use a multiple of {2 * layout.cp}")
    return layout


def check_ep(layout: ParallelLayout, model=None) -> None:
    """Refuse, in one line, an expert-parallel degree that cannot run: below 1, on a model without experts, not
    dividing its experts, or not dividing (nor being divided by) the data-parallel ranks it borrows."""
    ep = layout.ep
    if not isinstance(ep, int) or ep < 1:
        raise MeshscaleError(f"--ep {ep}: must be a whole number >= 1")
    if ep == 1:
        return
    if model is not None and not model.is_moe:
        raise MeshscaleError(f"--ep {ep}: {model.name} has no experts to split (a dense model)")
    if model is not None and model.experts % ep:
        raise MeshscaleError(f"--ep {ep}: must divide the model's {model.experts} experts")
    shard = layout.cp * layout.fsdp
    if layout.borrowable % ep or (shard % ep and ep % shard):
        raise MeshscaleError(f"--ep {ep}: expert parallelism borrows the data-parallel ranks (cp {layout.cp} x fsdp "
                             f"{layout.fsdp} x dp {layout.dp} = {layout.borrowable} of the GPUs): it must divide "
                             f"them{' and divide or be divided by cp x fsdp' if layout.borrowable % ep == 0 else ''}")
