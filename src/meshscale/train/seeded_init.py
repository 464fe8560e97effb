"""Initial weights that depend on the seed and each parameter's name only, never on the layout: a model built on
the meta device and sharded (FSDP2, tensor, expert and pipeline parallelism) materializes on every rank exactly the
values a whole-model build gives, one parameter's rows at a time (torchtitan's and llm-foundry's meta-device
initialisation, made reproducible across layouts).

A parameter's full value is its rows (dim 0) cut into blocks of at least `BLOCK_ELEMENTS` elements; each block is
drawn by a CPU generator seeded from (seed, parameter name, block index). A rank draws only the blocks its shard
touches and copies their part into its local tensor (a DTensor's local box: `compute_local_shape_and_global_offset`),
so the host holds one block at a time and the device nothing beyond the shard. CPU generators give the same
numbers on every host of the same CPU architecture; the tables are never drawn on a GPU, whose generator differs."""
from __future__ import annotations

import hashlib
from typing import Callable, Iterator

import torch
import torch.nn as nn

# rows of a parameter drawn together (a block of 256 KiB of fp32 at least): part of the values' definition,
# so changing it changes every initial weight
BLOCK_ELEMENTS = 1 << 16

# a parameter's initial value by kind: ("normal", std), ("ones", 0.0) or ("zeros", 0.0)
InitRule = Callable[[nn.Module, str], tuple[str, float]]


def block_rows(shape: torch.Size | tuple[int, ...]) -> int:
    """Rows of dim 0 per block: enough for `BLOCK_ELEMENTS` elements (one row if a row is larger)."""
    row = 1
    for n in shape[1:]:
        row *= n
    return max(1, -(-BLOCK_ELEMENTS // max(row, 1)))


def block_seed(seed: int, name: str, block: int) -> int:
    """The generator seed of one block: a hash of the run's seed, the parameter's name and the block's index."""
    digest = hashlib.blake2b(f"{seed}/{name}/{block}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def normal_block(seed: int, name: str, shape: tuple[int, ...], block: int, std: float) -> torch.Tensor:
    """Block ``block`` of the parameter's normal(0, std) value: its rows, fp32, on the CPU."""
    rows = block_rows(shape)
    first = block * rows
    out = torch.empty((min(rows, shape[0] - first), *shape[1:]), dtype=torch.float32, device="cpu")
    return out.normal_(0.0, std, generator=torch.Generator(device="cpu").manual_seed(block_seed(seed, name, block)))


def full_value(seed: int, name: str, shape: tuple[int, ...], kind: str, std: float) -> torch.Tensor:
    """The whole initial value of a parameter (every block): what every layout's shards add up to."""
    if kind != "normal":
        return (torch.ones if kind == "ones" else torch.zeros)(shape, dtype=torch.float32, device="cpu")
    if len(shape) == 0:
        return normal_block(seed, name, (1,), 0, std).reshape(())
    blocks = -(-shape[0] // block_rows(shape))
    return torch.cat([normal_block(seed, name, tuple(shape), b, std) for b in range(blocks)])


def local_box(param: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """(this rank's tensor, the full shape, its offset in the full value per dimension). A DTensor's local part
    is a box of the full value under the placements the engines use: Shard, and FSDP2's _StridedShard over a
    tensor- or expert-parallel Shard of the same dimension."""
    from torch.distributed.tensor import DTensor
    if not isinstance(param, DTensor):
        return param.data, tuple(param.shape), (0,) * param.dim()
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    local = param.to_local()
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    assert tuple(local.shape) == tuple(shape), (tuple(local.shape), shape, param.placements)
    return local, tuple(param.shape), tuple(offset)


def fill_local(param: torch.Tensor, seed: int, name: str, kind: str, std: float) -> None:
    """Write this rank's part of the parameter's initial value into it, block by block."""
    local, shape, offset = local_box(param)
    if local.numel() == 0:
        return
    if kind != "normal":
        local.fill_(1.0 if kind == "ones" else 0.0)
        return
    if local.dim() == 0:
        local.copy_(full_value(seed, name, shape, kind, std))
        return
    rows = block_rows(shape)
    start, stop = offset[0], offset[0] + local.shape[0]
    # the other dimensions' slices of the box
    inner = tuple(slice(o, o + n) for o, n in zip(offset[1:], local.shape[1:]))
    for b in range(start // rows, (stop - 1) // rows + 1):
        first = b * rows
        block = normal_block(seed, name, shape, b, std)
        lo, hi = max(start, first), min(stop, first + block.shape[0])
        part = block[(slice(lo - first, hi - first), *inner)]
        local.narrow(0, lo - start, hi - lo).copy_(part)


def named_parameters_once(module: nn.Module) -> Iterator[tuple[nn.Module, str, str, nn.Parameter]]:
    """(owning module, its attribute, fully qualified name, parameter) of each distinct parameter: a tied one
    once, under the first name that reaches it."""
    seen: set[int] = set()
    for prefix, owner in module.named_modules(remove_duplicate=False):
        for attr, param in owner.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            yield owner, attr, f"{prefix}.{attr}" if prefix else attr, param


@torch.no_grad()
def init_parameters(module: nn.Module, seed: int, rule: InitRule, canonical: Callable[[str], str]) -> None:
    """Every parameter's local part from (``seed``, ``canonical(name)``) by ``rule`` of its owning module."""
    for owner, attr, name, param in named_parameters_once(module):
        kind, std = rule(owner, attr)
        fill_local(param, seed, canonical(name), kind, std)
