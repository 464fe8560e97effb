"""A mixture-of-experts layer's MLP in the step model, as torchtitan's MoE (and Megatron-Core's all-to-all token
dispatcher) run it, on one rank for one micro-batch (``tokens``: the micro-batch's tokens a tensor-parallel rank
routes, its whole group's after sequence parallelism's all-gather):

- the router: a d_model x experts GEMM (bf16), its softmax or sigmoid scores in fp32 and the top-k (memory-bound);
- the permutation: token counts per expert and the index that sorts the k copies of each token by expert, then the
  gather of those copies (T x k rows of d_model), and on the receiving rank a second gather by local expert;
- the dispatch all-to-all (expert parallelism): each rank sends its T x k copies to the ranks of their experts
  (`dispatch_bytes`), combine brings them back; both again in backward (and in a full recompute's forward);
  torchtitan's all_to_all_single, priced on the fabric as NCCL runs it (inside an NVLink domain, across nodes, or
  both: the busiest GPU's NVLink and its share of the node's NICs, `collective_cost`);
- the experts: grouped GEMMs (`torch._grouped_mm`) of each local expert's tokens, experts / ep of them per rank,
  each priced at its own shape on the tile model (`kernels.grouped_gemm`);
- SiLU and the gate product over the routed copies, the unpermute and the weighted sum of each token's k outputs;
- the shared experts: a dense SwiGLU MLP of their width.

Load imbalance (`TrainingJob.moe_imbalance`, --moe-imbalance): the busiest expert-parallel rank's routed tokens
over the mean; the step waits for that rank, so its experts' GEMMs, element-wise ops and the bytes it receives
grow by it. With ep 1 every rank runs every expert on its own tokens and nothing waits: it changes nothing.
The default, 1.0, is the balanced routing the published MoE benchmarks force (Megatron-Bridge's performance
summary: "we force-balance the token distribution among experts").

Experts under tensor parallelism are split like the dense MLP (Megatron's expert tensor parallelism equal to tp):
their widths / tp, every tp rank routing its group's tokens. A model whose first layers stay dense (DeepSeek's
first_k_dense_replace) is priced by its average layer: its MoE kernels counted by the share of MoE layers, its
dense MLP by the rest.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from meshscale.models.layout import ParallelLayout
from meshscale.models.transformer import TransformerConfig
from meshscale.predict.training.comm import Allocation, CollectiveCost, collective_cost
from meshscale.predict.training.kernels import Kernel, gemm, grouped_gemm, memory_op

DEFAULT_IMBALANCE = 1.0
INDEX_BYTES = 8            # int64 indices (torch.topk, argsort)
SPLITS_BYTES_PER_RANK = 8  # the token counts each rank sends every other before the dispatch (int64)


def routed_tokens(tokens: float, model: TransformerConfig, ep: int, imbalance: float) -> float:
    """Token copies the busiest rank's local experts take: its T x k, x the imbalance when experts are spread."""
    return tokens * model.experts_per_token * (imbalance if ep > 1 else 1.0)


def _router(model: TransformerConfig, tokens: float, e: int) -> list[Kernel]:
    t, x, k = tokens, model.experts, model.experts_per_token
    scores = memory_op("router scores and top-k", (e + 8) * t * x + (4 + INDEX_BYTES) * t * k,
                       (e + 12) * t * x, ops=4)
    counts = memory_op("token counts and permutation index", 3 * INDEX_BYTES * t * k, 0, ops=3)
    return [gemm("router", t, x, model.d_model, e), scores, counts]


def moe_mlp(model: TransformerConfig, tokens: float, *, tp: int = 1, ep: int = 1, e: int = 2,
            imbalance: float = DEFAULT_IMBALANCE) -> tuple[list[Kernel], list[Kernel]]:
    """A MoE layer's MLP kernels forward (see the module's docstring), and of them the element-wise ones that
    selective checkpointing recomputes."""
    d, k, local = model.d_model, model.experts_per_token, model.experts // ep
    copies = tokens * k                       # the copies this rank sends
    received = routed_tokens(tokens, model, ep, imbalance)
    per_expert = received / local
    fe = model.routed_ffn_dim / tp
    hidden = received * fe
    permute = [memory_op("permute", 2 * e * copies * d, (2 * copies + tokens) * e * d)]
    if ep > 1:    # the received copies sorted again by local expert, and back before the combine
        permute.append(memory_op("permute (local experts)", 4 * e * received * d, 4 * e * received * d, ops=2))
    experts = [grouped_gemm("experts w1 (gate)", per_expert, fe, d, e, local),
               grouped_gemm("experts w3 (up)", per_expert, fe, d, e, local)]
    act = [memory_op("experts silu", 2 * e * hidden, 3 * e * hidden),
           memory_op("experts gate x up", 3 * e * hidden, 6 * e * hidden, ops=2)]
    down = grouped_gemm("experts w2 (down)", per_expert, d, fe, e, local)
    combine = memory_op("unpermute and combine", e * (3 * copies * d + tokens * d) + 4 * copies,
                        e * (3 * copies * d + tokens * d) + 4 * copies, ops=3)
    shared = []
    if model.shared_experts:
        fs = model.shared_experts * model.shared_ffn_dim / tp
        h = tokens * fs
        shared = [gemm("shared w1 (gate)", tokens, fs, d, e), gemm("shared w3 (up)", tokens, fs, d, e),
                  memory_op("shared silu", 2 * e * h, 3 * e * h), memory_op("shared gate x up", 3 * e * h, 6 * e * h,
                                                                           ops=2),
                  gemm("shared w2 (down)", tokens, d, fs, e)]
    router = _router(model, tokens, e)
    forward = router + permute + experts + act + [down, combine] + shared
    elementwise = router[1:] + permute + act + [combine] + [s for s in shared if s.kind == "memory"]
    return forward, elementwise


