"""fp8 training as torchao's float8 linears run it (torchtitan's float8 converter): every linear of the layers
multiplies fp8 operands on the fp8 tensor cores; attention, norms, activations, the router and the output head
(torchtitan leaves ``output`` out of the conversion) stay in bf16, as do the activations between the linears. Each
fp8 linear first casts its input, weight and (backward) output gradient to fp8 with a scale: the traffic of those
casts per recipe is torchao's own roofline model of them (torchao/testing/training/roofline_utils.py,
`get_tensor_memory_traffic_ovhd_s`, each kernel unfused with the op before it, as torch.compile generates them):

- tensorwise: one scale per tensor. Input and output gradient: an amax pass (read bf16), then one cast writing both
  fp8 layouts (read 2, write 1 + 1 bytes per element); weight: the amax, the forward cast (2 + 1) and the
  backward's transposed cast (2 + 1). Under FSDP2 its weights are all-gathered in fp8 (torchao's float8 all-gather,
  torchtitan's `enable_fsdp_float8_all_gather`, the setting recommended with this recipe, and what `meshscale
  train` runs): one byte per parameter, and the weight reaches the layer already cast. Its casts move to the
  shards (`gather_casts`, `amax_precompute`): before each all-gather FSDP2 calls the weight's
  ``fsdp_pre_all_gather`` (torchao/float8/fsdp_utils.py), which casts the fp32 shard eagerly
  (``hp_tensor_and_scale_to_float8``: a multiply by the scale, a clamp, the cast; 4 + 4, 4 + 4, 4 + 1 bytes per
  element, three kernels); after each optimizer step ``precompute_float8_dynamic_scale_for_fsdp`` takes every
  weight's amax at once (``torch._foreach_norm`` over the fp32 shards, then a stack, clamp and division); in the
  layer, backward's ``grad_output @ weight`` takes the fp8 weight transposed (torchao/float8/float8_ops.py makes
  a row-major second operand column-major: a copy, 1 + 1 bytes).
- rowwise: one scale per row. Input: a forward cast also writing a transposed bf16 copy (2 + 1 + 2), a backward
  cast of it (2 + 1); weight: the forward cast (2 + 1), a transpose (2 + 2) and its cast (2 + 1); output gradient:
  both (2 + 1 + 2, 2 + 1). Its all-gather stays in bf16 (float8 all-gather is tensorwise's).

A mixture of experts' grouped GEMMs are cast rowwise whatever the recipe (torchao's float8 MoE training scales
rowwise). Host ops: one per kernel (compiled casts); eager PyTorch issues a few more per cast.
"""
from __future__ import annotations

from dataclasses import replace

from meshscale.predict.training.kernels import Kernel, fp8_gemm_bytes, memory_op

FP8_RECIPES = ("tensorwise", "rowwise")
# a weight gathered in fp8 (see the module): in the layer only backward's transposed copy of it; per all-gather
# the shard's eager cast (bytes per shard element, kernels, host ops: the autograd function that builds the fp8
# tensor and its three ops); per step the amax over every shard (4 bytes per element, read once) and its four ops
GATHERED_WEIGHT_BYTES, GATHERED_WEIGHT_LAUNCHES = (0, 2), (0, 1)
GATHER_CAST_BYTES, GATHER_CAST_KERNELS, GATHER_CAST_OPS = 21.0, 3, 4
AMAX_BYTES, AMAX_OPS = 4.0, 4
# bytes moved per element of each tensor a linear casts, (forward, backward), and the kernels that move them
CAST_BYTES = {"tensorwise": {"input": (6, 0), "weight": (5, 3), "grad_output": (0, 6)},
              "rowwise": {"input": (5, 3), "weight": (3, 7), "grad_output": (0, 8)}}
CAST_LAUNCHES = {"tensorwise": {"input": (3, 0), "weight": (3, 1), "grad_output": (0, 3)},
                 "rowwise": {"input": (1, 1), "weight": (1, 2), "grad_output": (0, 2)}}
# linears torchtitan converts: every linear of a layer but the router (kept in high precision), and of those only
# the ones whose features are multiples of 16 (torchao's default filter: fp8 GEMMs take 16-byte aligned rows)
NOT_CONVERTED = ("router",)
FEATURE_MULTIPLE = 16


def gathers_fp8(precision: str, recipe: str, fsdp2: bool) -> bool:
    """Whether the linears' weights reach the layers already in fp8: tensorwise float8 under FSDP2."""
    return precision == "fp8" and recipe == "tensorwise" and fsdp2


