"""The kernels of one training step, from the model's configuration alone (no engine imported).

Transformers (Llama and GPT-2 styles, as `meshscale.models` describes them): per layer and micro-batch, the
forward's kernels as eager PyTorch runs them (autocast's casts, norms, rotary, attention, the residual adds, the
activations), the backward's (each GEMM's two products, attention's backward, each element-wise op's own backward
traffic, the biases' and weights' gradients) and what activation checkpointing recomputes. full: the whole
forward. selective: the op-level policy meshscale's engine applies (train/parallel: keep the outputs of every
matrix multiplication and of attention, recompute the rest), so the element-wise ops run again and no GEMM does,
as `models.memory` counts it. tests/unit/test_step_trace.py checks these kernels against an aten-level trace
of the model `train` builds. Tensor parallelism (with sequence parallelism, as torchtitan applies it) splits the GEMMs' inner
widths and the element-wise ops' tokens by tp; context parallelism splits the tokens by cp.

ResNets: the torchvision architecture (v1.5: stride on the 3x3 convolution), every convolution as the implicit
GEMM cuDNN runs (M = batch x output pixels, N = output channels, K = input channels x kernel area; NVIDIA Deep
Learning Performance Guide, "Convolutional Layers"), batch norm and ReLU as separate memory-bound kernels. A
tensor-core convolution wants NHWC: in NCHW (no --channels-last) cuDNN transposes each convolution's input and
output (same guide), which is priced as one more read and write of each.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from math import ceil

from meshscale.models.images import (SMALL_CNN_CLASSES, SMALL_CNN_IMAGE, resnet_blocks, resnet_params,
                                     small_cnn_layers, small_cnn_tensor_numels)
from meshscale.models.transformer import TransformerConfig
from meshscale.predict.training.fp8 import gather_casts, to_fp8
from meshscale.predict.training.context import CpShape, cp_attention_kernels
from meshscale.predict.training.kernels import GQA_EXPANSION, Instructions, Kernel, gemm, gemm_backward, memory_op
from meshscale.predict.training.moe import layer_params_on_rank, moe_mlp, shared_by

# Optimizer traffic per parameter as PyTorch's default (foreach) implementations run it, one pass per foreach op:
# AdamW: weight decay (mul_: 8 B), lerp_ of the first moment (12), mul_ and addcmul_ of the second (8 + 12), its
# sqrt, div_ and add_ of eps (3 x 8), addcdiv_ into the parameter (16): 80 B. SGD with momentum: weight decay
# into the gradient (12), mul_ and add_ of the buffer (8 + 12), add_ into the parameter (12): 44 B.
OPTIMIZER_BYTES_PER_PARAM = {"adamw": 80.0, "sgd": 44.0}
OPTIMIZER_OPS = {"adamw": 9, "sgd": 4}         # foreach ops per step (each one launch per tensor group)
BACKWARD_TRAFFIC = 2.0   # an element-wise op's backward reads its input and the incoming gradient, writes one
# the loss as train and torchtitan compute it: logits (compute precision) cast to fp32 (2 + 4 B), log-softmax
# (4 + 4); backward: nll_loss's zeroed fp32 gradient (4), log-softmax's backward (4 + 4 + 4), the cast back (4 + 2)
LOSS_FORWARD_BYTES, LOSS_BACKWARD_BYTES = 14.0, 22.0
GRAD_CAST_BYTES = 6.0    # a weight's gradient made in bf16 and cast to fp32 for .grad / the reduce-scatter (2 + 4)
LAYER_NORM_BACKWARD_ACCESSES = 5   # dy, x read for dx and again for the weight's gradient, dx written
# Tensor parallelism through DTensor, as train/parallel/apply.py and torchtitan plan a Llama block (ColwiseParallel
# Q, K, V, w1 and w3; RowwiseParallel wo and w2; SequenceParallel norms): the ops the host dispatches on DTensors,
# as an aten-level trace of that plan shows them (two Gloo ranks; tests/unit/test_predict_dtensor.py). A linear of a
# 3-D input decomposes before DTensor sees it (F.linear is CompositeImplicitAutograd): t, view, mm, _unsafe_view;
# its backward: two mm, four t, two view and a detach (input gradient 5, weight gradient 4); recomputed under
# selective checkpointing, its views replay and its saved mm does not (3). A norm is one op each way on the GPU
# (_fused_rms_norm and its backward, which DTensor shards). Each redistribution (the all-gather of attention's
# and the MLP's input, the reduce-scatter of wo's and w2's output) is planned and issued by DTensor: one op each
# way. Attention's core, rotary, the activations and the residual adds run on the local tensors the linears
# hand out (use_local_output): plain ops.
TP_LINEAR_DTENSOR_OPS = 4
TP_LINEAR_BACKWARD_DTENSOR_OPS = (5, 4)        # the input's gradient, the weight's
TP_LINEAR_RECOMPUTE_DTENSOR_OPS = 3
TP_LAYER_REDISTRIBUTES = 4
TP_ENDS_REDISTRIBUTES = 3   # the embedding's output reduce-scattered along the sequence, the head's input and
# its logits all-gathered


@dataclass(frozen=True)
class PassKernels:
    """One block's kernels per pass (one layer, or a whole ResNet), for one micro-batch on one rank."""

    forward: tuple[Kernel, ...]
    backward: tuple[Kernel, ...]
    recompute: tuple[Kernel, ...] = ()

    def flops(self) -> float:
        return sum(k.flops * k.count for k in self.forward + self.backward + self.recompute)

    def bytes(self) -> float:
        return sum(k.bytes * k.count for k in self.forward + self.backward + self.recompute)


def element_bytes(precision: str) -> int:
    return 4 if precision in ("fp32", "tf32") else 2


