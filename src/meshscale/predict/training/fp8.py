"""fp8 training as torchao's float8 linears run it (torchtitan's float8 converter): every linear of the layers
multiplies fp8 operands on the fp8 tensor cores; attention, norms, activations, the router and the output head
(torchtitan leaves ``output`` out of the conversion) stay in bf16, as do the activations between the linears. Each
fp8 linear first casts its input, weight and (backward) output gradient to fp8 with a scale: the traffic of those
casts per recipe is torchao's own roofline model of them (torchao/testing/training/roofline_utils.py,
`get_tensor_memory_traffic_ovhd_s`, each kernel unfused with the op before it, as torch.compile generates them):

- tensorwise: one scale per tensor. Input and output gradient: an amax pass (read bf16), then one cast writing both
  fp8 layouts (read 2, write 1 + 1 bytes per element); weight: the amax, the forward cast (2 + 1) and the
  backward's transposed cast (2 + 1). Under FSDP its weights are all-gathered in fp8 (torchao's float8 all-gather,
  torchtitan's `enable_fsdp_float8_all_gather`, the setting recommended with this recipe): one byte per parameter.
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
# bytes moved per element of each tensor a linear casts, (forward, backward), and the kernels that move them
CAST_BYTES = {"tensorwise": {"input": (6, 0), "weight": (5, 3), "grad_output": (0, 6)},
              "rowwise": {"input": (5, 3), "weight": (3, 7), "grad_output": (0, 8)}}
CAST_LAUNCHES = {"tensorwise": {"input": (3, 0), "weight": (3, 1), "grad_output": (0, 3)},
                 "rowwise": {"input": (1, 1), "weight": (1, 2), "grad_output": (0, 2)}}
# linears torchtitan converts: every linear of a layer but the router (kept in high precision), and of those only
# the ones whose features are multiples of 16 (torchao's default filter: fp8 GEMMs take 16-byte aligned rows)
NOT_CONVERTED = ("router",)
FEATURE_MULTIPLE = 16


def gathered_bytes(precision: str, recipe: str, param_bytes: int) -> float:
    """Bytes per parameter FSDP all-gathers: fp8's one with tensorwise's float8 all-gather, else as given."""
    return 1.0 if precision == "fp8" and recipe == "tensorwise" else float(param_bytes)


def _casts(kernel: Kernel, recipe: str) -> tuple[float, float, int, int]:
    """(forward bytes, backward bytes, forward kernels, backward kernels) of casting one fp8 GEMM's operands."""
    recipe = "rowwise" if kernel.groups > 1 else recipe
    numel = {"input": kernel.m * kernel.k, "weight": kernel.n * kernel.k, "grad_output": kernel.m * kernel.n}
    forward = sum(CAST_BYTES[recipe][r][0] * n for r, n in numel.items()) * kernel.groups
    backward = sum(CAST_BYTES[recipe][r][1] * n for r, n in numel.items()) * kernel.groups
    launches = CAST_LAUNCHES[recipe]
    return forward, backward, sum(v[0] for v in launches.values()), sum(v[1] for v in launches.values())


def to_fp8(forward: list[Kernel], recipe: str) -> tuple[list[Kernel], Kernel | None]:
    """``forward`` with its linears as fp8 GEMMs (operands of one byte), and one kernel for all their casts (its
    backward the backward's casts); None where no linear converts."""
    out, fwd_b, bwd_b, fwd_n = [], 0.0, 0.0, 0
    for k in forward:
        if k.kind != "matmul" or k.name.startswith(NOT_CONVERTED) or k.n % FEATURE_MULTIPLE or k.k % FEATURE_MULTIPLE:
            out.append(k)
            continue
        out.append(replace(k, fp8=True, bytes=fp8_gemm_bytes(k.m, k.n, k.k) * k.groups))
        f, b, launches, _ = _casts(k, recipe)
        fwd_b, bwd_b, fwd_n = fwd_b + f * k.count, bwd_b + b * k.count, fwd_n + launches
    if not fwd_n:
        return out, None
    # the backward's kernels are as many as the forward's, within one or two per linear: priced as the forward's
    return out, memory_op("fp8 casts", fwd_b, bwd_b, ops=fwd_n, launches=fwd_n)
