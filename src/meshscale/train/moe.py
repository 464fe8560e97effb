"""The mixture-of-experts feed-forward of train/transformer.py (torchtitan's module names: ``moe.router.gate``,
``moe.experts.w1/w2/w3``, ``moe.shared_experts.w1/w2/w3``).

Routing: the router scores each token against the routed experts (softmax, or sigmoid as DeepSeek-V3), keeps its
top k and weighs their outputs by those scores, normalized over the k when k > 1 (Mixtral, Qwen3-MoE, DeepSeek-V3;
one expert keeps its raw score, as Switch). Shared experts see every token. Dropless: every token reaches its k
experts whatever their load (no capacity factor, nothing dropped), the experts running as one grouped GEMM over
variable groups (`torch._grouped_mm` where it has a kernel: bf16 on sm90/sm100) or a loop over the experts.

Expert parallelism: a rank holds experts / ep of them; a token goes to its expert's rank and comes back by
all-to-all with variable splits over the ep group, after the ranks exchange how many tokens each expert gets.

Load balancing: Switch Transformers' auxiliary loss alpha E sum_e f_e P_e (Fedus et al. 2021, eq. 4-6; f_e the
share of the token slots routed to expert e, P_e its mean normalized score; alpha when balanced) taken per sequence, as DeepSeek-V3's sequence-wise balance
loss (DeepSeek-V3 report, eq. 17-20), so that every layout adds up the same terms: the ranks that hold parts of a
sequence (cp, tp) add their counts. It enters the backward only, as Megatron-LM's MoEAuxLossAutoScaler puts it
there: the reported loss stays the language model's, and the auxiliary one is reported beside it."""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from meshscale.models.transformer import TransformerConfig

AUX_LOSS_COEF = 0.01   # alpha: Switch Transformers, section 2.2 ("alpha = 10^-2 ... throughout this work")


# ---- the shape -----------------------------------------------------------------------------------------------
def is_moe_layer(cfg: TransformerConfig, layer: int) -> bool:
    """Whether layer ``layer`` has experts: after the first ``dense_layers``, every ``moe_every``-th (Qwen2-MoE's
    decoder_sparse_step), as `TransformerConfig.moe_layer_count` counts them."""
    if not cfg.is_moe or layer < cfg.dense_layers:
        return False
    return (layer - cfg.dense_layers + 1) % cfg.moe_every == 0


# ---- autograd helpers ----------------------------------------------------------------------------------------
class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times ``scale``: a parameter whose gradient the layout's FSDP group averages
    over other ranks than the data's (train/parallel/apply.py sets the factor that makes it the data's mean)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


class _AuxLoss(torch.autograd.Function):
    """Returns ``out``; in backward also gives ``aux`` the gradient ``scale`` (Megatron-LM's MoEAuxLossAutoScaler):
    the auxiliary loss joins the objective without changing the reported loss."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        ctx.aux_shape = aux.shape
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, torch.full(ctx.aux_shape, ctx.scale, dtype=torch.float32, device=grad.device), None


def weight(param: torch.Tensor, grad_scale: float) -> torch.Tensor:
    """A parameter as the forward uses it: this rank's experts of an expert-parallel DTensor, the gradient scaled."""
    from torch.distributed.tensor import DTensor
    local = param.to_local() if isinstance(param, DTensor) else param
    return _ScaleGrad.apply(local, grad_scale) if grad_scale != 1.0 else local


# ---- experts -------------------------------------------------------------------------------------------------
def grouped_mm_usable(x: torch.Tensor, w: torch.Tensor) -> bool:
    """`torch._grouped_mm`'s kernel: CUDA sm90/sm100, bf16, rows 16-byte aligned (PyTorch's GroupedBlas.cpp;
    elsewhere torch runs a loop of its own, or has no such op)."""
    if not (hasattr(torch, "_grouped_mm") and x.is_cuda):
        return False
    return (torch.cuda.get_device_capability(x.device)[0] in (9, 10) and x.dtype == w.dtype == torch.bfloat16
            and x.shape[-1] % 8 == 0 and w.shape[-1] % 8 == 0)


def grouped_swiglu(x: torch.Tensor, counts: torch.Tensor, w1, w2, w3) -> torch.Tensor:
    """Each expert's SwiGLU on its rows of ``x`` (rows grouped by expert, ``counts`` per expert) as three grouped
    GEMMs."""
    offs = counts.cumsum(0).to(torch.int32)
    h = F.silu(torch._grouped_mm(x, w1, offs=offs)) * torch._grouped_mm(x, w3, offs=offs)
    return torch._grouped_mm(h, w2, offs=offs)


def looped_swiglu(x: torch.Tensor, counts: torch.Tensor, w1, w2, w3) -> torch.Tensor:
    """`grouped_swiglu` as a loop over the experts (an expert without tokens still runs, on no rows)."""
    parts = x.split(counts.tolist())
    return torch.cat([(F.silu(p @ w1[e]) * (p @ w3[e])) @ w2[e] for e, p in enumerate(parts)])


