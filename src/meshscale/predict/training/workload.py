"""The kernels of one training step, from the model's configuration alone (no engine imported).

Transformers (Llama and GPT-2 styles, as `meshscale.models` describes them): per layer and micro-batch, the
forward's kernels as eager PyTorch runs them, the backward's (each GEMM's two products, attention's backward,
the element-wise ops' gradients at about twice their forward traffic) and what activation checkpointing
recomputes. full: the whole forward. selective: torchtitan's op-level policy, which saves the output of every
compute op except every second matrix multiplication of a block (its `_custom_policy`: "Saves output of all
compute ops, except every second mm"), so the element-wise ops and the 2nd, 4th, ... GEMMs run again (Llama:
wk, wo, w3; GPT-2's fused qkv: the attention and MLP output projections). `models.memory` counts selective as
keeping every GEMM output, the larger of the two. Tensor parallelism (with sequence parallelism, as torchtitan applies it) splits the GEMMs' inner
widths and the element-wise ops' tokens by tp; context parallelism splits the tokens by cp.

ResNets: the torchvision architecture (v1.5: stride on the 3x3 convolution), every convolution as the implicit
GEMM cuDNN runs (M = batch x output pixels, N = output channels, K = input channels x kernel area; NVIDIA Deep
Learning Performance Guide, "Convolutional Layers"), batch norm and ReLU as separate memory-bound kernels. A
tensor-core convolution wants NHWC: in NCHW (no --channels-last) cuDNN transposes each convolution's input and
output (same guide), which is priced as one more read and write of each.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from meshscale.models.memory import LOGIT_BYTES_PER_ELEMENT
from meshscale.models.transformer import TransformerConfig
from meshscale.predict.training.kernels import Kernel, gemm, gemm_backward, memory_op

# AdamW (fused/foreach) reads parameter, gradient and both fp32 moments and writes three back (28 B), plus the
# gradient-norm clip's read (4 B); SGD with momentum reads parameter, gradient, buffer and writes two (20 B).
OPTIMIZER_BYTES_PER_PARAM = {"adamw": 32.0, "sgd": 20.0}
BACKWARD_TRAFFIC = 2.0   # an element-wise op's backward reads its input and the incoming gradient, writes one


@dataclass(frozen=True)
class PassKernels:
    """One block's kernels per pass (one layer, or a whole ResNet), for one micro-batch on one rank."""

    forward: tuple[Kernel, ...]
    backward: tuple[Kernel, ...]
    recompute: tuple[Kernel, ...] = ()

    def flops(self) -> float:
        return sum(k.flops * k.count for k in self.forward + self.backward + self.recompute)


def element_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def _passes(forward: list[Kernel], elementwise: list[Kernel], checkpointing: str) -> PassKernels:
    """Backward of ``forward`` (GEMMs and convolutions: two products each; attention: 2.5 x its FLOPs;
    element-wise: BACKWARD_TRAFFIC x its bytes) and the recomputation ``checkpointing`` asks for (selective:
    ``elementwise`` and every second GEMM)."""
    backward: list[Kernel] = []
    for k in forward:
        if k.kind in ("matmul", "conv"):
            backward += gemm_backward(k)
        elif k.kind == "attention":
            backward.append(Kernel(k.name + " backward", "attention", 2.5 * k.flops, 2 * k.bytes))
        else:
            backward.append(memory_op(k.name + " backward", BACKWARD_TRAFFIC * k.bytes))
    if checkpointing == "full":
        recompute = forward
    elif checkpointing == "selective":
        recompute = elementwise + [k for k in forward if k.kind == "matmul"][1::2]
    else:
        recompute = []
    return PassKernels(tuple(forward), tuple(backward), tuple(recompute))