SELECTIVE_POLICIES = ("matmuls", "torchtitan")
# torchtitan's op-level selective checkpointing (models/llama3/parallelize_llama.py `_save_list` at e7c0cae, June
# 2025, and until #2095 of 2025-12-01): it saves aten.mm (every second one recomputed), SDPA's flash and
# memory-efficient kernels, reduce_scatter and max; every other op is PREFER_RECOMPUTE, which torch.compile's
# partitioner recomputes too. So float8's GEMMs (aten._scaled_mm) are all recomputed, and so is cuDNN's attention
# (aten._scaled_dot_product_cudnn_attention), the kernel SDPA runs on Hopper where it prefers cuDNN.
TORCHTITAN_SAVED_ATTENTION = ("flash", "efficient", "triton")


def on_dtensor(kernel: Kernel, tp: int) -> Kernel:
    """``kernel`` dispatched on DTensors where tensor parallelism makes them (tp > 1): a linear as its
    decomposition, any other op as itself."""
    if tp == 1:
        return kernel
    if kernel.kind == "matmul":
        return replace(kernel, ops=TP_LINEAR_DTENSOR_OPS, dtensor_ops=TP_LINEAR_DTENSOR_OPS)
    return replace(kernel, dtensor_ops=kernel.ops)


def dtensor_host(name: str, ops: int) -> Kernel:
    """Host work on DTensors that runs no kernel of its own (redistributions planned, views replayed)."""
    return Kernel(name, "host", ops=ops, dtensor_ops=ops)


def _passes(forward: list[Kernel], elementwise: list[Kernel], checkpointing: str,
            backward_only: list[Kernel] = (), selective_policy: str = "matmuls") -> PassKernels:
    """Backward of ``forward`` (GEMMs and convolutions: two products each; attention: 2.5 x its FLOPs;
    element-wise: its own backward traffic, else BACKWARD_TRAFFIC x its bytes; host work: its own again),
    ``backward_only`` kernels, and the recomputation ``checkpointing`` asks for (selective: ``elementwise``;
    under torchtitan's own op-level policy, whose `_custom_policy` saves "all compute ops, except every second
    mm" of its save list, also the 2nd, 4th, ... bf16 GEMMs of the block, every fp8 GEMM, and attention unless
    its kernel is one the list saves: `TORCHTITAN_SAVED_ATTENTION`). A linear on DTensors keeps its backward's
    products on them and, recomputed selectively with its product saved, replays its views."""
    backward: list[Kernel] = []
    for k in forward:
        if k.kind in ("matmul", "conv"):
            products = gemm_backward(k)
            if k.dtensor_ops:
                products = [replace(g, ops=n, dtensor_ops=n) for g, n in zip(products, TP_LINEAR_BACKWARD_DTENSOR_OPS)]
            backward += products
        elif k.kind == "host":
            backward.append(replace(k, name=k.name + " backward"))
        elif k.kind == "attention":
            backward.append(replace(k, name=k.name + " backward", flops=2.5 * k.flops, bytes=2 * k.bytes, n=1))
        elif k.backward_bytes is None or k.backward_bytes > 0:
            nbytes = BACKWARD_TRAFFIC * k.bytes if k.backward_bytes is None else k.backward_bytes
            fused = None if k.fused_backward_bytes is None else (k.fused_backward_bytes, 0.0)
            backward.append(replace(memory_op(k.name + " backward", nbytes, ops=k.ops, launches=k.launches,
                                              instructions=k.backward_instructions, dtensor_ops=k.dtensor_ops,
                                              fused=fused), count=k.count))
    backward += backward_only
    if checkpointing == "full":
        recompute = forward
    elif checkpointing == "selective":
        recompute = list(elementwise)
        linears = [k for k in forward if k.kind == "matmul"]
        rerun = []
        if selective_policy == "torchtitan":   # see TORCHTITAN_SAVED_ATTENTION
            rerun = [k for k in linears if not k.fp8][1::2] + [k for k in linears if k.fp8]
            recompute += [replace(k, saved_with=TORCHTITAN_SAVED_ATTENTION) for k in forward if k.kind == "attention"]
        recompute += rerun
        saved = sum(1 for k in linears if k.dtensor_ops) - sum(1 for k in rerun if k.dtensor_ops)
        if saved:
            recompute.append(dtensor_host("DTensor views replayed", TP_LINEAR_RECOMPUTE_DTENSOR_OPS * saved))
    else:
        recompute = []
    return PassKernels(tuple(forward), tuple(backward), tuple(recompute))


ROTARY_STYLES = ("pairs", "complex")


def rotary_op(style: str, e: int, elements: float) -> Kernel:
    """Rotary positions on q and k (``elements`` of them, ``e`` bytes each), per element of traffic:
    complex (torchtitan): to fp32, one complex product with the table, back (e + 4 + 8 + 4 + e each way);
    pairs (meshscale's engine, train/transformer.apply_rotary): four products of a half with cos or sin
    (4 x 4), their difference and sum (2 x 6), stacked (8); its backward: the difference's negation (4), the
    four products' (16), the sums of each half's gradients (24), each half written into the pairs (2 x 6);
    below fp32, the cast to fp32 and back each way (2 x (e + 4))."""
    fused = (2 * e * elements, 2 * e * elements)   # fused: q and k read and written once, each way
    if style == "complex":
        return memory_op("rotary", (2 * e + 16) * elements, (2 * e + 16) * elements, ops=10, fused=fused)
    casts = 2 * (e + 4) if e != 4 else 0
    return memory_op("rotary", (casts + 36) * elements, (casts + 56) * elements, ops=15, fused=fused)