class GroupedExperts(nn.Module):
    """``experts`` SwiGLU experts stacked: w1, w3 (experts, d_model, width), w2 (experts, width, d_model)."""

    def __init__(self, experts: int, d_model: int, width: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(experts, d_model, width))
        self.w3 = nn.Parameter(torch.empty(experts, d_model, width))
        self.w2 = nn.Parameter(torch.empty(experts, width, d_model))
        for w in (self.w1, self.w2, self.w3):
            nn.init.normal_(w, std=0.02)   # GPT-2's, as every other matrix (train/transformer.py)
        self.grad_scale = 1.0
        self.kernel: Optional[str] = None    # "grouped_mm" or "loop", once run

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = (weight(w, self.grad_scale) for w in (self.w1, self.w2, self.w3))
        grouped = grouped_mm_usable(x, w1)
        self.kernel = "grouped_mm" if grouped else "loop"
        return (grouped_swiglu if grouped else looped_swiglu)(x, counts, w1, w2, w3)


class SharedExperts(nn.Module):
    """The shared experts as one SwiGLU of their summed width (w1, w3: width x d_model; w2: d_model x width)."""

    def __init__(self, d_model: int, width: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, width, bias=False)
        self.w3 = nn.Linear(d_model, width, bias=False)
        self.w2 = nn.Linear(width, d_model, bias=False)
        self.grad_scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = (weight(m.weight, self.grad_scale) for m in (self.w1, self.w2, self.w3))
        return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)


class Router(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.experts, bias=False)
        self.top_k, self.sigmoid = cfg.experts_per_token, cfg.router == "sigmoid"
        self.grad_scale = 1.0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(weights (n, k), chosen experts (n, k), every expert's normalized score (n, E)), in fp32."""
        scores = F.linear(x, weight(self.gate.weight, self.grad_scale)).float()
        scores = scores.sigmoid() if self.sigmoid else scores.softmax(dim=-1)
        top, chosen = scores.topk(self.top_k, dim=-1)
        if self.top_k > 1:
            top = top / top.sum(dim=-1, keepdim=True)
        return top, chosen, scores / scores.sum(dim=-1, keepdim=True) if self.sigmoid else scores


# ---- the layer -----------------------------------------------------------------------------------------------
class MoE(nn.Module):
    """Routed experts (and shared ones) in place of a layer's MLP; input and output (batch, seq, d_model).

    Set by the layout (train/parallel/apply.py): ``ep_group`` (expert parallelism: this rank holds the experts
    ep_rank x E/ep onwards), ``sequence_group`` (the ranks whose tokens make up the same sequences: cp x tp),
    ``aux_scale`` (the auxiliary loss's gradient on this rank) and each part's ``grad_scale``."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.experts_count, self.top_k = cfg.experts, cfg.experts_per_token
        self.router = Router(cfg)
        self.experts = GroupedExperts(cfg.experts, cfg.d_model, cfg.routed_ffn_dim)
        # the shared experts as one SwiGLU: their widths side by side (DeepSeek's n_shared_experts x
        # moe_intermediate_size)
        self.shared_experts = SharedExperts(cfg.d_model, cfg.shared_experts * cfg.shared_ffn_dim) \
            if cfg.shared_experts else None
        self.ep_group: Any = None
        self.sequence_group: Any = None
        self.aux_scale = 1.0
        self.reset_counters()

    def reset_counters(self, device: torch.device | None = None) -> None:
        """Per rank, since the counters were last read: tokens routed to each expert, auxiliary loss, forwards
        (on ``device``: a model built on the meta device sets them again once materialized)."""
        self.routed = torch.zeros(self.experts_count, dtype=torch.float64, device=device)
        self.aux_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.forwards = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, chosen, scores = self.router(tokens)
        out = self._route(tokens, weights, chosen)
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        aux = self._balance_loss(scores, chosen, x.shape[0])
        return _AuxLoss.apply(out, aux, self.aux_scale).view_as(x)

    def _route(self, tokens: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """Each token's k expert outputs, weighed and summed. Its slots sorted by expert (stable: ties keep token
        order, so any layout sums a token's outputs in the same order)."""
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.experts_count)
        token = order // self.top_k
        rows = tokens[token]
        y = self._dispatch(rows, counts) if self.ep_group is not None else self.experts(rows, counts)
        if torch._C._current_graph_task_id() == -1:   # not a checkpointed layer's recomputation in backward
            self.routed = self.routed.to(counts.device) + counts
        y = y * weights.reshape(-1)[order].unsqueeze(-1).to(y.dtype)
        return tokens.new_zeros(tokens.shape).index_add(0, token, y)

    def _dispatch(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """``rows`` (grouped by expert) through their experts on the experts' ranks and back: the counts exchanged,
        then the rows by all-to-all, regrouped by local expert, computed, and returned the same way."""
        import torch.distributed._functional_collectives as funcol
        group = self.ep_group
        ep = group.size()
        local = self.experts_count // ep
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=group)   # from each rank, its rows per local expert
        received = received.view(ep, local)
        send, recv = torch.stack([counts.view(ep, local).sum(1), received.sum(1)]).tolist()   # one host sync
        x = funcol.all_to_all_single_autograd(rows, recv, send, group)
        # the rows came by source rank, then expert: the grouped GEMM wants them by expert
        expert = torch.arange(local, device=rows.device).repeat(ep).repeat_interleave(received.reshape(-1),
                                                                                  output_size=sum(recv))
        order = expert.argsort(stable=True)
        y = self.experts(x[order], received.sum(0))
        return funcol.all_to_all_single_autograd(y[order.argsort()], send, recv, group)

    def _balance_loss(self, scores: torch.Tensor, chosen: torch.Tensor, batch: int) -> torch.Tensor:
        """This rank's part of the sequence-wise balance loss, averaged over its sequences: alpha x E x sum_e
        f_e P_e with a sequence's counts (added over the ranks that hold its other tokens) and this rank's share
        of its scores (the shares add up to P_e)."""
        experts = self.experts_count
        local = scores.shape[0] // batch
        hits = torch.zeros(batch, experts, device=scores.device).scatter_add_(
            1, chosen.reshape(batch, -1), torch.ones(chosen.numel(), device=scores.device).view(batch, -1))
        seq_len = local
        if self.sequence_group is not None:
            dist.all_reduce(hits, group=self.sequence_group)
            seq_len *= self.sequence_group.size()
        f = hits * experts / (self.top_k * seq_len)
        p = scores.reshape(batch, local, experts).sum(1) / seq_len
        aux = AUX_LOSS_COEF * (f * p).sum(1).mean()
        if torch._C._current_graph_task_id() == -1:
            self.aux_sum = self.aux_sum.to(aux.device) + aux.detach() * self.aux_scale
            self.forwards += 1
        return aux


