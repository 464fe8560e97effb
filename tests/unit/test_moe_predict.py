"""predict for mixtures of experts and fp8: mechanisms of the step model (the all-to-all on the fabric, grouped
GEMMs at their own shapes, imbalance, experts in memory per layout, fp8's GEMMs and casts) and one-line refusals."""
import random
from dataclasses import replace

import pytest

from meshscale.errors import MeshscaleError
from meshscale.models.layout import ParallelLayout, check_layout
from meshscale.models.memory import training_memory
from meshscale.models.transformer import preset
from meshscale.predict.training.comm import Allocation
from meshscale.predict.training.fp8 import to_fp8
from meshscale.predict.training.hardware import system_gpu
from meshscale.predict.training.kernels import gemm, gemm_backward, grouped_gemm, kernel_seconds, rates, total_seconds
from meshscale.predict.training.moe import all_to_all_costs
from meshscale.predict.training.step import TrainingJob, predict_step


@pytest.fixture(scope="module")
def h100():
    return system_gpu("hgx-h100")[0]


def test_all_to_all_grows_with_ep_across_nodes():
    # the ep group of 8 ranks fills one NVLink node; 16 and 32 send ever more of the same bytes over the NICs
    model, seconds = replace(preset("mixtral-8x7b"), experts=64), []
    allocation = Allocation.of("dgx1-v100", 8, nodes=4)   # NVLink inside a node, EDR between (a quick fabric)
    for ep in (8, 16, 32):
        seconds.append(all_to_all_costs(model, ParallelLayout(fsdp=32, ep=ep), 8192, allocation, 1.0, 2)[0].seconds)
    assert seconds == sorted(seconds) and seconds[-1] > 2 * seconds[0]


def test_no_all_to_all_without_expert_parallelism():
    allocation = Allocation.of("hgx-h100", 8)
    assert all_to_all_costs(preset("mixtral-8x7b"), ParallelLayout(fsdp=8), 4096, allocation, 1.5, 2)[0].seconds == 0


def test_one_group_is_one_gemm_and_small_experts_run_below_a_dense_gemm_of_their_flops(h100):
    r = rates(h100, "bf16")
    assert kernel_seconds(grouped_gemm("g", 4096, 4096, 4096, 2, 1), r) == kernel_seconds(gemm("g", 4096, 4096, 4096, 2), r)
    # 64 experts of 40 tokens each against one GEMM of 2,560 tokens: the same FLOPs, most of each tile empty
    grouped = grouped_gemm("experts", 40, 2048, 7168, 2, 64)
    dense = gemm("dense", 40 * 64, 2048, 7168, 2)
    assert grouped.flops == dense.flops
    assert kernel_seconds(grouped, r) > 1.5 * kernel_seconds(dense, r)


def test_large_fp8_gemms_are_never_slower_than_bf16_ones(h100):
    # the kernel atlas measured small fp8 products slower than bf16's (2048 x 1024 x 1024: 249 against 429 TFLOP/s
    # on an H100, `torch._scaled_mm`'s own overhead): the property holds where the tensor cores set the pace
    rng = random.Random(42)
    bf16, fp8 = rates(h100, "bf16"), rates(h100, "fp8")
    for _ in range(200):
        # the shapes torchao converts (features multiples of 16), large enough to be the tensor cores' work
        m, n, k = (16 * rng.randint(256, 1024) for _ in range(3))
        g = gemm("w", m, n, k, 2)
        (f,), _ = to_fp8([g], "tensorwise")
        assert kernel_seconds(f, fp8) <= kernel_seconds(g, bf16) * (1 + 1e-12)
        assert total_seconds(gemm_backward(f), fp8) <= total_seconds(gemm_backward(g), bf16) * (1 + 1e-12)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_a_large_fp8_linear_with_its_casts_beats_bf16_and_rowwise_casts_cost_more(h100, recipe):
    # a Llama 3 70B MLP projection at 8,192 tokens: GEMM-bound, fp8's rate pays for its casts
    g = gemm("w1 (gate)", 8192, 28672, 8192, 2)
    bf16_s = total_seconds([g, *gemm_backward(g)], rates(h100, "bf16"))
    (f,), casts = to_fp8([g], recipe)
    fp8_s = total_seconds([f, *gemm_backward(f)], rates(h100, "fp8"))
    cast_bytes = casts.bytes + casts.backward_bytes
    assert fp8_s + cast_bytes / rates(h100, "fp8").bandwidth_bytes_per_s < bf16_s
    tensorwise = to_fp8([g], "tensorwise")[1]
    assert cast_bytes >= tensorwise.bytes + tensorwise.backward_bytes