def transformer_layer(model: TransformerConfig, tokens: float, seq_len: int, *, tp: int = 1, cp: int = 1,
                      precision: str = "bf16", checkpointing: str = "none", autocast: bool = False) -> PassKernels:
    """One layer's kernels for ``tokens`` tokens on this rank (a micro-batch's share after cp). ``autocast``:
    the parameters stay fp32 and torch.autocast casts them (6 B per parameter per forward) and the fp32 residual
    stream (LayerNorm runs in fp32 under autocast) before each GEMM; otherwise (FSDP2 mixed precision) every
    activation is in the compute precision."""
    e = element_bytes(precision)
    r = 4 if autocast else e                      # the residual stream and its norms
    d, kv, f, hd = model.d_model, model.kv_dim, model.ffn_dim, model.head_dim
    sp_tokens = tokens / tp                       # sequence parallel: element-wise ops on 1/tp of the tokens
    act = sp_tokens * d * r                       # one d-wide activation of this rank
    norm_bytes = 2 * act
    sequences = tokens * cp / seq_len
    # causal attention per sequence: 4 x head_dim x seq (seq + 1) / 2 per head; this rank: its heads, its share
    attention_flops = 4.0 * hd * (model.heads / tp) * seq_len * (seq_len + 1) / 2 * sequences / cp
    attention_bytes = e * tokens * (2 * d + 2 * kv) / tp   # Q and O, K and V once through HBM
    norm, add = memory_op("norm", norm_bytes), memory_op("residual add", 1.5 * norm_bytes)
    if model.style == "llama":
        mlp = [gemm("w1 (gate)", tokens, f / tp, d, e), gemm("w3 (up)", tokens, f / tp, d, e)]
        act_ops = [memory_op("silu", 2 * tokens * f / tp * e), memory_op("gate x up", 3 * tokens * f / tp * e)]
        rotary = [memory_op("rotary", 2 * tokens * (d + kv) / tp * e)]
        down = gemm("w2 (down)", tokens, d, f / tp, e)
    else:
        mlp = [gemm("fc", tokens, f / tp, d, e)]
        act_ops = [memory_op("gelu", 2 * tokens * f / tp * e)]
        rotary = []
        down = gemm("fc out", tokens, d, f / tp, e)
    casts = []
    if autocast and precision != "fp32":
        casts = [memory_op("autocast weight casts", 6.0 * model.layer_params() / tp),
                 memory_op("autocast input cast", 2 * 6.0 * tokens * d)]
    if model.style == "llama":   # torchtitan's separate wq, wk, wv
        qkv = [gemm("wq", tokens, d / tp, d, e), gemm("wk", tokens, kv / tp, d, e), gemm("wv", tokens, kv / tp, d, e)]
    else:
        qkv = [gemm("qkv", tokens, (d + 2 * kv) / tp, d, e)]
    forward = [*casts, norm, *qkv, *rotary,
               Kernel("attention", "attention", attention_flops, attention_bytes),
               gemm("attention out", tokens, d, d / tp, e), add, norm, *mlp, *act_ops, down, add]
    return _passes(forward, [norm, *rotary, *act_ops, norm], checkpointing)


def transformer_ends(model: TransformerConfig, tokens: float, *, tp: int = 1, precision: str = "bf16") -> PassKernels:
    """The embedding lookup, the final norm, the head's GEMM over the vocabulary and the loss (bf16 logits,
    fp32 log-probabilities and their gradient), and the embedding's dense gradient."""
    e = element_bytes(precision)
    d, v = model.d_model, model.vocab_size
    head = gemm("head", tokens, v / tp, d, e)
    logits = memory_op("cross-entropy", tokens * v / tp * LOGIT_BYTES_PER_ELEMENT)
    forward = [memory_op("embedding", 2 * tokens * d * e), memory_op("final norm", 2 * tokens * d * e / tp), head, logits]
    passes = _passes(forward, [], "none")
    embedding_grad = memory_op("embedding gradient", 2 * v * d * 4 / tp)   # dense fp32 gradient, zeroed and filled
    return PassKernels(passes.forward, passes.backward + (embedding_grad,))


def optimizer_kernels(params_on_rank: float, optimizer: str = "adamw") -> list[Kernel]:
    return [memory_op(f"{optimizer} step", params_on_rank * OPTIMIZER_BYTES_PER_PARAM[optimizer])]