# ---- what a run reports --------------------------------------------------------------------------------------
def moe_counters(modules: list[nn.Module], steps: int) -> dict[str, Any] | None:
    """This rank's mixture-of-experts figures per step, over ``steps`` steps: by layer, the token slots its own
    tokens routed to each expert (the ranks' sum is the batch's); the balance loss as this rank's backward took
    it, summed over its layers; the experts' kernel. None without MoE layers."""
    routed: dict[str, list[float]] = {}
    aux, kernel = 0.0, None
    for module in modules:
        for name, block in module.layers.items():
            moe = getattr(block, "moe", None)
            if moe is None:
                continue
            routed[name] = (moe.routed / max(steps, 1)).tolist()
            aux += moe.aux_sum.item() / max(moe.forwards, 1)
            kernel = moe.experts.kernel or kernel
    return {"tokens_per_expert": routed, "aux_loss": aux, "experts_gemm": kernel} if routed else None


def moe_summary(ranks: list[dict[str, Any] | None], loss_ranks: int, ep_comm: dict[str, Any] | None) -> dict[str, Any]:
    """The run's mixture-of-experts figures per step from every rank's `moe_counters`: token slots per expert by
    layer (the ranks' sum), the most loaded expert over the mean (worst layer; 1: balanced), the balance loss
    (its shares summed and averaged as the loss is, over ``loss_ranks``: dp x fsdp x ep x cp), nothing dropped
    (dropless), and expert parallelism's all-to-all bytes and seconds per step on a rank (``ep_comm``: the
    dimension's communication as the flight recorder and profiler measured it)."""
    ranks = [r for r in ranks if r]
    layers: dict[str, list[float]] = {}
    for r in ranks:
        for name, counts in r["tokens_per_expert"].items():
            layers[name] = [a + b for a, b in zip(layers.get(name, [0.0] * len(counts)), counts)]
    imbalance = max((max(c) / (sum(c) / len(c)) for c in layers.values() if sum(c) > 0), default=None)
    ep_comm = ep_comm or {}
    return {"tokens_per_expert": dict(sorted(layers.items(), key=lambda kv: int(kv[0]))),
            "expert_load_max_over_mean": imbalance, "dropped_tokens": 0,
            "aux_loss": sum(r["aux_loss"] for r in ranks) / loss_ranks,
            "experts_gemm": next((r["experts_gemm"] for r in ranks if r["experts_gemm"]), None),
            "all_to_all_bytes": ep_comm.get("bytes"), "all_to_all_s": ep_comm.get("seconds"),
            "all_to_all_exposed_s": ep_comm.get("exposed_seconds")}