def gqa_expansion(model: TransformerConfig, keys: float, tp: int, e: int) -> list[Kernel]:
    """Grouped-query attention's keys and values expanded to every query head before SDPA, as eager engines do it
    (meshscale's train: repeat_interleave; torchtitan's Llama 3 and Hugging Face's: repeat_kv, expand and
    reshape), for ``keys`` key positions: k and v read at the key/value width and written at the query heads'
    width; backward, the expanded gradients summed back (read wide, write narrow). Fused (inductor): k's
    expansion joins rotary's kernel (it writes the wide k instead of the narrow one), v's stays a copy: the wide
    k and v written forward, read backward. None for multi-head attention (and latent attention, whose heads
    are their own); a framework whose attention takes grouped heads itself drops it (`StepFramework.expands_gqa`)."""
    if model.is_mla or model.kv_heads >= model.heads:
        return []
    narrow, wide = model.kv_dim / tp, model.heads * model.value_head_dim / tp
    nbytes = 2 * e * keys * (narrow + wide)
    fused = 2 * e * keys * wide
    return [memory_op(GQA_EXPANSION, nbytes, nbytes, ops=2, fused=(fused, fused))]


def _projections(model: TransformerConfig, tokens: float, tp: int, e: int) -> list[Kernel]:
    """The attention's input projections: q, k and v apart, as train's one transformer (train/transformer.py) and
    torchtitan's Llama project them; under multi-head latent attention (torchtitan's DeepSeek-V3) the query and
    key/value latents (replicated under tensor parallelism), their RMSNorms and their up-projections to the heads."""
    d, kv = model.d_model, model.kv_dim
    if not model.is_mla:
        return [gemm("wq", tokens, model.q_dim / tp, d, e), gemm("wk", tokens, kv / tp, d, e),
                gemm("wv", tokens, kv / tp, d, e)]
    latent = model.kv_lora_rank + model.q_lora_rank
    out = [gemm("wq_a", tokens, model.q_lora_rank, d, e),
           gemm("wq_b", tokens, model.q_dim / tp, model.q_lora_rank, e)] if model.q_lora_rank else \
        [gemm("wq", tokens, model.q_dim / tp, d, e)]
    return out + [gemm("wkv_a", tokens, model.kv_lora_rank + model.qk_rope_head_dim, d, e),
                  memory_op("latent norms", 2 * e * tokens * latent, LAYER_NORM_BACKWARD_ACCESSES * e * tokens * latent,
                            ops=2),
                  gemm("wkv_b", tokens, model.heads * (model.qk_nope_head_dim + model.v_head_dim) / tp,
                       model.kv_lora_rank, e)]


def _attention_widths(model: TransformerConfig) -> tuple[float, float]:
    """(the width rotary turns per token: the queries' and keys' rotary parts; the width attention reads and
    writes per token: Q, K, V and its output)."""
    h, qk, v = model.heads, model.qk_head_dim, model.value_head_dim
    if model.is_mla:   # the rotary part of every head's query and the one shared key
        return h * model.qk_rope_head_dim + model.qk_rope_head_dim, h * (2 * qk + 2 * v)
    return model.q_dim + model.kv_dim, model.q_dim + h * v + 2 * model.kv_dim


def _ffn(model: TransformerConfig, tokens: float, tp: int, e: int, ep: int,
         imbalance: float) -> tuple[list[Kernel], list[Kernel], list[Kernel]]:
    """The MLP's kernels forward, those selective checkpointing recomputes, and GPT-2's bias gradients; of a
    mixture of experts, its MoE kernels by the share of MoE layers and the dense MLP's by the rest."""
    d, kv, f = model.d_model, model.kv_dim, model.ffn_dim
    hidden = tokens * f / tp
    if model.style == "llama":
        # fused (SwiGLU as one kernel): gate and up read, the product written; backward: the product's gradient,
        # gate and up read, their two gradients written (SiLU recomputed in registers)
        act = [memory_op("silu", 2 * e * hidden, 3 * e * hidden, fused=(0.0, 0.0)),
               memory_op("gate x up", 3 * e * hidden, 6 * e * hidden, ops=2, fused=(3 * e * hidden, 5 * e * hidden))]
        dense = [gemm("w1 (gate)", tokens, f / tp, d, e), gemm("w3 (up)", tokens, f / tp, d, e), *act,
                 gemm("w2 (down)", tokens, d, f / tp, e)]
        bias_grads = []
    else:
        act = [memory_op("gelu", 2 * e * hidden, 3 * e * hidden, fused=(2 * e * hidden, 3 * e * hidden))]
        dense = [gemm("fc", tokens, f / tp, d, e), *act, gemm("fc out", tokens, d, f / tp, e)]
        # the biases' gradients: a sum over the tokens of each linear's output gradient (q, k, v, out, fc, fc out)
        bias_grads = [memory_op("bias gradients", e * tokens * (3 * d + 2 * kv + f) / tp, ops=6)]
    dense = [on_dtensor(k, tp) for k in dense]
    if not model.is_moe:
        return dense, act, bias_grads
    share = model.moe_share()
    forward, elementwise = moe_mlp(model, tokens, tp=tp, ep=ep, e=e, imbalance=imbalance)
    forward = [on_dtensor(k, tp) for k in forward]
    if share == 1:
        return forward, elementwise, bias_grads
    return (shared_by(dense, 1 - share) + shared_by(forward, share),
            shared_by(act, 1 - share) + shared_by(elementwise, share), bias_grads)