def gathered_bytes(precision: str, recipe: str, param_bytes: int) -> float:
    """Bytes per parameter FSDP2 all-gathers: fp8's one where its weights are gathered in fp8, else as given."""
    return 1.0 if gathers_fp8(precision, recipe, True) else float(param_bytes)


def _casts(kernel: Kernel, recipe: str, gathered: bool = False) -> tuple[float, float, int, int]:
    """(forward bytes, backward bytes, forward kernels, backward kernels) of casting one fp8 GEMM's operands
    (``gathered``: its weight arrives in fp8, see the module)."""
    gathered = gathered and kernel.groups == 1
    recipe = "rowwise" if kernel.groups > 1 else recipe
    numel = {"input": kernel.m * kernel.k, "weight": kernel.n * kernel.k, "grad_output": kernel.m * kernel.n}
    per = dict(CAST_BYTES[recipe], **({"weight": GATHERED_WEIGHT_BYTES} if gathered else {}))
    launches = dict(CAST_LAUNCHES[recipe], **({"weight": GATHERED_WEIGHT_LAUNCHES} if gathered else {}))
    forward = sum(per[r][0] * n for r, n in numel.items()) * kernel.groups
    backward = sum(per[r][1] * n for r, n in numel.items()) * kernel.groups
    return forward, backward, sum(v[0] for v in launches.values()), sum(v[1] for v in launches.values())


def gathered_weights(forward: list[Kernel]) -> tuple[float, int]:
    """(elements, tensors) of one layer's weights that FSDP2 gathers in fp8: its converted dense linears'."""
    found = [k for k in forward if k.kind == "matmul" and k.fp8 and k.groups == 1]
    return float(sum(k.n * k.k * k.count for k in found)), sum(k.count for k in found)


def gather_casts(shard_elements: float, tensors: int, compute_stream: bool) -> Kernel:
    """One all-gather's eager casts of the fp32 shards of ``tensors`` weights to fp8 (see the module). With a
    shard group of more than one rank they run on FSDP2's copy-in stream, beside the layer's kernels: only their
    host ops are the step's; alone (a group of one rank) on the compute stream."""
    name = "float8 weight casts (FSDP2 pre-all-gather)"
    if not compute_stream:
        return Kernel(name, "host", ops=GATHER_CAST_OPS * tensors)
    return memory_op(name, GATHER_CAST_BYTES * shard_elements, 0.0, ops=GATHER_CAST_OPS * tensors,
                     launches=GATHER_CAST_KERNELS * tensors)


def amax_precompute(shard_elements: float, tensors: int) -> Kernel:
    """The step's amax of every fp8-gathered weight shard (``precompute_float8_dynamic_scale_for_fsdp``): one
    foreach norm reading each fp32 shard, a stack, clamp and division of the amaxes, on DTensors; each weight
    then takes its scale (a view)."""
    return memory_op("float8 amax precompute", AMAX_BYTES * shard_elements, 0.0, ops=AMAX_OPS + tensors,
                     launches=AMAX_OPS, dtensor_ops=AMAX_OPS)


def to_fp8(forward: list[Kernel], recipe: str, gathered: bool = False) -> tuple[list[Kernel], Kernel | None]:
    """``forward`` with its linears as fp8 GEMMs (operands of one byte), and one kernel for all their casts (its
    backward the backward's casts); None where no linear converts. ``gathered``: the weights arrive in fp8
    (`gathers_fp8`)."""
    out, fwd_b, bwd_b, fwd_n = [], 0.0, 0.0, 0
    for k in forward:
        if k.kind != "matmul" or k.name.startswith(NOT_CONVERTED) or k.n % FEATURE_MULTIPLE or k.k % FEATURE_MULTIPLE:
            out.append(k)
            continue
        out.append(replace(k, fp8=True, bytes=fp8_gemm_bytes(k.m, k.n, k.k) * k.groups))
        f, b, launches, _ = _casts(k, recipe, gathered)
        fwd_b, bwd_b, fwd_n = fwd_b + f * k.count, bwd_b + b * k.count, fwd_n + launches
    if not fwd_n:
        return out, None
    # the backward's kernels are as many as the forward's, within one or two per linear: priced as the forward's
    return out, memory_op("fp8 casts", fwd_b, bwd_b, ops=fwd_n, launches=fwd_n)