def shared_by(kernels: list[Kernel], share: float) -> list[Kernel]:
    """``kernels`` counted ``share`` times (the share of a model's layers that run them)."""
    return kernels if share == 1 else [replace(x, count=x.count * share) for x in kernels]


def dispatch_bytes(model: TransformerConfig, tokens: float, ep: int, imbalance: float, e: int) -> float:
    """One all-to-all's bytes as nccl-tests sizes it (the busiest rank's buffer): its T x k routed copies of
    d_model, x the imbalance (what the busiest rank receives)."""
    return routed_tokens(tokens, model, ep, imbalance) * model.d_model * e


def all_to_all_costs(model: TransformerConfig, layout: ParallelLayout, tokens: float, allocation: Allocation,
                     imbalance: float, e: int) -> tuple[CollectiveCost, CollectiveCost]:
    """(the dispatch or combine all-to-all of one MoE layer, the token counts' exchange before a dispatch) among
    the expert-parallel group; nothing without experts or with ep 1."""
    if not model.is_moe or layout.ep == 1:
        return CollectiveCost(0.0), CollectiveCost(0.0)
    group = layout.expert_ranges()["ep"]
    tokens_a2a = collective_cost("all_to_all", dispatch_bytes(model, tokens, layout.ep, imbalance, e), group,
                                 allocation)
    splits = collective_cost("all_to_all", SPLITS_BYTES_PER_RANK * layout.ep, group, allocation)
    return tokens_a2a, splits


def layer_params_on_rank(model: TransformerConfig, ep: int, tp: int) -> float:
    """A layer's parameters a rank holds gathered (mean over the layers): its tensor-parallel share, of the
    routed experts its own (experts / ep)."""
    experts = model.expert_layer_params()
    return (model.layer_params() - experts + experts / ep) / tp


def sharded_params_on_rank(model: TransformerConfig, layout: ParallelLayout, layers: int, ends: float) -> float:
    """What the optimizer updates on a rank: its stage's layers and ``ends`` (tensor-parallel shares) sharded over
    fsdp, the routed experts split over ep and sharded over expert_fsdp."""
    experts = layers * model.expert_layer_params() / layout.tp
    rest = (layers * model.layer_params() + ends) / layout.tp - experts
    return rest / layout.fsdp + experts / (layout.ep * layout.expert_fsdp)


def fsdp_layer_costs(model: TransformerConfig, layout: ParallelLayout, allocation: Allocation, gather_bytes: float,
                     ddp: bool, reduce_bytes: float = 4.0) -> tuple[CollectiveCost, CollectiveCost, CollectiveCost]:
    """One layer's FSDP all-gather (``gather_bytes`` per parameter), reduce-scatter (``reduce_bytes``: fp32 under
    FSDP2) and replicas' all-reduce: the layer without its routed experts over fsdp and dp, the experts (this
    rank's, experts / ep) over expert_fsdp and expert_dp, one after the other."""
    experts = model.expert_layer_params() / layout.tp
    rest = model.layer_params() / layout.tp - experts
    mine = experts / layout.ep
    groups = layout.expert_ranges()

    def over(name: str, nbytes: float, ranks: Sequence[int]) -> CollectiveCost:
        return collective_cost(name, nbytes, ranks, allocation) if len(ranks) > 1 else CollectiveCost(0.0)

    def both(a: CollectiveCost, b: CollectiveCost) -> CollectiveCost:
        return CollectiveCost(a.seconds + b.seconds, max(a.channels, b.channels), a.chosen or b.chosen)
    fsdp, dp = layout.group_ranks("fsdp"), layout.group_ranks("dp")
    gather = both(over("all_gather", rest * gather_bytes, fsdp),
                  over("all_gather", mine * gather_bytes, groups["expert_fsdp"]))
    reduce = both(over("reduce_scatter", rest * reduce_bytes, fsdp),
                  over("reduce_scatter", mine * reduce_bytes, groups["expert_fsdp"]))
    replicate = CollectiveCost(0.0) if ddp else both(
        over("all_reduce", rest * 4 / layout.fsdp, dp),
        over("all_reduce", mine * 4 / layout.expert_fsdp, groups["expert_dp"]))
    return gather, reduce, replicate