def test_the_router_and_head_stay_bf16():
    kernels, _ = to_fp8([gemm("router", 4096, 8, 4096, 2), gemm("wq", 4096, 4096, 4096, 2)], "rowwise")
    assert [k.fp8 for k in kernels] == [False, True]


def _job(model, layout, **kw):
    return TrainingJob(model, layout, batch=kw.pop("batch", 1), seq_len=kw.pop("seq_len", 512),
                       precision=kw.pop("precision", "bf16"), **kw)


def test_imbalance_slows_only_expert_parallel_layouts(h100):
    model, allocation = preset("mixtral-8x7b"), Allocation.of("hgx-h100", 2)   # two GPUs: a quick fabric
    steps = {}
    for ep in (1, 2):
        for imbalance in (1.0, 1.5):
            job = _job(model, ParallelLayout(fsdp=2, ep=ep), moe_imbalance=imbalance, checkpointing="full")
            steps[ep, imbalance] = predict_step(job, allocation, h100).step_s
    assert steps[1, 1.0] == steps[1, 1.5]
    assert steps[2, 1.5] > steps[2, 1.0]


def test_expert_all_to_all_is_in_the_exposed_column(h100):
    job = _job(preset("mixtral-8x7b"), ParallelLayout(fsdp=2, ep=2), checkpointing="full")
    p = predict_step(job, Allocation.of("hgx-h100", 2), h100)
    assert p.exposed()["expert all-to-all"] > 0 and p.step_s > p.compute_s


def test_expert_parallelism_shards_what_each_rank_gathers():
    model = preset("mixtral-8x7b")
    kw = dict(batch=1, seq_len=4096, checkpointing="full")
    gathered = [training_memory(model, ParallelLayout(fsdp=8, ep=ep), **kw).gathered_bytes for ep in (1, 2, 4, 8)]
    assert gathered == sorted(gathered, reverse=True) and gathered[0] > 4 * gathered[-1]
    # the sharded state is the same either way: the experts split over ep, the rest over fsdp
    assert training_memory(model, ParallelLayout(fsdp=8, ep=8), **kw).params_bytes == pytest.approx(
        training_memory(model, ParallelLayout(fsdp=8), **kw).params_bytes)


def test_expert_groups_tile_the_borrowed_ranks():
    layout = ParallelLayout(tp=2, cp=2, fsdp=4, dp=2, ep=4)
    assert layout.ep * layout.expert_fsdp * layout.expert_dp == layout.borrowable
    for kind in ("ep", "expert_fsdp", "expert_dp"):
        seen = sorted(r for rank in range(layout.world_size) for r in [layout.expert_groups(rank)[kind][0]])
        groups = {tuple(layout.expert_groups(rank)[kind]) for rank in range(layout.world_size)}
        assert sorted(r for g in groups for r in g) == list(range(layout.world_size)) and seen


@pytest.mark.parametrize("layout,rule", [(ParallelLayout(fsdp=8, ep=3), "divide the model's 8 experts"),
                                         (ParallelLayout(fsdp=4, tp=2, ep=8), "borrows the data-parallel ranks"),
                                         (ParallelLayout(fsdp=8, ep=0), "whole number")])
def test_an_ep_that_does_not_divide_is_refused_in_one_line(layout, rule):
    with pytest.raises(MeshscaleError, match=rule) as err:
        check_layout(layout, 8, preset("mixtral-8x7b"), seq_len=512)
    assert "\n" not in str(err.value)


