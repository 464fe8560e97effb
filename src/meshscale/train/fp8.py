"""fp8 training (``--precision fp8``): torchao's float8 linears (``torchao.float8.convert_to_float8_training``) on
GPUs with fp8 tensor cores, the rest of the model in bf16 under FSDP2's mixed precision.

Recipes (torchao's ``Float8LinearConfig``): ``tensorwise``, one dynamic scale per tensor, with FSDP2 all-gathering
the weights in float8 (``enable_fsdp_float8_all_gather``; the scales precomputed after each optimizer step,
``precompute_float8_dynamic_scale_for_fsdp``, as torchtitan does); ``rowwise``, a scale per row (torchao's
``from_recipe_name("rowwise")``), whose all-gather stays bf16: torchao offers the float8 all-gather for tensorwise
scaling only. What stays bf16, as in torchtitan's float8 converter: attention's scores and softmax, norms, the
embedding, the output head, a mixture of experts' router, routed and shared experts, and any linear whose sides are
not multiples of 16 (``torch._scaled_mm``'s rule)."""
from __future__ import annotations

from typing import Callable

import torch.nn as nn

from meshscale.errors import MeshscaleError

FP8_RECIPES = ("tensorwise", "rowwise")
# fp8 tensor cores: compute capability 8.9 (Ada), 9.0 (Hopper), 10.x (Blackwell); torch._scaled_mm needs them
FP8_MIN_CAPABILITY = (8, 9)
_FP8_ALIGN = 16


def require_torchao() -> None:
    """torchao is an optional extra: one line naming its pip command when it is missing."""
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise MeshscaleError("--precision fp8 needs torchao (float8 training): pip install 'meshscale[fp8]'") from None


def check_fp8_device(device: str) -> None:
    """fp8 trains on GPUs with fp8 tensor cores only: one line for CPU workers and older GPUs."""
    if device != "cuda":
        raise MeshscaleError("--precision fp8 needs GPUs with fp8 tensor cores (compute capability 8.9+: L4, L40S, "
                             "H100, H200, B200); this run is on CPU workers: use bf16 or fp32")
    import torch
    capability = torch.cuda.get_device_capability(0)
    if capability < FP8_MIN_CAPABILITY:
        raise MeshscaleError(f"--precision fp8 needs fp8 tensor cores (compute capability 8.9+); the "
                             f"{torch.cuda.get_device_name(0)} is {capability[0]}.{capability[1]}: use bf16")


def keeps_fp8(module: nn.Module, fqn: str) -> bool:
    """Whether a linear becomes a float8 one: not the head, not a mixture of experts' parts, both sides multiples
    of 16."""
    parts = fqn.split(".")
    return (isinstance(module, nn.Linear) and parts[-1] != "output" and "moe" not in parts
            and module.in_features % _FP8_ALIGN == 0 and module.out_features % _FP8_ALIGN == 0)


def convert_to_fp8(model: nn.Module, recipe: str, emulate: bool = False) -> Callable[[nn.Module], None] | None:
    """Swap ``model``'s eligible linears for torchao's float8 ones (before the layout shards it). Returns what to
    run on each of the rank's modules after every optimizer step (tensorwise: the float8 all-gather's scales),
    or None. ``emulate``: torchao's emulation of the fp8 GEMMs (the tests, on CPUs)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp
    if recipe == "tensorwise":
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=True, emulate=emulate)
    else:
        config = Float8LinearConfig.from_recipe_name(recipe)
        if emulate:
            from dataclasses import replace
            config = replace(config, emulate=True)
    convert_to_float8_training(model, config=config, module_filter_fn=keeps_fp8)
    return precompute_float8_dynamic_scale_for_fsdp if recipe == "tensorwise" else None


def fp8_linears(model: nn.Module) -> int:
    """How many of ``model``'s linears run in float8."""
    return sum(1 for m in model.modules() if type(m).__name__ == "Float8Linear")
