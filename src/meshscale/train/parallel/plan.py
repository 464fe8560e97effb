"""What a layout run is checked against before any rank starts, and what its summary adds: the layout that the
options and the world size make, the rules it must obey (models/layout.check_layout), the memory it needs
(models/memory.training_memory) against the GPU's, and MFU against the GPU's datasheet peak."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from meshscale.errors import MeshscaleError, one_line
from meshscale.models.layout import CHECKPOINTING, ParallelLayout, check_layout, filled_degrees
from meshscale.models.memory import GIB, MemoryEstimate, training_memory
from meshscale.models.registry import get_model
from meshscale.models.transformer import TransformerConfig
from meshscale.train.config import TrainConfig


def with_default_layout(cfg: TrainConfig) -> TrainConfig:
    """The degree not given takes what the others leave of the ranks, as predict's layouts do
    (`filled_degrees`): fsdp, or dp where fsdp was given; with none given the ranks shard the model (fsdp = the
    world size, torchtitan's default)."""
    if cfg.world == 1:
        return cfg
    dims = ("dp", "fsdp", "tp", "pp", "cp")
    given = {k: getattr(cfg.layout, k) for k in dims if getattr(cfg.layout, k) > 1}
    if cfg.world % max(1, _product(given.values())):
        return cfg   # check_layout_run says why, in one line
    filled = filled_degrees(given, cfg.world, "fsdp")
    return replace(cfg, layout=replace(cfg.layout, **{k: filled.get(k, 1) for k in dims}))


def _product(values) -> int:
    n = 1
    for v in values:
        n *= v
    return n


def model_config(cfg: TrainConfig) -> TransformerConfig:
    from meshscale.models.transformer import load_model_config
    return load_model_config(cfg.model)


LAYOUT_COMPILE_MODES = ("default", "max-autotune")


def check_layout_run(cfg: TrainConfig) -> ParallelLayout:
    """Refuse, in one line, a layout run that cannot work: the layout's rules, the options that belong to the
    data-parallel modes, the precision, a tied head split across pipeline stages."""
    model = model_config(cfg)
    if cfg.layout.checkpointing not in CHECKPOINTING:
        raise MeshscaleError(f"--activation-checkpointing {cfg.layout.checkpointing}: use one of "
                             f"{', '.join(CHECKPOINTING)}")
    seq_len = get_model(cfg.model, cfg.layout.seq_len).input_shape[0]
    if cfg.world % cfg.layout.ep:
        raise MeshscaleError(f"--ep {cfg.layout.ep}: must divide the {cfg.world} "
                             f"{'GPUs' if cfg.device == 'cuda' else 'CPU workers'}")
    layout = check_layout(cfg.layout.parallel_layout(), cfg.world, model, seq_len, cfg.batch_per_rank)
    if cfg.mode != "ddp" or cfg.speed.cuda_graph:
        raise MeshscaleError(f"--mode and --cuda-graph are for the data-parallel models; {cfg.model} "
                             "trains under --dp/--fsdp/--tp/--pp/--cp/--ep")
    if cfg.speed.compile not in (None, *LAYOUT_COMPILE_MODES):
        raise MeshscaleError(f"--compile {cfg.speed.compile}: a layout compiles each block with "
                             f"{' or '.join(LAYOUT_COMPILE_MODES)} (CUDA graphs do not take FSDP2's streams)")
    if cfg.speed.precision not in ("fp32", "bf16", "fp8"):
        raise MeshscaleError(f"--precision {cfg.speed.precision}: transformers train in fp32, bf16 (FSDP2 mixed "
                             "precision) or fp8")
    if cfg.speed.precision == "fp8" and layout.tp > 1:
        raise MeshscaleError(f"--precision fp8 with --tp {layout.tp}: torchao's float8 tensor-parallel styles are "
                             "not wired in; use --fsdp/--dp/--pp/--cp/--ep, or bf16 with --tp")
    check_experts(cfg, model)
    if layout.tp > 1 and model.style != "llama":
        raise MeshscaleError(f"--tp {layout.tp}: tensor parallelism is implemented for Llama-style models; "
                             f"{cfg.model} is GPT-2 style: use --fsdp or --pp")
    if model.kv_heads % layout.tp:
        raise MeshscaleError(f"--tp {layout.tp}: training splits the model's {model.kv_heads} key/value heads over "
                             "the tp ranks (they are not replicated); use a --tp that divides them")
    if layout.pp > 1 and model.tie_embeddings:
        raise MeshscaleError(f"--pp {layout.pp}: {cfg.model} ties its head to its embedding, which pipeline stages "
                             "would hold apart; use --fsdp/--tp, or a model with an untied head")
    if layout.pp_schedule == "interleaved-1f1b" and layout.pp > 1 and layout.micro_batches % layout.pp:
        raise MeshscaleError(f"--micro-batches {layout.micro_batches}: interleaved 1F1B needs a multiple of "
                             f"--pp {layout.pp}")
    return layout


# what a config may say that train's attention and mixture of experts do not build (models/transformer.py):
# refused in one line rather than trained as something else
_UNTRAINED_FIELDS = ("kv_lora_rank", "qk_norm", "attention_sinks", "router_bias", "expert_bias",
                     "shared_expert_gate")


def check_experts(cfg: TrainConfig, model: TransformerConfig) -> None:
    """A mixture of experts trains Llama-style (SwiGLU experts), with the fields train builds."""
    given = [f for f in _UNTRAINED_FIELDS if getattr(model, f)]
    if model.attention_bias != "none":
        given.append("attention_bias")
    if given:
        raise MeshscaleError(f"{cfg.model}: train does not model {given[0]} (it prices it: meshscale predict); "
                             "train a Llama-style shape")
    if model.is_moe and model.style != "llama":
        raise MeshscaleError(f"{cfg.model}: mixture-of-experts layers train Llama-style (SwiGLU experts); "
                             f"{cfg.model} is {model.style} style")


def memory_needed(cfg: TrainConfig, layout: ParallelLayout) -> MemoryEstimate:
    """Per-rank bytes of the run by the model's own arithmetic (the worst pipeline stage)."""
    seq_len = get_model(cfg.model, cfg.layout.seq_len).input_shape[0]
    return training_memory(model_config(cfg), layout, batch=cfg.batch_per_rank, seq_len=seq_len,
                           precision="bf16" if cfg.speed.precision in ("bf16", "fp8") else "fp32",
                           checkpointing=cfg.layout.checkpointing, compiled=cfg.speed.compile is not None)


def check_fits(cfg: TrainConfig, layout: ParallelLayout, capacity_bytes: float, gpu_name: str) -> None:
    """One line before any work when the layout cannot fit: even the lower end of what it needs (its allocated
    peak less the accounting's uncertainty, with the CUDA context and NCCL's buffers) exceeds the GPU's memory.
    A layout the model calls tight runs (its margin is within the model's uncertainty)."""
    need = memory_needed(cfg, layout)
    if need.verdict(capacity_bytes) == "no":
        low, _ = need.bounds()
        raise MeshscaleError(
            f"{cfg.model} needs at least {low / GIB:.1f} GiB per GPU for {layout.describe()} (peak at "
            f"{need.peak.name}; batch {cfg.batch_per_rank}, --activation-checkpointing {cfg.layout.checkpointing}, "
            f"{cfg.speed.precision}), the {gpu_name} has {capacity_bytes / GIB:.1f} GiB; shard further (--fsdp, "
            "--tp, --pp), checkpoint activations or lower --batch / --seq-len")


def check_fits_gpu(cfg: TrainConfig, layout: ParallelLayout) -> None:
    import torch
    props = torch.cuda.get_device_properties(0)
    check_fits(cfg, layout, props.total_memory, props.name)


def peak_flops(device_name: str, precision: str) -> tuple[float | None, str]:
    """The datasheet dense peak FLOP/s of this GPU at the run's precision (fp32 runs count TF32 Tensor Cores,
    which PyTorch uses for fp32 matmuls only when allowed: the fp32 figure is the one stated) and its source."""
    from meshscale.topology.nvml_discovery import model_facts
    facts, known = model_facts(device_name)
    # an fp8 run counts against the bf16 peak, as torchtitan's MFU does (attention and more stay bf16)
    key = {"bf16": "bf16_flops", "fp16": "fp16_flops", "fp8": "bf16_flops"}.get(precision, "fp32_flops")
    return facts.get(key), str(facts.get("source", "")) + ("" if known else " (assumed: model not in the table)")


def layout_summary(cfg: TrainConfig, summary: dict[str, Any], layout: ParallelLayout,
                   device_name: str | None) -> dict[str, Any]:
    """Tokens/s, per GPU, the memory the layout needs beside the peak measured, MFU with its peak and source."""
    seq_len = get_model(cfg.model, cfg.layout.seq_len).input_shape[0]
    need = memory_needed(cfg, layout)
    rate = summary.get("samples_per_s")
    tokens = rate * seq_len if rate else None
    out = {"seq_len": seq_len, "tokens_per_s": tokens,
           "tokens_per_s_per_rank": tokens / cfg.world if tokens else None,
           "memory_needed_bytes": need.total_bytes, "memory_needed_allocated_bytes": need.allocated_bytes,
           "memory_needed_reserved_bytes": need.reserved_bytes, "memory_needed_moment": need.peak.name,
           "memory_needed": need.breakdown(), "layout": layout.describe(),
           "layout_degrees": layout.degrees(), "pp_schedule": layout.pp_schedule,
           "micro_batches": layout.micro_batches, "activation_checkpointing": cfg.layout.checkpointing,
           "mfu": None, "peak_flops": None, "peak_flops_source": None}
    if device_name is not None:
        peak, source = peak_flops(device_name, cfg.speed.precision)
        out.update(peak_flops=peak, peak_flops_source=source, gpu=device_name)
        if peak and rate:
            out["mfu"] = rate * summary["flops_per_sample"] / (cfg.world * peak)
    return out


MAX_LAYOUTS = 64              # runs one --layouts asks for (each a training run of its own)
MAX_LAYOUT_DEGREE = 1 << 16   # a degree no layout of a real machine exceeds (ranks of one run)


def parse_layouts(text: str) -> list[dict[str, int]]:
    """``--layouts``: comma-separated layouts, each its degrees joined by ``x`` (``fsdp4,tp2xfsdp2,pp2xcp2``);
    a dimension not named is 1. At most MAX_LAYOUTS of them, degrees up to MAX_LAYOUT_DEGREE, and no layout twice
    (``fsdp1`` and ``tp1`` are the same one rank)."""
    from meshscale.models.layout import DIMENSIONS
    items = [part.strip() for part in text.split(",")]
    if len(items) > MAX_LAYOUTS:
        raise MeshscaleError(f"--layouts: {len(items)} layouts; at most {MAX_LAYOUTS} in one sweep")
    out, seen = [], {}
    for item in items:
        degrees: dict[str, int] = {}
        for term in item.split("x") if item else [""]:
            name = term.rstrip("0123456789")
            number = term[len(name):]
            if name not in DIMENSIONS or not number or len(number) > 6 or not 1 <= int(number) <= MAX_LAYOUT_DEGREE \
                    or name in degrees:
                raise MeshscaleError(f"--layouts: {one_line(item)!r} is not a layout; write each as degrees (1 to "
                                     f"{MAX_LAYOUT_DEGREE}) joined by x, e.g. fsdp4,tp2xfsdp2 (dimensions "
                                     f"{', '.join(DIMENSIONS)})")
            degrees[name] = int(number)
        key = tuple(sorted((k, v) for k, v in degrees.items() if v > 1))
        if key in seen:
            raise MeshscaleError(f"--layouts: {item!r} is the same layout as {seen[key]!r}; give each once")
        seen[key] = item
        out.append(degrees)
    return out