# ---- ResNets ---------------------------------------------------------------------------------------------
RESNET_BLOCKS = {18: ("basic", (2, 2, 2, 2)), 34: ("basic", (3, 4, 6, 3)), 50: ("bottleneck", (3, 4, 6, 3)),
                 101: ("bottleneck", (3, 4, 23, 3)), 152: ("bottleneck", (3, 8, 36, 3))}


@dataclass(frozen=True)
class Conv:
    c_in: int
    c_out: int
    kernel: int
    stride: int
    out_hw: int     # output height (= width)


def resnet_blocks(depth: int, image: int = 224) -> tuple[list[list[Conv]], int]:
    """A torchvision ResNet at ``image`` pixels as its stem and residual blocks (each a list of convolutions,
    the projection shortcut last where there is one), and the channels into the classifier."""
    if depth not in RESNET_BLOCKS:
        raise ValueError(depth)
    style, counts = RESNET_BLOCKS[depth]
    hw = image // 2
    blocks = [[Conv(3, 64, 7, 2, hw)]]
    hw //= 2                              # max pool
    c_in, expansion = 64, 4 if style == "bottleneck" else 1
    for stage, count in enumerate(counts):
        width = 64 * 2 ** stage
        for b in range(count):
            stride = 2 if stage > 0 and b == 0 else 1
            out = hw // stride
            if style == "bottleneck":
                block = [Conv(c_in, width, 1, 1, hw), Conv(width, width, 3, stride, out),
                         Conv(width, width * expansion, 1, 1, out)]
            else:
                block = [Conv(c_in, width, 3, stride, out), Conv(width, width, 3, 1, out)]
            if b == 0 and (stride != 1 or c_in != width * expansion):
                block.append(Conv(c_in, width * expansion, 1, stride, out))    # the projection shortcut
            blocks.append(block)
            c_in, hw = width * expansion, out
    return blocks, c_in


def resnet_params(depth: int, classes: int = 1000) -> int:
    """Parameters: convolution weights, two per batch-norm channel, the classifier (torchvision's count)."""
    blocks, features = resnet_blocks(depth)
    return (sum(c.c_in * c.c_out * c.kernel ** 2 + 2 * c.c_out for block in blocks for c in block)
            + features * classes + classes)


def resnet_step(depth: int, batch: int, *, image: int = 224, classes: int = 1000, precision: str = "bf16",
                channels_last: bool = True, autocast: bool = True) -> PassKernels:
    """A ResNet's kernels for one batch: convolutions, batch norm (a statistics pass and a normalizing pass:
    three accesses of its tensor forward), ReLU, each block's residual add, pooling and the classifier."""
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
            forward += [memory_op(f"bn{i}.{j}", 3 * out_bytes), memory_op(f"relu{i}.{j}", 2 * out_bytes)]
            if not channels_last and precision != "fp32":
                in_bytes = batch * (c.out_hw * c.stride) ** 2 * c.c_in * e
                forward.append(memory_op(f"nchw transpose{i}.{j}", 2 * (in_bytes + out_bytes)))
        if i:
            out = block[-1] if len(block) in (2, 3) else block[-2]
            forward.append(memory_op(f"residual add{i}", 3 * batch * out.out_hw ** 2 * out.c_out * e))
    stem = blocks[0][0]
    forward.append(memory_op("max pool", batch * stem.c_out * (stem.out_hw ** 2 + (stem.out_hw // 2) ** 2) * e))
    forward.append(memory_op("average pool", batch * features * (image // 32) ** 2 * e))
    forward.append(gemm("fc", batch, classes, features, e))
    forward.append(memory_op("cross-entropy", batch * classes * LOGIT_BYTES_PER_ELEMENT))
    if autocast and precision != "fp32":
        forward.append(memory_op("autocast weight casts", 6.0 * resnet_params(depth, classes)))
    return _passes(forward, [], "none")
