"""torchtitan's op-level selective checkpointing as its save list has it (at e7c0cae, June 2025): aten.mm saved
but every second one, SDPA's flash and memory-efficient kernels saved, everything else recomputed — float8's
_scaled_mm GEMMs and cuDNN's attention included. An oracle replays the policy over the layer's forward ops."""
import random

import pytest

from meshscale.models.transformer import TransformerConfig
from meshscale.predict.training.hardware import gpu_spec
from meshscale.predict.training.kernels import kernel_seconds, rates
from meshscale.predict.training.workload import TORCHTITAN_SAVED_ATTENTION, transformer_layer


def _replayed(forward, attention_kernel: str) -> list[str]:
    """What torchtitan's `_custom_policy` recomputes of ``forward``'s products and attention, op by op."""
    count, out = 0, []
    for k in forward:
        if k.kind == "matmul":
            if k.fp8:              # aten._scaled_mm: not in the save list
                out.append(k.name)
                continue
            count += 1             # aten.mm: saved, but every second one
            if count % 2 == 0:
                out.append(k.name)
        elif k.kind == "attention" and attention_kernel not in ("flash", "efficient", "triton"):
            out.append(k.name)
    return out


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_the_recomputed_products_and_attention_are_the_policys(precision):
    rng = random.Random(7 if precision == "fp8" else 8)
    gpu = gpu_spec({"model": "NVIDIA H100 80GB HBM3"})
    for _ in range(4):
        heads = rng.choice((16, 32))
        model = TransformerConfig("t", 2, heads * 128, heads, heads // rng.choice((1, 4)), rng.choice((5632, 14336)),
                                  32000, 4096)
        layer = transformer_layer(model, 8192.0, 4096, precision=precision, checkpointing="selective",
                                  selective_policy="torchtitan")
        for attention in ("flash", "cudnn"):
            r = rates(gpu, precision, attention_kernel=attention)
            priced = [k.name for k in layer.recompute if k.kind in ("matmul", "attention") and kernel_seconds(k, r) > 0]
            assert sorted(priced) == sorted(_replayed(layer.forward, attention))
    assert "cudnn" not in TORCHTITAN_SAVED_ATTENTION


def test_under_float8_every_product_of_the_block_is_recomputed_and_none_under_the_plain_policy():
    model = TransformerConfig("t", 2, 4096, 32, 8, 14336, 32000, 8192)
    fp8 = transformer_layer(model, 16384.0, 8192, precision="fp8", checkpointing="selective",
                            selective_policy="torchtitan")
    converted = [k.name for k in fp8.forward if k.kind == "matmul" and k.fp8]
    assert converted and set(converted) <= {k.name for k in fp8.recompute}
    plain = transformer_layer(model, 16384.0, 8192, precision="fp8", checkpointing="selective")
    assert not any(k.kind in ("matmul", "attention") for k in plain.recompute)