# A layer's and the ends' kernels are a function of the shape alone, asked again for every layout a search
# tries with the same tensor, context and micro-batch shape (every split of its data-parallel ranks): kept.
@lru_cache(maxsize=4096)
def transformer_layer(model: TransformerConfig, tokens: float, seq_len: int, *, tp: int = 1, cp: int = 1,
                      precision: str = "bf16", checkpointing: str = "none", autocast: bool = False,
                      selective_policy: str = "matmuls", rotary_style: str = "pairs", ep: int = 1,
                      moe_imbalance: float = 1.0, fp8_recipe: str = "tensorwise",
                      cp_method: str = "masked", fp8_gathered: bool = False) -> PassKernels:
    """One layer's kernels for ``tokens`` tokens on this rank (a micro-batch's share after cp), as eager PyTorch
    launches them. ``autocast``: the parameters stay fp32 and torch.autocast casts each weight (4 + 2 B per
    parameter per forward) and each GEMM input coming from an fp32 norm (LayerNorm runs in fp32 under autocast,
    so the residual stream is fp32); otherwise (FSDP2 mixed precision) every activation is in the compute
    precision. Either way each weight's gradient is made in bf16 and cast to fp32 (for .grad or the
    reduce-scatter). A mixture of experts' MLP: `moe.moe_mlp` (``ep``, ``moe_imbalance``); fp8: the linears as
    fp8 GEMMs with their casts (`fp8.to_fp8`, ``fp8_recipe``; ``fp8_gathered``: weights gathered in fp8). Under context parallelism attention is
    ``cp_method``'s (context.py)."""
    e = element_bytes(precision)
    r = 4 if autocast else e                      # the residual stream and its norms
    d = model.d_model
    sp_tokens = tokens / tp                       # sequence parallel: element-wise ops on 1/tp of the tokens
    x = sp_tokens * d                             # elements of one d-wide activation of this rank
    sequences = tokens * cp / seq_len
    rotary_width, attention_width = _attention_widths(model)
    # causal attention per sequence: 2 x (qk + v head widths) x seq (seq + 1) / 2 per head; this rank: its heads;
    # Q and O, K and V once through HBM
    pair_flops = 2.0 * (model.qk_head_dim + model.value_head_dim) * (model.heads / tp)
    attention, cp_backward = [Kernel("attention", "attention", pair_flops * seq_len * (seq_len + 1) / 2 * sequences,
                                     e * tokens * attention_width / tp, m=seq_len, k=model.qk_head_dim)], []
    if cp > 1:
        shape = CpShape(sequences, seq_len, cp, d / tp, model.kv_dim / tp, model.qk_head_dim, e, pair_flops)
        attention, cp_backward = cp_attention_kernels(shape, cp_method)
    norm_bytes = (2 * r * x, LAYER_NORM_BACKWARD_ACCESSES * r * x)   # one kernel each way already
    norm = on_dtensor(memory_op("norm", *norm_bytes, fused=norm_bytes), tp)
    # x (fp32) + y (bf16) -> x; backward: the branch's gradient cast to bf16 (autocast) and the two branches'
    # gradients summed where the residual forks
    add_bytes = ((2 * r + e) * x, 3 * r * x + ((r + e) * x if r != e else 0))
    add = memory_op("residual add", *add_bytes, fused=add_bytes)
    ffn, ffn_elementwise, bias_grads = _ffn(model, tokens, tp, e, ep, moe_imbalance)
    rotary = [rotary_op(rotary_style, e, tokens * rotary_width / tp)] if model.style == "llama" else []
    # the keys each rank's attention reads: its own tokens, or under context parallelism the gathered sequence
    expand = gqa_expansion(model, tokens * cp, tp, e)
    casts = []
    if autocast and precision != "fp32":
        # each weight to bf16; the two norms' fp32 outputs to bf16 before the GEMMs they feed
        casts = [memory_op("autocast weight casts", 6.0 * model.layer_params() / tp, 0.0, ops=8),
                 # fused: the norm writes the compute precision itself
                 memory_op("autocast input casts", 2 * 6.0 * x, 2 * 6.0 * x, ops=2, fused=(0.0, 0.0))]
    # the attention kernel writes its output as (batch, seq, heads, head_dim), so the heads join as a view
    grads = [memory_op("weight gradients to fp32", GRAD_CAST_BYTES * layer_params_on_rank(model, ep, tp), ops=8)] \
        if precision != "fp32" else []
    # on DTensors under tensor parallelism: the linears, autocast's casts of their weights and inputs, the norms
    qkv, casts = ([on_dtensor(k, tp) for k in group] for group in (_projections(model, tokens, tp, e), casts))
    redistributes = [dtensor_host("DTensor redistributes", TP_LAYER_REDISTRIBUTES)] if tp > 1 else []
    out = gemm("attention out", tokens, d, model.heads * model.value_head_dim / tp, e)
    forward = [*casts, norm, *redistributes, *qkv, *rotary, *expand, *attention, on_dtensor(out, tp), add, norm, *ffn,
               add]
    elementwise = [norm, *redistributes, *rotary, *expand, *ffn_elementwise, norm]
    if precision == "fp8":
        forward, fp8_casts = to_fp8(forward, fp8_recipe, fp8_gathered)
        if fp8_casts is not None:
            forward, elementwise = [fp8_casts, *forward], [fp8_casts, *elementwise]
    return _passes(forward, elementwise, checkpointing, grads + bias_grads + cp_backward, selective_policy)


