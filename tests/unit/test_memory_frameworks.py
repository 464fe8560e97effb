"""What a framework does to a step's memory, by mechanism: a compiled block saves what AOTAutograd's partitioner
saves (against the partitioner itself on meshscale's block), a compiled loss holds no more than the eager one,
the caching allocator's segments for the loss's tensors (a replay against hand-counted cases and a property),
FSDP2's root all-gather buffer and fp8 all-gathers priced by hand on a small model, and the published memory
figures the training corpus reads (what they count, refused when malformed)."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from meshscale.models.layout import ParallelLayout
from meshscale.models.memory import (LOSS_BYTES_PER_LOGIT, LOSS_EVENTS, RECIPES, RankShape, layer_saved_bytes,
                                     loss_bytes, loss_idle_bytes, loss_segments_per_logit, root_gather_buffer_bytes,
                                     training_memory)
from meshscale.models.registry import preset
from meshscale.models.transformer import TransformerConfig

from block_probe import probe_block


def _compiled_saved_bytes(cfg: TransformerConfig, policy: str, batch: int, seq: int) -> int:
    """Bytes the forward graph of one of meshscale's blocks, compiled through AOTAutograd with the min-cut
    partitioner (what Inductor partitions with), hands to backward: distinct storages, parameters and the rotary
    tables aside, the block's input included."""
    from functorch.compile import min_cut_rematerialization_partition, make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    holder, cos, sin, positions = probe_block(cfg, policy, seq)
    kept = {p.untyped_storage().data_ptr() for p in [*holder.parameters(), cos, sin, positions]}
    found = {}

    def forward_compiler(gm, _inputs):
        def run(args):
            outs = gm(*args)
            saved = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in outs[1:]
                     if isinstance(t, torch.Tensor)}
            found["bytes"] = sum(n for ptr, n in saved.items() if ptr not in kept)
            return outs
        run._boxed_call = True
        return run

    backend = aot_autograd(fw_compiler=forward_compiler, bw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                           partition_fn=min_cut_rematerialization_partition)
    torch._dynamo.reset()
    compiled = torch.compile(holder.layers["0"], backend=backend, fullgraph=True)
    x = torch.randn(batch, seq, cfg.d_model, dtype=torch.bfloat16, requires_grad=True)
    compiled(x, cos, sin, positions)
    return found["bytes"]


def _shape(cfg: TransformerConfig, policy: str, batch: int, seq: int, compiled: bool, selective: str = "matmuls",
           recipe: str = "meshscale") -> RankShape:
    return RankShape(cfg, ParallelLayout(), 0, RECIPES[recipe], "bf16", policy, selective, "fsdp2", False, False,
                     batch, seq, compiled=compiled)


@pytest.mark.parametrize("style,policy", [("llama", "none"), ("llama", "selective"), ("gpt2", "selective")])
def test_a_compiled_block_saves_what_the_partitioner_saves_for_meshscales_block(style, policy):
    cfg = TransformerConfig("t", 1, 64, 4, 2 if style == "llama" else 4, 96, 64, 64, style)
    saved = _compiled_saved_bytes(cfg, policy, 1, 16)
    assert saved == layer_saved_bytes(_shape(cfg, policy, 1, 16, compiled=True)), (style, policy)
    assert saved < layer_saved_bytes(_shape(cfg, policy, 1, 16, compiled=False))


def test_compiling_never_saves_more_and_torchtitans_policy_drops_the_down_projection_by_hand():
    rng = random.Random(5)
    for _ in range(30):
        heads = rng.choice([4, 8, 32])
        cfg = TransformerConfig("t", 4, 128 * heads, heads, rng.choice([1, 2, 4]), rng.choice([3, 4]) * 128 * heads,
                                32000, 8192, rng.choice(["llama", "gpt2"]))
        for policy in ("none", "selective", "full"):
            for selective in ("matmuls", "torchtitan"):
                eager, compiled = (layer_saved_bytes(_shape(cfg, policy, 2, 4096, c, selective)) for c in (False, True))
                assert compiled <= eager
                assert (compiled == eager) == (policy == "full" or (cfg.style == "gpt2" and (
                    policy == "none" or selective == "torchtitan")))
    # torchtitan's op policy on Llama 3 8B, 2 x 8192 tokens: eager keeps 4 d + kv + f per token in bf16 (the input;
    # Q, V, attention's output; the gate and the down projection) and a fp32 log-sum-exp per head; compiled, 3 d
    cfg, tokens = preset("llama3-8b"), 2 * 8192
    lse = 4 * cfg.heads * tokens
    for compiled, widths in ((False, 4 * 4096 + 1024 + 14336), (True, 3 * 4096 + 1024 + 14336)):
        shape = _shape(cfg, "selective", 2, 8192, compiled, "torchtitan", "torchtitan")
        assert layer_saved_bytes(shape) == 2 * widths * tokens + lse


def test_a_compiled_loss_never_holds_more_than_the_eager_one():
    rng = random.Random(9)
    for _ in range(40):
        cfg = TransformerConfig("t", 2, 512, 8, 8, 1536, rng.choice([32000, 50368, 128256]), 8192,
                                rng.choice(["llama", "gpt2"]))
        layout = ParallelLayout(tp=rng.choice([1, 2, 4]))
        base = RankShape(cfg, layout, 0, RECIPES["torchtitan"], rng.choice(["bf16", "fp32"]), "selective",
                         "torchtitan", "fsdp2", False, rng.random() < 0.5, rng.choice([1, 2]), rng.choice([2048, 8192]))
        eager, compiled = replace(base, compiled=False), replace(base, compiled=True)
        assert compiled.loss == "compiled" and eager.loss == "eager"
        assert all(c <= e for c, e in zip(loss_bytes(compiled), loss_bytes(eager)))
        assert loss_idle_bytes(compiled) <= loss_idle_bytes(eager)
    # a recipe that leaves its loss eager under compile (torchtitan of 2024, meshscale's engine) keeps it
    assert replace(base, recipe=RECIPES["torchtitan-2024"], compiled=True).loss == "eager"
    # the eager loss's idle segment: 2 B a logit of bf16 logits, none where a pipeline stage keeps them alive
    eager = replace(base, precision="bf16", compiled=False, layout=ParallelLayout())
    assert loss_idle_bytes(eager) == 2 * eager.tokens * cfg.vocab_size
    assert loss_idle_bytes(replace(eager, layout=ParallelLayout(pp=2, micro_batches=2), stage=1)) == 0