def test_ep_on_a_dense_model_is_refused():
    with pytest.raises(MeshscaleError, match="no experts"):
        check_layout(ParallelLayout(fsdp=8, ep=2), 8, preset("llama3-8b"), seq_len=512)


@pytest.mark.parametrize("args,words", [
    (["--model", "mixtral-8x7b", "--gpus", "8", "--ep", "3"], "--ep 3"),
    (["--model", "llama3-8b", "--gpus", "8", "--ep", "2"], "--ep"),
    (["--model", "llama3-8b", "--gpus", "8", "--fp8-recipe", "rowwise"], "--fp8-recipe"),
    (["--model", "mixtral-8x7b", "--gpus", "8", "--precision", "fp8", "--fp8-recipe", "blockwise"], "--fp8-recipe"),
    (["--model", "mixtral-8x7b", "--gpus", "8", "--ep", "8", "--moe-imbalance", "0.5"], "--moe-imbalance"),
])
def test_bad_moe_and_fp8_options_are_one_line_and_exit_2(cli, args, words):
    r = cli("predict", "--system", "hgx-h100", *args)
    assert r.exit_code == 2 and words in r.stderr and r.stderr.count("\n") == 1


def test_search_ranks_layouts_with_expert_parallelism():
    from meshscale.predict.training.search import candidate_layouts
    job = _job(preset("moe-tiny"), ParallelLayout(), seq_len=64)
    eps = {j.layout.ep for j in candidate_layouts(job, 8, 8, 8)}
    assert eps == {1, 2, 4}
    assert {j.layout.ep for j in candidate_layouts(_job(preset("llama-tiny"), ParallelLayout(), seq_len=64),
                                                   8, 8, 8)} == {1}


@pytest.mark.parametrize("fsdp", [1, 8])
def test_tensorwise_under_fsdp2_casts_the_weight_shards_not_the_gathered_weights(fsdp):
    # torchao's float8 all-gather: each linear's fp32 shard is cast before every all-gather (forward and the
    # re-gather for backward: 4 + 4, 4 + 4, 4 + 1 bytes per element) and its amax taken once a step; the layer
    # only copies the fp8 weight transposed for backward. Oracle: the same sums over llama-tiny's projections.
    from meshscale.predict.training.step import step_kernels
    model = preset("llama-tiny")
    d, kv, f = model.d_model, model.kv_dim, model.ffn_dim
    weights, tensors = d * (d + 2 * kv + d) + 3 * d * f, 7
    job = TrainingJob(model, ParallelLayout(fsdp=fsdp), 8, 128, "fp8", fp8_recipe="tensorwise")
    k = step_kernels(job)
    passes = list(k.layer.forward) + list(k.layer.backward)
    casts = [x for x in passes if x.name.startswith("float8 weight casts")]
    assert len(casts) == 2 and all(c.ops == 4 * tensors for c in casts)
    assert sum(c.bytes for c in casts) == (2 * 21 * weights if fsdp == 1 else 0)   # the copy-in stream's beyond one
    amax = [x for x in k.per_step if x.name == "float8 amax precompute"]
    assert len(amax) == 1 and amax[0].bytes == pytest.approx(4 * model.layers * weights / fsdp)
    in_layer = next(x for x in k.layer.forward if x.name == "fp8 casts")
    rowwise = next(x for x in step_kernels(replace(job, fp8_recipe="rowwise")).layer.forward if x.name == "fp8 casts")
    tokens = 8 * 128
    # tensorwise in the layer: input (6, 0) and grad_output (0, 6) per element, weight (0, 2)
    assert in_layer.bytes == 6 * tokens * (6 * d + f)   # q, k, v, o, w1, w3 read d wide; w2 f wide
    assert in_layer.backward_bytes == 6 * tokens * (d + 2 * kv + d + 2 * f + d) + 2 * weights
    assert not [x for x in step_kernels(replace(job, fp8_recipe="rowwise")).per_step if "amax" in x.name]
    assert rowwise.bytes > 0