@lru_cache(maxsize=4096)
def transformer_ends(model: TransformerConfig, tokens: float, *, tp: int = 1, precision: str = "bf16",
                     autocast: bool = False) -> PassKernels:
    """The embedding lookup (and GPT-2's learned positions), the final norm, the head's GEMM over the vocabulary
    and the loss in fp32, and the embedding's dense gradient. Under tensor parallelism the embedding, the norm,
    the head (and autocast's casts for it) run on DTensors; the loss on the head's local logits."""
    e = element_bytes(precision)
    r = 4 if autocast else e
    d, v = model.d_model, model.vocab_size
    head = on_dtensor(gemm("head", tokens, v / tp, d, e), tp)
    logits = tokens * v / tp
    # fused (one kernel each way, the softmax's statistics kept per token): the logits read forward; read again
    # and their gradient written backward
    loss = memory_op("cross-entropy", LOSS_FORWARD_BYTES * logits, LOSS_BACKWARD_BYTES * logits, ops=3,
                     fused=(e * logits, 2 * e * logits))
    lookups = 2 if model.style == "gpt2" else 1
    embed = on_dtensor(memory_op("embedding", (2 * lookups + (lookups - 1)) * r * tokens * d, 0,
                                 ops=2 * lookups - 1), tp)
    final_bytes = (2 * r * tokens * d / tp, LAYER_NORM_BACKWARD_ACCESSES * r * tokens * d / tp)
    final_norm = memory_op("final norm", *final_bytes, fused=final_bytes)
    forward = [embed, on_dtensor(final_norm, tp), head, loss]
    if autocast and precision != "fp32":
        casts = memory_op("autocast head casts", 6.0 * (v * d / tp + tokens * d), 6.0 * tokens * d, ops=2)
        forward.insert(2, on_dtensor(casts, tp))
    if tp > 1:
        forward.insert(1, dtensor_host("DTensor redistributes", TP_ENDS_REDISTRIBUTES))
    passes = _passes(forward, [], "none")
    # dense fp32 gradient of the table: zeroed, the tokens' rows added (tied heads: and summed with the head's);
    # on DTensors one op (embedding_dense_backward)
    embedding_grad = memory_op("embedding gradient", (2 + 3 * model.tie_embeddings) * v * d * 4 / tp,
                               ops=2 * lookups, dtensor_ops=1 if tp > 1 else 0)
    head_grad = (memory_op("head weight gradient to fp32", GRAD_CAST_BYTES * v * d / tp),) if precision != "fp32" else ()
    return PassKernels(passes.forward, passes.backward + (embedding_grad, *head_grad))


# The foreach optimizers' ops on the GPU, by the depth of their tensor lists and whether they take a list of
# scalars (torch/optim/sgd.py and adam.py, _multi_tensor_*): SGD with momentum and weight decay: the weight decay
# (out of place: gradients, parameters, result), the buffer's mul_ and add_, the parameters' add_; AdamW: the
# decay mul_, lerp_ of the first moment, mul_ and addcmul_ of the second, its sqrt (out of place), div_ by the
# bias corrections (a scalar list) and add_ of eps, the parameters' addcdiv_ (a scalar list)
FOREACH_OPS = {"sgd": ((3, False), (1, False), (2, False), (2, False)),
               "adamw": ((1, False), (2, False), (1, False), (3, False), (2, False), (1, True), (1, False),
                         (3, True))}
# multi_tensor_apply (aten/src/ATen/native/cuda/MultiTensorApply.cuh): chunks of 65,536 elements, one block
# each; a launch takes at most 320 blocks and, by the lists' depth, at most 110 / 64 / 48 tensors (96 / 64 / 48
# with a scalar list): the limits of the 4 KB kernel-argument layout, which foreach SGD and AdamW launch on
# the H100 traces of benchmarks/predict_kernels_gpu.py (13 and 56 launches per step, the counts these limits
# give for ResNet-50 and GPT-2 small; the 32 KB layout would give 4 and 8)
FOREACH_CHUNK, FOREACH_MAX_BLOCKS = 65536, 320
FOREACH_MAX_TENSORS = {(1, False): 110, (2, False): 64, (3, False): 48, (1, True): 96, (2, True): 64,
                       (3, True): 48}


def foreach_launches(numels: list[int], depth: int, scalar_list: bool = False) -> int:
    """Kernels one foreach op launches over tensors of ``numels`` elements, packed as multi_tensor_apply packs
    them: a launch when its tensors or its blocks are full (a tensor cut by full blocks carried into the next)."""
    max_tensors = FOREACH_MAX_TENSORS[depth, scalar_list]
    launched = blocks = tensors = 0
    for numel in numels:
        if numel <= 0:
            continue
        tensors += 1
        left = ceil(numel / FOREACH_CHUNK)
        while left:                         # the tensor's chunks, as many at a time as the launch has room for
            if blocks == 0 and left > FOREACH_MAX_BLOCKS:  # launches of this tensor alone, counted at once (one
                full = (left - 1) // FOREACH_MAX_BLOCKS    # by one, a huge tensor's would be millions)
                launched, left, tensors = launched + full, left - full * FOREACH_MAX_BLOCKS, 1
            take = min(left, FOREACH_MAX_BLOCKS - blocks)
            blocks, left = blocks + take, left - take
            if blocks == FOREACH_MAX_BLOCKS or (not left and tensors == max_tensors):
                launched, blocks = launched + 1, 0
                tensors = 1 if left else 0
    return launched + (1 if blocks else 0)


@lru_cache(maxsize=4096)
def _optimizer_launches(numels: tuple[int, ...], optimizer: str) -> int:
    # a layout search prices the same stage of the same model under many layouts
    return sum(foreach_launches(list(numels), d, s) for d, s in FOREACH_OPS[optimizer])