def test_the_loss_segments_replay_matches_hand_counts_and_never_holds_less_than_is_alive():
    # eager, per logit: bf16 logits (2), fp32 copy (4), log_softmax (4); the copy's segment serves nll_loss's
    # gradient, log_softmax's gradient (4) needs a new one (the logits' 2 cannot hold it): 2 + 4 + 4 + 4 reserved,
    # 12 alive at most (the backward's three fp32 tensors)
    assert loss_segments_per_logit(LOSS_EVENTS["eager"]) == (14.0, 12.0)
    for kind, events in LOSS_EVENTS.items():   # the replay's peak is the larger of the loss's two moments
        assert loss_segments_per_logit(events)[1] == max(LOSS_BYTES_PER_LOGIT[kind][0], LOSS_BYTES_PER_LOGIT[kind][2])
    rng = random.Random(2)
    for _ in range(200):
        live, events = [], []
        for i in range(rng.randint(1, 12)):
            if live and rng.random() < 0.4:
                events.append(("-", live.pop(rng.randrange(len(live))), 0))
            else:
                live.append(f"t{i}")
                events.append(("+", live[-1], rng.choice([1, 2, 4])))
        events += [("-", name, 0) for name in live]
        segments, peak = loss_segments_per_logit(tuple(events))
        assert segments >= peak
        if len({size for op, _, size in events if op == "+"}) == 1:   # equal tensors: every freed one fits
            assert segments == peak


def test_fsdp2_root_gather_buffer_and_fp8_layer_gathers_by_hand():
    model = preset("llama-1b")
    kw = dict(batch=2, seq_len=2048, checkpointing="full", recipe="torchtitan")
    base = training_memory(model, ParallelLayout(fsdp=8), **kw)
    shape = RankShape(model, ParallelLayout(fsdp=8), 0, RECIPES["torchtitan"], "bf16", "full", "matmuls", "fsdp2",
                      False, False, 2, 2048)
    # the root (embedding, final norm, head), gathered in bf16 on the copy-in stream beside the first layer's buffer
    root = 2 * (model.embedding_params() + model.norm_params() + model.head_params())
    assert root_gather_buffer_bytes(shape) == root
    layer = model.layer_params()
    assert max(m.pools.get("all-gather", 0) for m in base.moments) == root + 2 * layer
    assert root_gather_buffer_bytes(replace(shape, layout=ParallelLayout(fsdp=1))) == 0    # no all-gather
    assert root_gather_buffer_bytes(replace(shape, sharding="fsdp1")) == 0
    # fp8 all-gather: a layer's unsharded weights and its all-gather buffer one byte a parameter, not two
    fp8 = training_memory(model, ParallelLayout(fsdp=8), fp8_gather=True, **kw)
    assert max(m.pools.get("all-gather", 0) for m in fp8.moments) == root + layer
    assert fp8.reserved_bytes < base.reserved_bytes


def _corpus(tmp_path, run: str):
    path = tmp_path / "corpus.yaml"
    path.write_text("runs:\n  - {source: s, framework: eager, gpu: NVIDIA H100 80GB HBM3, system: hgx-h100, "
                    "gpus: 8, model: llama-1b, seq_len: 2048, precision: bf16, layout: {fsdp: 8}, batch: 2, "
                    f"memory_recipe: torchtitan, {run}}}\n")
    return path


def test_a_published_memory_figure_is_read_with_what_it_counts_and_held_against_the_same_figure(tmp_path):
    from meshscale.predict.training.validate import _memory_row, load_training_corpus, run_memory

    run, = load_training_corpus(_corpus(tmp_path, "memory_counts: allocated, measured: {tokens_per_s_per_gpu: 1, "
                                                   "memory_gib: 20.5}"))
    assert (run.measured, run.memory_gib, run.memory_counts) == (1.0, 20.5, "allocated")
    estimate, _ = run_memory(run)
    row = _memory_row(run, estimate)
    assert row["memory_predicted_gib"] == pytest.approx(estimate.allocated_bytes / (1 << 30))
    assert row["memory_ratio"] == pytest.approx(row["memory_predicted_gib"] / 20.5)
    plain, = load_training_corpus(_corpus(tmp_path, "measured: {tokens_per_s_per_gpu: 1}"))
    assert plain.memory_gib is None and _memory_row(plain, estimate) == {}


@pytest.mark.parametrize("run,message", [
    ("memory_counts: reserved, measured: {tokens_per_s_per_gpu: 1}", "states none"),
    ("measured: {tokens_per_s_per_gpu: 1, memory_gib: -3}", "memory_gib must be"),
    ("memory_counts: free, measured: {tokens_per_s_per_gpu: 1, memory_gib: 3}", "use one of reserved"),
])
def test_a_malformed_published_memory_is_refused_in_one_line(cli, tmp_path, run, message):
    result = cli("validate", "--training", "--corpus", _corpus(tmp_path, run))
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output