def optimizer_kernels(params_on_rank: float, optimizer: str = "adamw",
                      numels: list[int] | None = None, dtensor: bool = False) -> list[Kernel]:
    """The optimizer step over this rank's parameters; given their tensors' sizes, with the kernels its
    foreach ops launch. ``dtensor``: the parameters are DTensors (FSDP2's shards, tensor parallelism's), so each
    foreach op over them is one dispatch through DTensor for the whole list (DTensor registers itself as a
    foreach type, torch/distributed/tensor/__init__.py, and shards the _foreach ops as lists); the steps'
    increments stay plain."""
    launches = _optimizer_launches(tuple(numels), optimizer) if numels else 0
    return [memory_op(f"{optimizer} step", params_on_rank * OPTIMIZER_BYTES_PER_PARAM[optimizer],
                      ops=OPTIMIZER_OPS[optimizer], launches=launches,
                      dtensor_ops=len(FOREACH_OPS[optimizer]) if dtensor else 0)]


def layer_tensor_numels(model: TransformerConfig, ep: int = 1) -> list[int]:
    """The sizes of one layer's parameter tensors: llama: two norms' weights and the attention's projections, then
    the MLP's three (a MoE layer: the router, the rank's experts as torchtitan's GroupedExperts holds them, three
    tensors of experts / ep stacked, and the shared experts' three); GPT-2 (as `train` builds it): the q, k, v
    and output projections and the two MLP matrices with their biases, two LayerNorms' weights and biases."""
    d, kv, f = model.d_model, model.kv_dim, model.ffn_dim
    if model.style != "llama":
        return [d, d, d * d, d, d * kv, kv, d * kv, kv, d * d, d, d, d, d * f, f, f * d, d]
    attention = [d, *(i * o for i, o in model.attention_matrices()), d]
    if not model.is_moe:
        return attention + [d * f, d * f, f * d]
    fe, fs = model.routed_ffn_dim, model.shared_ffn_dim * model.shared_experts
    experts = [model.experts // ep * d * fe] * 3
    return attention + [model.router_params()] + experts + ([d * fs] * 3 if fs else [])


def end_tensor_numels(model: TransformerConfig) -> list[int]:
    """The embedding (and GPT-2's positions), the final norm, an untied head."""
    d = model.d_model
    ends = [model.vocab_size * d] + ([model.max_seq_len * d, d, d] if model.style == "gpt2" else [d])
    return ends + ([model.head_params()] if model.head_params() else [])


def layer_tensors(model: TransformerConfig) -> int:
    """Parameter tensors of one layer: the projections (and their biases), the norms' weights (and biases)."""
    return len(layer_tensor_numels(model))


def fsdp2_unshard_kernels(model: TransformerConfig, params: float, fsdp: int, param_bytes: int,
                          tensors: int | None = None, fp8_weights: tuple[float, int] = (0.0, 0)) -> list[Kernel]:
    """What gathering one FSDP2 module's ``params`` (this rank's tp share) costs the compute stream beyond the
    all-gather (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): the gathered buffer copied out into
    each parameter (split_with_sizes_copy: read and write, one kernel); the copy-in runs on the all-gather's own
    stream. A shard group of one rank gathers nothing (_fsdp_param_group.py): each parameter is cast from its
    fp32 shard to the compute dtype and copied into place on the compute stream, two kernels per tensor.
    ``fp8_weights`` (elements, tensors of the module gathered in fp8, `fp8.gathered_weights`): their cast is
    float8's own (`fp8.gather_casts`: on the copy-in stream but for its host ops, alone on the compute stream)."""
    tensors = tensors or layer_tensors(model)
    fp8_elements, fp8_tensors = fp8_weights
    casts = [gather_casts(fp8_elements / fsdp, fp8_tensors, compute_stream=fsdp == 1)] if fp8_tensors else []
    if fsdp > 1:
        return [memory_op("FSDP copy-out", 2 * param_bytes * params), *casts]
    rest, rest_tensors = params - fp8_elements, tensors - fp8_tensors
    copies = [memory_op("FSDP cast and copy", (4 + param_bytes + 2 * param_bytes) * rest, ops=2 * rest_tensors)] \
        if rest_tensors else []
    if fp8_tensors:
        copies.append(memory_op("FSDP copy (fp8)", 2.0 * fp8_elements, ops=fp8_tensors))
    return copies + casts


def fsdp2_reduce_kernels(params: float, fsdp: int) -> list[Kernel]:
    """A one-rank shard group reduces nothing either: its fp32 reduce-scatter input is copied to the output
    (read and write, _fsdp_collectives.foreach_reduce); a real reduce-scatter writes its output itself."""
    return [] if fsdp > 1 else [memory_op("FSDP reduce copy", 8.0 * params)]


def accumulation_kernels(params_on_rank: float) -> list[Kernel]:
    """A later micro-batch's gradient added into .grad (fp32: read both, write one)."""
    return [memory_op("gradient accumulation", 12.0 * params_on_rank)]


# ---- ResNets ---------------------------------------------------------------------------------------------
# PyTorch's channels-last batch norm (aten/src/ATen/native/cuda/Normalization.cuh, flexible_launch_configs):
# blocks of up to 32 channels x up to 16 rows (512 threads), each thread ELEMENTS_PER_THREAD rows deep, at most
# MAX_H_BLOCK blocks along the rows; a grid of 8 or more blocks along the rows reduces in two stages (partial
# results staged in global memory, a zeroed semaphore per column of blocks, the last block to finish merges).
BN_TILE_W, BN_BLOCK_THREADS, BN_ELEMENTS_PER_THREAD, BN_MAX_H_BLOCK, BN_MIN_STAGED = 32, 512, 16, 128, 8


def _last_pow2(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def bn_grid_rows(rows: int, channels: int) -> int:
    """Blocks along the rows of the channels-last statistics and backward-reduce kernels (grid.y), as
    flexible_launch_configs sets them with its cooperative flag: 1 where fewer than 8 would do."""
    block_x = min(_last_pow2(channels), BN_TILE_W)
    block_y = min(_last_pow2(ceil(rows / BN_ELEMENTS_PER_THREAD)), BN_BLOCK_THREADS // block_x)
    grid_y = min(ceil(rows / (block_y * BN_ELEMENTS_PER_THREAD)), BN_MAX_H_BLOCK)
    return grid_y if grid_y >= BN_MIN_STAGED else 1


# What the loop body of each channels-last kernel issues per element (Normalization.cuh: one thread per channel
# and row, a scalar load of each input element, fp32 arithmetic), common to all four: the bounds checks and the
# row and address steps (2 + 2), and per tensor read or written its address and its load or store (2 each); per
# kernel its own arithmetic:
# statistics (Welford): count += 1, the count made a float (a conversion), 1 / count in IEEE fp32 (a reciprocal
#   and three instructions refining and checking it), is_valid, then delta, mean += delta x 1/count, delta
#   again, m2 += delta x delta' x is_valid (5): 12, of which 2 on the reciprocal/conversion unit
# transform_input: w x (x - mean) x invstd + shift (3), the ReLU-fusion select (1)
# backward_reduce: sum_dy += dy, sum_dy_xmu += dy x (x - mean) (3)
# backward_elemt: (dy - mean_dy - (x - mean) x factor1) x factor2 (4)
# Below fp32 each element read is widened (a shift: an issue slot) and each written narrowed (a conversion).
BN_COMMON_ISSUED, BN_PER_TENSOR_ISSUED = 4, 2
BN_ARITHMETIC = {"statistics": Instructions(12, 2), "transform": Instructions(4, 0),
                 "backward_reduce": Instructions(3, 0), "backward_elemt": Instructions(4, 0)}
BN_TENSORS = {"statistics": (1, 0), "transform": (1, 1), "backward_reduce": (2, 0), "backward_elemt": (2, 1)}


def bn_instructions(kernel: str, elements: float, e: int) -> Instructions:
    """What one channels-last batch-norm kernel (a key of BN_ARITHMETIC) issues over ``elements`` of ``e``
    bytes."""
    reads, writes = BN_TENSORS[kernel]
    own = BN_ARITHMETIC[kernel]
    narrow = writes if e < 4 else 0
    issued = BN_COMMON_ISSUED + BN_PER_TENSOR_ISSUED * (reads + writes) + own.issued + \
        (reads + writes if e < 4 else 0)
    return Instructions(issued, own.xu + narrow).times(elements)


def batch_norm_kernels(name: str, rows: int, channels: int, e: int, channels_last: bool = True) -> list[Kernel]:
    """One training-mode BatchNorm2d over ``rows`` (batch x pixels) of ``channels`` in ``e``-byte activations
    (bf16 under autocast: batch norm is on neither autocast list, so it keeps the convolution's bf16 output and
    its fp32 weights), the kernels PyTorch launches (batch_norm_cuda, batch_norm_backward_cuda):
    forward: num_batches_tracked += 1 (nn.BatchNorm2d), the statistics (Welford) over the rows, the running
    statistics updated and the variance inverted, the input normalized; backward: the reduction of dy and
    dy x (x - mean) (the weight's and bias's gradients), the input's gradient. A two-stage reduction (the
    channels-last kernels with grid.y > 1) first zeroes its semaphores (one more launch) and writes and reads its
    partial results (count, mean, M2 forward; two sums backward) in fp32: the staging pass. Channels-last, each
    of the four kernels over the elements also carries its instructions (`bn_instructions`): it takes the longer
    of its bytes and its instructions (the statistics kernel's Welford divides once per element)."""
    x = float(rows) * channels * e
    staged = bn_grid_rows(rows, channels) if channels_last else 1
    staging_f = 2 * 3 * 4 * channels * staged if staged > 1 else 0.0
    staging_b = 2 * 2 * 4 * channels * staged if staged > 1 else 0.0
    semaphores = 1 if staged > 1 else 0
    elements = float(rows) * channels

    def arithmetic(kernel: str) -> Instructions:
        return bn_instructions(kernel, elements, e) if channels_last else Instructions()
    # aten ops the host issues: the increment, batch norm forward (the next three kernels), its backward (all
    # three backward kernels)
    return [memory_op(f"{name} num_batches_tracked", 8.0, 0),
            memory_op(f"{name} statistics", x + staging_f, 2 * x + staging_b, ops=1, launches=1 + semaphores,
                      instructions=arithmetic("statistics"), backward_instructions=arithmetic("backward_reduce")),
            memory_op(f"{name} running statistics", 6 * 4.0 * channels, 0, ops=0, launches=1),
            memory_op(f"{name} normalize", 2 * x, 3 * x, ops=0, launches=1,
                      instructions=arithmetic("transform"), backward_instructions=arithmetic("backward_elemt"))]


def batch_norm_passes(name: str, rows: int, channels: int, e: int, channels_last: bool = True) -> PassKernels:
    """One batch norm's kernels forward and backward (what benchmarks/bn_kernels_gpu.py holds against a
    profile)."""
    return _passes(batch_norm_kernels(name, rows, channels, e, channels_last), [], "none")


def ddp_bucket_copies(params: float, tensors: int) -> Kernel:
    """DDP without gradient_as_bucket_view (torch/csrc/distributed/c10d/reducer.cpp): each fp32 gradient copied
    into its bucket as it is ready (mark_variable_ready_dense) and back into .grad after the all-reduce
    (finalize_bucket_dense, copy_bucket_to_grad): two copies of each tensor, read and write each."""
    return memory_op("DDP bucket copies", 2 * 8.0 * params, 0, ops=2 * tensors)


def resnet_step(depth: int, batch: int, *, image: int = 224, classes: int = 1000, precision: str = "bf16",
                channels_last: bool = True, autocast: bool = True) -> PassKernels:
    """A ResNet's kernels for one batch: convolutions, batch norm (a statistics pass and a normalizing pass:
    three accesses of its tensor forward; backward: dy and x read for the parameters' gradients and again for dx,
    dx written: five), ReLU (in place: two accesses; backward reads the gradient and the output, writes one),
    each block's residual add (in place; in backward the two gradients summed where the input forks), pooling, the classifier
    and the loss in fp32; under autocast each weight cast to the compute precision forward and its gradient
    back to fp32 backward."""
    e = element_bytes(precision)
    blocks, features = resnet_blocks(depth, image)
    forward: list[Kernel] = []
    for i, block in enumerate(blocks):
        for j, c in enumerate(block):
            pixels = batch * c.out_hw ** 2
            conv = gemm(f"conv{i}.{j}", pixels, c.c_out, c.c_in * c.kernel ** 2, e, kind="conv")
            # implicit GEMM: the M x K operand is never built; the input tensor is read once
            in_elements = batch * (c.out_hw * c.stride) ** 2 * c.c_in
            forward.append(replace(conv, bytes=e * (in_elements + conv.k * conv.n + conv.m * conv.n)))
            out_bytes = pixels * c.c_out * e
            forward += batch_norm_kernels(f"bn{i}.{j}", pixels, c.c_out, e, channels_last)
            forward.append(memory_op(f"relu{i}.{j}", 2 * out_bytes, 3 * out_bytes))
            if not channels_last and precision != "fp32":
                in_bytes = batch * (c.out_hw * c.stride) ** 2 * c.c_in * e
                forward.append(memory_op(f"nchw transpose{i}.{j}", 2 * (in_bytes + out_bytes)))
        if i:
            out = block[-1] if len(block) in (2, 3) else block[-2]
            add_bytes = 3 * batch * out.out_hw ** 2 * out.c_out * e
            # backward: the gradient passes through the add, and is summed where the block's input forks
            forward.append(memory_op(f"residual add{i}", add_bytes, add_bytes))
    stem = blocks[0][0]
    forward.append(memory_op("max pool", batch * stem.c_out * (stem.out_hw ** 2 + (stem.out_hw // 2) ** 2) * e))
    forward.append(memory_op("average pool", batch * features * (image // 32) ** 2 * e))
    forward.append(gemm("fc", batch, classes, features, e))
    forward.append(memory_op("cross-entropy", LOSS_FORWARD_BYTES * batch * classes,
                             LOSS_BACKWARD_BYTES * batch * classes, ops=4))
    params = resnet_params(depth, classes)
    convs = sum(len(block) for block in blocks)
    grads = []
    if autocast and precision != "fp32":
        # autocast casts what enters a convolution or a linear (each conv weight, the classifier's weight and
        # bias; batch norm is on neither of its lists and takes the bf16 activations with fp32 weights)
        bn_params = 2 * sum(c.c_out for block in blocks for c in block)
        cast = GRAD_CAST_BYTES * (params - bn_params)
        forward.append(memory_op("autocast weight casts", cast, 0, ops=convs + 2))
        grads.append(memory_op("weight gradients to fp32", cast, ops=convs + 2))
    passes = _passes(forward, [], "none", grads)
    # the images need no gradient: autograd skips the stem convolution's input gradient
    backward = tuple(replace(k, ops=1) if k.name == "conv0.0 wgrad" else k
                     for k in passes.backward if k.name != "conv0.0 dgrad")
    return replace(passes, backward=backward)


def small_cnn_step(batch: int, *, image: int = SMALL_CNN_IMAGE, classes: int = SMALL_CNN_CLASSES,
                   precision: str = "fp32", autocast: bool = True) -> PassKernels:
    """The small CNN's kernels for one batch: three implicit-GEMM convolutions with their biases, ReLU (in
    place), the max-pool after the second, the global average pool, the classifier and the loss in fp32; under
    autocast each weight cast to the compute precision forward and its gradient back to fp32 backward."""
    e = element_bytes(precision)
    forward: list[Kernel] = []
    for i, (c_in, c_out, side) in enumerate(small_cnn_layers(image)):
        pixels = batch * side * side
        conv = gemm(f"conv{i}", pixels, c_out, c_in * 9, e, kind="conv")
        forward.append(replace(conv, bytes=e * (pixels * c_in + conv.k * conv.n + conv.m * conv.n)))
        out_bytes = pixels * c_out * e
        forward.append(memory_op(f"relu{i}", 2 * out_bytes, 3 * out_bytes))
        if i == 1:   # 2x2 max-pool: read the map, write a quarter; backward scatters the gradient back
            forward.append(memory_op("max pool", 1.25 * out_bytes, 1.25 * out_bytes))
    last = small_cnn_layers(image)[-1]
    forward.append(memory_op("average pool", batch * last[1] * last[2] ** 2 * e))
    forward.append(gemm("fc", batch, classes, last[1], e))
    forward.append(memory_op("cross-entropy", LOSS_FORWARD_BYTES * batch * classes,
                             LOSS_BACKWARD_BYTES * batch * classes, ops=4))
    grads = []
    if autocast and precision != "fp32":
        cast = GRAD_CAST_BYTES * sum(small_cnn_tensor_numels(classes))
        forward.append(memory_op("autocast weight casts", cast, 0, ops=8))
        grads.append(memory_op("weight gradients to fp32", cast, ops=8))
    passes = _passes(forward, [], "none", grads)
    # the images need no gradient: autograd skips the first convolution's input gradient
    backward = tuple(replace(k, ops=1) if k.name == "conv0 wgrad" else k
                     for k in passes.backward if k.name != "conv0 dgrad")
    return replace(passes, backward=backward)
