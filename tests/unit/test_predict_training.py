"""The training step model: kernels from the model's shape, the roofline, collectives on the group's allocation,
pipelines, calibration from a profile, the layout search, the published-run corpus and the CLI."""
import json
import math
from dataclasses import replace

import pytest

from meshscale.errors import MeshscaleError
from meshscale.models.layout import ParallelLayout
from meshscale.models.transformer import preset
from meshscale.predict.training.comm import CollectiveCost, Allocation, collective_cost, collective_seconds
from meshscale.predict.training.hardware import gpu_spec, system_gpu
from meshscale.predict.training.kernels import (HOST_SECONDS_PER_OP, KERNEL_FLOOR_S, attention_fraction, gemm,
                                                host_seconds, kernel_seconds, quantization, rates)
from meshscale.predict.training.search import candidate_layouts, search_layouts
from meshscale.predict.training.step import TrainingJob, contention_seconds, predict_step
from meshscale.models.images import resnet_params
from meshscale.predict.training.workload import resnet_step, transformer_layer
from meshscale.results import Result

H100, _ = system_gpu("hgx-h100")
ONE = Allocation.of("hgx-h100", 1)
NODE = Allocation.of("hgx-h100", 8)


def _flops(kernels, kind):
    return sum(k.flops * k.count for k in kernels if k.kind == kind)


# ---- the model's own arithmetic against independent counts ---------------------------------------------------
def test_resnet_built_from_the_architecture_has_torchvisions_parameter_counts():
    # torchvision's documented counts (models page): ResNet-50 25,557,032, ResNet-18 11,689,512, ResNet-101 44,549,160
    assert resnet_params(50) == 25_557_032
    assert resnet_params(18) == 11_689_512
    assert resnet_params(101) == 44_549_160


@pytest.mark.parametrize("name", ["llama3-8b", "gpt2-small"])
def test_layer_gemm_flops_are_two_per_matmul_parameter_per_token_and_backward_twice(name):
    model = preset(name)
    tokens, seq = 4096, 2048
    layer = transformer_layer(model, tokens, seq)
    per_layer_matmul = (model.matmul_params() - model.vocab_size * model.d_model) / model.layers
    assert _flops(layer.forward, "matmul") == pytest.approx(2 * per_layer_matmul * tokens, rel=1e-3)
    assert _flops(layer.backward, "matmul") == pytest.approx(2 * _flops(layer.forward, "matmul"), rel=1e-6)
    # causal attention: the model's own per-token count (all layers) / layers x tokens
    assert _flops(layer.forward, "attention") == pytest.approx(
        model.attention_flops_per_token(seq) / model.layers * tokens, rel=1e-6)


def test_tensor_and_context_parallel_ranks_share_the_layer_work():
    """A ring (torch's context_parallel, Transformer Engine's) splits the causal work exactly; meshscale's
    masked attention over the gathered keys computes every block of the rank's rows: twice its causal share."""
    model = preset("llama3-8b")
    whole = transformer_layer(model, 8192, 8192)
    for method in ("allgather", "alltoall", "p2p"):
        split = transformer_layer(model, 8192 / 2, 8192, tp=4, cp=2, cp_method=method)
        for kind in ("matmul", "attention"):
            assert 8 * _flops(split.forward, kind) == pytest.approx(_flops(whole.forward, kind), rel=1e-6)
    masked = transformer_layer(model, 8192 / 2, 8192, tp=4, cp=2, cp_method="masked")
    assert 8 * _flops(masked.forward, "attention") == pytest.approx(2 * _flops(whole.forward, "attention"), rel=1e-3)


def test_checkpointing_recomputes_more_as_it_keeps_less():
    model = preset("llama3-8b")
    flops = [transformer_layer(model, 4096, 4096, checkpointing=c).flops() for c in ("none", "selective", "full")]
    assert flops[0] <= flops[1] < flops[2]
    forward = sum(k.flops for k in transformer_layer(model, 4096, 4096).forward)
    assert flops[2] == pytest.approx(flops[0] + forward, rel=1e-9)   # full: the forward once more


def test_selective_recomputes_no_gemm_as_the_engine_keeps_them_and_torchtitans_policy_every_second():
    model = preset("llama3-8b")
    engine = transformer_layer(model, 4096, 4096, checkpointing="selective")
    assert not [k for k in engine.recompute if k.kind in ("matmul", "attention")]
    assert engine.recompute   # the norms, rotary and activations run again
    titan = transformer_layer(model, 4096, 4096, checkpointing="selective", selective_policy="torchtitan")
    gemms = [k for k in titan.forward if k.kind == "matmul"]
    assert [k.name for k in titan.recompute if k.kind == "matmul"] == [k.name for k in gemms[1::2]]


def test_a_step_of_tiny_kernels_is_host_bound_and_a_cuda_graph_removes_it():
    tiny = preset("gpt2-small")
    job = TrainingJob(tiny, ParallelLayout(), 1, 32, "bf16", autocast=True)
    eager = predict_step(job, ONE, H100)
    graphed = predict_step(replace(job, cuda_graph=True), ONE, H100)
    assert graphed.step_s < eager.step_s
    layer = transformer_layer(tiny, 32, 32, autocast=True)
    # each layer's forward takes as long as the host needs to issue it
    assert host_seconds(list(layer.forward)) > sum(kernel_seconds(k, rates(H100, "bf16")) for k in layer.forward)
    assert eager.step_s >= tiny.layers * host_seconds(list(layer.forward + layer.backward))
    # a large batch is GPU-bound: the graph changes little
    big = replace(job, batch=16, seq_len=1024)
    assert predict_step(replace(big, cuda_graph=True), ONE, H100).step_s > 0.97 * predict_step(big, ONE, H100).step_s
    assert HOST_SECONDS_PER_OP > KERNEL_FLOOR_S


# ---- the roofline --------------------------------------------------------------------------------------------
def test_quantization_is_a_share_and_full_when_tiles_fill_whole_waves():
    assert quantization(128 * 132, 128, 4096, 132) == pytest.approx(1.0)
    for m, n, k in [(1, 1, 1), (300, 70, 64), (5000, 777, 4096), (16384, 4096, 4096)]:
        assert 0 < quantization(m, n, k, 132) <= 1


def test_gemm_time_grows_with_its_size_and_a_thin_one_is_memory_bound():
    r = rates(H100, "bf16")
    times = [kernel_seconds(gemm("x", m, 4096, 4096, 2), r) for m in (128, 1024, 8192, 65536)]
    assert times == sorted(times)
    thin = gemm("thin", 1 << 20, 8, 8, 2)   # its time is its operands' traffic and little more
    assert 1 <= kernel_seconds(thin, r) / (thin.bytes / r.bandwidth_bytes_per_s) < 1.3
    assert kernel_seconds(gemm("tiny", 8, 8, 8, 2), r) == r.kernel_floor_s


def test_a_short_k_gemm_runs_further_below_the_ceiling_than_a_long_one():
    r = rates(H100, "bf16")
    rate = [gemm("x", 16384, 4096, k, 2).flops / kernel_seconds(gemm("x", 16384, 4096, k, 2), r)
            for k in (256, 768, 3072, 8192)]
    # the analytic tiles order them; a measured atlas keeps the order up to its own noise at the longest
    assert rate[0] < rate[1] < rate[2] and max(rate) <= r.dense_flops


def test_a_gemm_whose_rows_are_not_16_byte_aligned_pays_its_loads_and_padding_wins_it_back():
    # GPT-2's head: 50,257 rows of bf16 are not 16-byte aligned, 50,304 are (nanoGPT pads to it); the padded
    # product has more FLOPs yet takes less time; the penalty is every K-block's load, which a product already
    # bound by its loads barely feels
    r = rates(H100, "bf16")
    odd, padded = gemm("head", 16384, 50257, 768, 2), gemm("head", 16384, 50304, 768, 2)
    assert kernel_seconds(padded, r) < kernel_seconds(odd, r) / 2
    thin_odd, thin_padded = gemm("x", 16384, 50257, 8, 2), gemm("x", 16384, 50304, 8, 2)
    assert kernel_seconds(thin_odd, r) < 1.1 * kernel_seconds(thin_padded, r)
    fp32 = rates(H100, "fp32")                # 4-byte elements: 50,257 x 4 is still unaligned, 50,260 x 4 is not
    assert kernel_seconds(gemm("h", 16384, 50260, 768, 4), fp32) < kernel_seconds(gemm("h", 16384, 50257, 768, 4), fp32)


@pytest.mark.parametrize("kernel", ["flash", "cudnn"])
def test_attention_on_hopper_runs_faster_with_longer_sequences_and_stays_below_peak(kernel):
    for head_dim in (64, 128, 256):
        fractions = [attention_fraction("hopper", head_dim, s, kernel=kernel)
                     for s in (256, 512, 1500, 4096, 16384, 65536)]
        assert fractions == sorted(fractions) and 0 < fractions[0] and fractions[-1] < 1
        for backward in (False, True):   # cuDNN's kernel is the faster at every length (FlashAttention-3's bars)
            assert attention_fraction("hopper", head_dim, 2048, backward, "cudnn") > \
                attention_fraction("hopper", head_dim, 2048, backward, "flash")


@pytest.mark.parametrize("kernel", ["flash", "cudnn"])
def test_causal_backward_on_hopper_pays_the_masks_share_most_at_short_sequences(kernel):
    # the backward's measured rate is without the mask; the causal loop loses what the forward's loses
    from meshscale.predict.training.kernels import HOPPER_ATTENTION_BACKWARD_TFLOPS, HOPPER_DENSE_TFLOPS, \
        _at_length
    lengths = (512, 1024, 3000, 8192, 16384, 65536)
    backward = [attention_fraction("hopper", 128, s, backward=True, kernel=kernel) for s in lengths]
    unmasked = [_at_length(HOPPER_ATTENTION_BACKWARD_TFLOPS[kernel], s) / HOPPER_DENSE_TFLOPS for s in lengths]
    assert backward == sorted(backward) and all(0 < b < u for b, u in zip(backward, unmasked))
    shares = [b / u for b, u in zip(backward, unmasked)]
    assert shares == sorted(shares) and shares[0] < 0.7 < 0.85 < shares[-1] < 1


def test_bf16_on_a_gpu_without_bf16_tensor_cores_is_refused_naming_the_flag():
    v100, _ = system_gpu("dgx1-v100")
    with pytest.raises(MeshscaleError, match="--precision bf16"):
        rates(v100, "bf16")
    assert rates(v100, "fp16").matmul_flops > rates(v100, "fp32").matmul_flops


def test_fp32_convolutions_use_tf32_where_the_gpu_has_it_and_matmuls_do_not():
    assert H100.matmul_flops("fp32", conv=True) == H100.tf32_flops
    assert H100.matmul_flops("fp32") == H100.fp32_flops


def test_channels_last_is_faster_than_nchw_for_half_precision_resnets():
    job = TrainingJob(None, ParallelLayout(), 128, resnet_depth=50, autocast=True)
    nhwc = predict_step(job, ONE, H100).samples_per_s
    nchw = predict_step(replace(job, channels_last=False), ONE, H100).samples_per_s
    assert nchw < nhwc


def test_sdpa_runs_cudnns_attention_on_hopper_and_flashattention_2_on_ampere():
    a100, _ = system_gpu("dgx-a100")
    job = TrainingJob(preset("llama3-8b"), ParallelLayout(fsdp=8), 1, 8192, "bf16", "full")
    a100_node = Allocation.of("dgx-a100", 8)
    rate = {(a, gpu.model): predict_step(replace(job, attention=a), NODE if gpu is H100 else a100_node,
                                         gpu).tokens_per_s_per_gpu
            for a in ("sdpa", "flash", "cudnn") for gpu in (H100, a100)}
    assert rate[("sdpa", H100.model)] == rate[("cudnn", H100.model)] > rate[("flash", H100.model)]
    assert rate[("sdpa", a100.model)] == rate[("flash", a100.model)] == rate[("cudnn", a100.model)]


def test_the_triton_attention_kernel_costs_more_the_longer_the_sequence_and_never_more_than_its_backward_ratio():
    from meshscale.predict.training.kernels import TRITON_ATTENTION_SLOWDOWN

    shape = replace(preset("llama3-8b"), max_seq_len=32768)
    slowdowns = []
    for seq in (1024, 8192, 32768):
        job = TrainingJob(shape, ParallelLayout(fsdp=8), 1, seq, "bf16", "full")
        flash, triton = (predict_step(replace(job, attention=a), NODE, H100) for a in ("flash", "triton"))
        slowdowns.append(flash.tokens_per_s_per_gpu / triton.tokens_per_s_per_gpu)
    # attention's share of the step grows with the sequence; only attention slows, by at most its slower pass
    assert 1.0 < slowdowns[0] < slowdowns[1] < slowdowns[2] < TRITON_ATTENTION_SLOWDOWN["backward"]


def test_a_faster_gpu_is_never_slower_and_h200_gains_only_where_bandwidth_binds():
    h200, _ = system_gpu("hgx-h200")
    job = TrainingJob(None, ParallelLayout(), 128, resnet_depth=50, autocast=True)
    h100_rate, h200_rate = (predict_step(job, ONE, g).samples_per_s for g in (H100, h200))
    # same tensor rate, 43% more bandwidth: faster, but by less than the bandwidth ratio
    assert 1.0 < h200_rate / h100_rate < h200.memory_bandwidth_bytes_per_s / H100.memory_bandwidth_bytes_per_s


def test_an_hgx_b200_trains_faster_than_an_hgx_h100_by_no_more_than_its_larger_peak_ratio():
    b200, per_node = system_gpu("hgx-b200")
    assert per_node == 8 and b200.family == "blackwell"
    job = TrainingJob(preset("llama3-8b"), ParallelLayout(fsdp=8), 2, 8192, "bf16", "selective")
    b200_rate = predict_step(job, Allocation.of("hgx-b200", 8), b200).tokens_per_s_per_gpu
    h100_rate = predict_step(job, NODE, H100).tokens_per_s_per_gpu
    peaks = max(b200.matmul_flops("bf16") / H100.matmul_flops("bf16"),
                b200.memory_bandwidth_bytes_per_s / H100.memory_bandwidth_bytes_per_s)
    assert 1.5 < b200_rate / h100_rate <= peaks


# ---- allocation and parallel dimensions -----------------------------------------------------------------------
def test_a_group_spanning_nodes_costs_more_than_one_inside_a_node():
    fabric = Allocation.of("hgx-h100", 8, 2)
    inside = collective_seconds("all_gather", 1 << 26, [0, 1], fabric)
    across = collective_seconds("all_gather", 1 << 26, [0, 8], fabric)
    assert 0 < inside < across


def test_overlapped_collectives_slow_compute_by_the_sms_their_channels_hold():
    c = collective_cost("all_gather", 1 << 28, list(range(8)), NODE)
    assert 0 < c.channels < H100.sm_count
    # no longer than the overlap, no more than the channels' share of it
    assert contention_seconds([c], 1.0, H100.sm_count) == pytest.approx(c.seconds * c.channels / H100.sm_count)
    assert contention_seconds([c], c.seconds / 10, H100.sm_count) < contention_seconds([c], 1.0, H100.sm_count)
    assert contention_seconds([CollectiveCost(0.0)], 1.0, H100.sm_count) == 0.0
    job = TrainingJob(preset("llama3-8b"), ParallelLayout(fsdp=8), 1, 4096, "bf16")
    p = predict_step(job, NODE, H100)
    assert 0 < p.contention_s < 0.2 * p.step_s


def test_collective_time_grows_with_size():
    times = [collective_seconds("reduce_scatter", 1 << s, list(range(8)), NODE) for s in (16, 20, 24, 28)]
    assert times == sorted(times) and times[0] > 0


def test_the_pipeline_bubble_shrinks_with_more_micro_batches_and_with_interleaving():
    model = preset("llama-1b")
    shares = []
    for m in (4, 8, 16):
        layout = ParallelLayout(pp=4, fsdp=2, micro_batches=m)
        p = predict_step(TrainingJob(model, layout, 16, 2048), NODE, H100)
        shares.append(p.bubble_s / p.step_s)
    assert shares == sorted(shares, reverse=True)
    plain = predict_step(TrainingJob(model, ParallelLayout(pp=4, fsdp=2, micro_batches=8), 16, 2048), NODE, H100)
    inter = predict_step(TrainingJob(model, ParallelLayout(pp=4, fsdp=2, micro_batches=8, pp_schedule="interleaved-1f1b",
                                                           stages_per_rank=2), 16, 2048), NODE, H100)
    assert inter.bubble_s == pytest.approx(plain.bubble_s / 2, rel=0.05)


def test_tensor_parallel_traffic_is_on_the_critical_path():
    model = preset("llama3-8b")
    p = predict_step(TrainingJob(model, ParallelLayout(tp=8), 1, 4096), NODE, H100)
    # host-bound ops are part of compute_s (exposed() names them, the step counts them once)
    assert p.tp_s > 0 and p.step_s == pytest.approx(p.compute_s + sum(p.exposed().values()) - p.launch_s, rel=1e-9)


def test_a_layout_that_does_not_fit_says_so_with_what_it_needs():
    p = predict_step(TrainingJob(preset("llama3-70b"), ParallelLayout(fsdp=8), 1, 8192), NODE, H100)
    assert not p.fits and p.memory.total_bytes > H100.memory_bytes


def test_bad_layouts_are_refused_in_one_line_naming_the_field():
    with pytest.raises(MeshscaleError, match="--tp 3"):
        predict_step(TrainingJob(preset("llama3-8b"), ParallelLayout(tp=3, fsdp=1), 1, 2048), Allocation.of("hgx-h100", 3), H100)
    with pytest.raises(MeshscaleError, match="world has 8"):
        predict_step(TrainingJob(preset("llama3-8b"), ParallelLayout(fsdp=4), 1, 2048), NODE, H100)
    with pytest.raises(MeshscaleError, match="data parallel only"):
        predict_step(TrainingJob(None, ParallelLayout(tp=8), 8, resnet_depth=50), NODE, H100)


# ---- calibration from a profile ------------------------------------------------------------------------------
def _profile(tmp_path, gpu_name, batches, times, model="resnet50"):
    path = tmp_path / "profile.json"
    Result("train", [{"batch_per_rank": b, "step_time_s": t} for b, t in zip(batches, times)], False,
           {"profile": True, "model": model}, {"gpus": [gpu_name]}).save(path)
    return path


def test_a_profile_calibrates_on_its_own_gpu_and_moves_each_kernel_by_its_own_bound(tmp_path):
    from meshscale.predict.question import PredictRequest
    from meshscale.predict.request import predict_training

    h200 = gpu_spec({"model": "NVIDIA H200"})
    # a batch large enough that no pass waits on the host: every kernel moves by the factor
    job = TrainingJob(None, ParallelLayout(), 256, resnet_depth=50, autocast=True, channels_last=True)
    assert predict_step(job, ONE, H100).launch_s == 0
    on_h200 = predict_step(job, ONE, h200).step_s
    path = _profile(tmp_path, "NVIDIA H200", [256], [1.25 * on_h200])
    req = PredictRequest(model="resnet50", system="hgx-h100", gpus=(1,), batch=256, channels_last=True, profile=path,
                         precision="bf16")
    (p,), _ = predict_training(req)
    assert "calibrated on NVIDIA H200" in p.compute_source
    assert p.step_s == pytest.approx(1.25 * predict_step(job, ONE, H100).step_s, rel=1e-6)


def test_a_two_batch_profile_separates_a_fixed_cost_per_step_from_the_kernels(tmp_path):
    from meshscale.predict.question import PredictRequest
    from meshscale.predict.request import predict_training
    from meshscale.predict.training.step import fit_calibration

    fitted = fit_calibration([0.01, 0.03], [0.025, 0.055], "x")
    assert (fitted.factor, fitted.host_s) == pytest.approx((1.5, 0.01))
    assert fit_calibration([0.01, 0.03], [0.005, 0.045], "x").host_s == 0.0   # a negative fixed cost is not one
    h200 = gpu_spec({"model": "NVIDIA H200"})
    job = TrainingJob(preset("gpt2-small"), ParallelLayout(), 8, 1024, autocast=True, sharding="none")
    host, factor = 0.013, 1.4
    measured = [host + factor * predict_step(replace(job, batch=b), ONE, h200).step_s for b in (8, 16)]
    path = _profile(tmp_path, "NVIDIA H200", [8, 16], measured, model="gpt-small")
    req = PredictRequest(model="gpt-small", system="hgx-h100", gpus=(1,), batch=16, seq_len=1024, profile=path,
                         precision="bf16")
    (p,), _ = predict_training(req)
    on_h100 = predict_step(replace(job, batch=16), ONE, H100).step_s
    assert p.step_s == pytest.approx(host + factor * on_h100, rel=1e-6)
    assert p.host_s == pytest.approx(host) and "ms per step" in p.compute_source


# ---- the search ----------------------------------------------------------------------------------------------
def test_search_lists_every_fitting_layout_fastest_first_then_the_others():
    model = preset("llama-1b")
    base = TrainingJob(model, ParallelLayout(), 1, 2048)
    found = search_layouts(base, NODE, H100, global_batch=16)
    assert len(found) == len(candidate_layouts(base, 8, 8, 16))
    fits = [p for p in found if p.fits]
    assert found[:len(fits)] == fits
    verdicts = [p.memory_verdict for p in fits]   # room to spare first, then within the model's uncertainty
    assert verdicts == sorted(verdicts, key=lambda v: v != "yes")
    for verdict in ("yes", "tight"):
        rates_ = [p.tokens_per_s_per_gpu for p in fits if p.memory_verdict == verdict]
        assert rates_ == sorted(rates_, reverse=True)
    plain = predict_step(replace(base, layout=ParallelLayout(fsdp=8), batch=2), NODE, H100)
    alike = [p for p in fits if p.memory_verdict == plain.memory_verdict]
    assert alike[0].tokens_per_s_per_gpu >= plain.tokens_per_s_per_gpu * (1 - 1e-9)


# ---- the published runs --------------------------------------------------------------------------------------
def test_every_published_run_is_predicted():
    from meshscale.predict.training.validate import validate_training

    result = validate_training()
    assert len(result.rows) >= 25
    assert {r["family"] for r in result.rows} >= {"ampere", "hopper", "pascal"}
    assert all(r["predicted"] > 0 and math.isfinite(r["error"]) for r in result.rows)


def test_the_lent_vm_runs_load_with_their_schedules_and_the_devices_own_pace_is_never_above_the_prediction():
    from meshscale.predict.training.validate import corpus_path, validate_training

    result = validate_training(corpus_path().with_name("training-lent-vms.yaml"))
    schedules = {r["layout"] for r in result.rows if r["layout"].startswith("pp2")}
    assert schedules == {"pp2 (1f1b, 8 micro-batches)", "pp2 (gpipe, 8 micro-batches)"}
    # eager PyTorch on those hosts runs no faster than the device-bound step the model predicts: a run measured
    # above its prediction would mean the model's device side is too slow, not that the host is
    assert all(r["predicted"] >= r["measured"] * 0.95 for r in result.rows)


# The corpus holds issue 41's bounds (publications weighted equally <= 10%, worst run <= 1.4x: validate's own,
# `corpus_check.CORPORA`), the runs' own geomean the bound it held before (15%), and every run fits.
RUNS_GEOMEAN_BOUND, RUNS_WORST_BOUND = 0.15, 1.5


def test_published_runs_within_the_bounds():
    from meshscale.predict.training.validate import TRAINING, validate_training

    result = validate_training()
    summary = result.meta["summary"]
    assert summary["geomean_abs_error"] <= RUNS_GEOMEAN_BOUND
    assert summary["worst_times_off"] <= RUNS_WORST_BOUND
    assert summary["memory"]["no"] == 0 and summary["memory"]["rows"] > 0
    publications = {r["publication"] for r in result.rows}
    assert summary["weighted_by"] == "publication" and summary["weighted_groups"] == len(publications) >= 3
    assert summary["weighted_geomean_abs_error"] > 0
    assert summary["bounds"]["geomean_abs_error"] == TRAINING.bounds.geomean_abs_error
    assert summary["passed"] == (summary["weighted_geomean_abs_error"] <= TRAINING.bounds.geomean_abs_error
                                 and summary["worst_times_off"] <= TRAINING.bounds.worst_times_off)
    assert summary["passed"], "the published corpus is outside validate --training's bounds"


def test_fsdp2_copies_cost_the_compute_stream_in_proportion_to_the_parameters_and_flat_parameters_none():
    from meshscale.predict.training.breakdown import predicted_categories
    r = rates(H100, "bf16")
    small, large = preset("llama-1b"), preset("llama3-8b")
    copies = {}
    for model in (small, large):
        for sharding in ("fsdp2", "fsdp1"):
            job = TrainingJob(model, ParallelLayout(), 1, 2048, "bf16", "full", sharding=sharding)
            cats = {c.category: c.seconds for c in predicted_categories(job, r)}
            copies[model.name, sharding] = cats.get("FSDP copies", 0.0)
    assert copies["llama-1b", "fsdp1"] == copies["llama3-8b", "fsdp1"] == 0
    ratio = copies["llama3-8b", "fsdp2"] / copies["llama-1b", "fsdp2"]
    assert ratio == pytest.approx(preset("llama3-8b").layer_params() * 32 / (small.layer_params() * 16), rel=0.35)
    with pytest.raises(MeshscaleError, match="sharding fsdp3"):
        predict_step(TrainingJob(small, ParallelLayout(), 1, 2048, sharding="fsdp3"), ONE, H100)
    with pytest.raises(MeshscaleError, match="rotary spiral"):
        predict_step(TrainingJob(small, ParallelLayout(), 1, 2048, rotary="spiral"), ONE, H100)


def test_a_profile_that_does_not_grow_with_the_batch_is_host_bound_and_floors_the_step(tmp_path):
    # eager ResNet-50 on one H100 took 36.3 ms per step at batch 64 and at 128: the host set the pace. Its
    # roofline grows with the batch, so the fit can only be a floor (the host) and kernels at most that long
    from meshscale.predict.question import PredictRequest
    from meshscale.predict.request import predict_training
    from meshscale.predict.training.step import fit_calibration

    fitted = fit_calibration([0.014, 0.028], [0.0363, 0.0363], "x")
    assert fitted.floor_s == pytest.approx(0.0363) and fitted.factor == pytest.approx(0.0363 / 0.028)
    assert fitted.host_s == 0 and "host-bound" in fitted.describe()
    h100, h200 = H100, gpu_spec({"model": "NVIDIA H200"})
    job = TrainingJob(None, ParallelLayout(), 64, resnet_depth=50, autocast=True, channels_last=True)
    kernels = [predict_step(replace(job, batch=b), ONE, h100).step_s for b in (64, 128)]
    path = _profile(tmp_path, h100.model, [64, 128], [1.6 * kernels[1]] * 2)
    steps = {}
    for system, batch in (("hgx-h100", 64), ("hgx-h200", 64), ("hgx-h200", 512), ("hgx-h100", 512)):
        req = PredictRequest(model="resnet50", system=system, gpus=(1,), batch=batch, channels_last=True, profile=path,
                             precision="bf16")
        (steps[system, batch],), _ = predict_training(req)
    # the same GPU's measured batch is the step as measured; a batch beyond it takes the kernels, held by the
    # host's floor until they outgrow it
    assert steps["hgx-h100", 64].step_s == pytest.approx(1.6 * kernels[1])
    assert steps["hgx-h100", 64].compute_source.startswith("measured step")
    assert steps["hgx-h100", 512].step_s > 1.6 * kernels[1] and "host-bound" in steps["hgx-h100", 512].compute_source
    # another GPU is another machine: the floor was the measuring one's CPU, and is not carried
    assert steps["hgx-h200", 64].step_s < 1.6 * kernels[1] and steps["hgx-h200", 64].host_s == 0
    assert "not carried" in steps["hgx-h200", 64].compute_source
    assert steps["hgx-h100", 512].step_s > steps["hgx-h200", 512].step_s


# ---- the command line ----------------------------------------------------------------------------------------
def test_predict_a_layout_prints_tokens_per_gpu_mfu_and_memory(cli, tmp_path):
    out = tmp_path / "p.json"
    r = cli("predict", "--model", "llama3-8b", "--system", "hgx-h100", "--gpus", "8", "--fsdp", "8", "--batch", "2",
            "--seq-len", "8192", "--precision", "bf16", "--activation-checkpointing", "selective", "--json", out)
    assert r.exit_code == 0, r.output
    assert "tokens/s/GPU" in r.stdout and "MFU" in r.stdout and "peak GiB/GPU" in r.stdout
    assert "datasheet" in r.stdout
    row = json.loads(out.read_text())["rows"][0]
    assert row["fsdp"] == 8 and 0 < row["mfu"] < 1 and row["memory_peak_bytes"] > 0


def test_predict_says_how_slow_a_host_would_set_the_pace_of_a_small_eager_step(cli, tmp_path):
    # the break-even host time per op is the step over the ops each rank issues: said when it is within what
    # hosts take, gone for a step long enough per op, and for a CUDA graph (no host cost per op)
    rows = {}
    for batch, extra in ((64, []), (256, []), (64, ["--cuda-graph"])):
        out = tmp_path / f"p{batch}{len(extra)}.json"
        r = cli("predict", "--model", "resnet50", "--system", "hgx-h100", "--gpus", "1", "--batch", str(batch),
                "--precision", "bf16", "--channels-last", *extra, "--json", out)
        assert r.exit_code == 0, r.output
        rows[batch, bool(extra)] = (json.loads(out.read_text())["rows"][0], r.stdout)
    small, big, graph = rows[64, False], rows[256, False], rows[64, True]
    assert small[0]["host_bound_above_s_per_op"] == pytest.approx(small[0]["step_time_s"] / small[0]["host_ops_per_step"])
    assert small[0]["host_ops_per_step"] == big[0]["host_ops_per_step"] > 100   # the ops do not grow with the batch
    # four times the kernels; the smaller step sits near its host already, so less than four times the break-even
    assert big[0]["host_bound_above_s_per_op"] > 2 * small[0]["host_bound_above_s_per_op"]
    assert "host: eager PyTorch issues" in small[1].replace("\n", " ") and "host: eager" not in big[1]
    assert graph[0]["host_ops_per_step"] == 0 and graph[0]["host_bound_above_s_per_op"] is None
    assert "host: eager" not in graph[1]


def test_predict_cuda_graph_removes_the_host_cost_of_a_small_step(cli, tmp_path):
    rates = []
    for extra in ([], ["--cuda-graph"]):
        out = tmp_path / f"p{len(extra)}.json"
        r = cli("predict", "--model", "gpt-small", "--system", "hgx-h100", "--gpus", "1", "--batch", "1",
                "--seq-len", "128", "--precision", "bf16", *extra, "--json", out)
        assert r.exit_code == 0, r.output
        rates.append(json.loads(out.read_text())["rows"][0]["throughput_samples_per_s"])
    assert rates[1] > rates[0]


def test_predict_prints_and_writes_the_synced_step_beside_the_steady_one(cli, tmp_path):
    out = tmp_path / "p.json"
    r = cli("predict", "--model", "resnet50", "--system", "hgx-h100", "--gpus", "1", "--batch", "4",
            "--precision", "bf16", "--channels-last", "--json", out)
    assert r.exit_code == 0, r.output
    assert "synced every step" in r.output
    row = json.loads(out.read_text())["rows"][0]
    assert row["synced_step_time_s"] >= row["step_time_s"]
    assert row["synced_throughput_samples_per_s"] == pytest.approx(row["global_batch"] / row["synced_step_time_s"])


@pytest.mark.parametrize("args, field", [
    (["--model", "llama3-8b", "--system", "hgx-h100", "--gpus", "8", "--tp", "3"], "--tp 3"),
    (["--model", "resnet50", "--system", "dgx1-v100", "--gpus", "1", "--precision", "bf16"], "--precision bf16"),
    (["--model", "llama3-8b", "--system", "hgx-h100", "--gpus", "12"], "--gpus 12"),
    (["--model", "llama3-8b", "--system", "hgx-h100", "--gpus", "8", "--seq-len", "100000"], "--seq-len 100000"),
    (["--model", "llama3-8b", "--system", "dgx-a100", "--gpus", "8", "--precision", "fp8"], "--precision fp8"),
    (["--model", "resnet50", "--system", "hgx-h100", "--gpus", "1", "--seq-len", "128"], "--seq-len"),
    (["--model", "llama-1b", "--system", "hgx-h100", "--gpus", "8", "--global-batch", "64"], "--global-batch"),
    (["--model", "llama-1b", "--system", "hgx-h100", "--gpus", "8", "--search", "--tp", "2"], "--search"),
    (["--model", "llama3-8b", "--system", "hgx-h100", "--gpus", "8", "--attention", "xformers"], "--attention xformers"),
    (["--model", "resnet50", "--system", "hgx-h100", "--gpus", "1", "--attention", "triton"], "--attention"),
    # a range's end in full, as one would type it (not 1.67772e+07)
    (["--model", "llama3-8b", "--system", "hgx-h100", "--gpus", "8", "--seq-len", "20000000"], "<= 4194304"),
])
def test_bad_training_input_is_one_line_and_exit_2(cli, args, field):
    r = cli("predict", *args)
    assert r.exit_code == 2
    assert r.stderr.startswith("meshscale: error:") and field in r.stderr and r.stderr.count("\n") == 1


def test_a_config_json_missing_a_shape_field_names_it(cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 1024, "num_attention_heads": 8,
                                "intermediate_size": 4096, "vocab_size": 32000, "max_position_embeddings": 2048}))
    r = cli("predict", "--model", str(path), "--system", "hgx-h100", "--gpus", "8")
    assert r.exit_code == 2 and "num_hidden_layers" in r.stderr


def test_predict_with_a_layout_runs_without_importing_torch():
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys\nfrom meshscale.cli import main\n"
            "sys.argv = ['meshscale', 'predict', '--model', 'llama-1b', '--system', 'hgx-h100', '--gpus', '2',"
            " '--fsdp', '2', '--seq-len', '1024']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    src = str(Path(__file__).resolve().parents[2] / "src")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": src})
    assert done.returncode == 0, done.stderr[-2000:]


# ---- the step's kernels by category (what benchmarks/predict_kernels_gpu.py holds a profile against) ---------
@pytest.mark.parametrize("job", [
    TrainingJob(preset("llama3-8b"), ParallelLayout(), 2, 2048, "bf16", "full", cuda_graph=True),
    TrainingJob(preset("gpt2-small"), ParallelLayout(), 16, 1024, "bf16", autocast=True, cuda_graph=True),
    TrainingJob(None, ParallelLayout(), 128, 0, "bf16", resnet_depth=50, autocast=True, cuda_graph=True)])
def test_categories_add_up_to_the_step_models_own_compute(job):
    # the categories re-list the step's kernels on their own; on one GPU without host cost they must sum to the
    # compute the step model prices pass by pass
    from meshscale.predict.training.breakdown import CATEGORIES, predicted_categories
    cats = predicted_categories(job, rates(H100, job.precision))
    assert all(c.category in CATEGORIES and c.seconds > 0 and c.kernels > 0 for c in cats)
    assert sum(c.seconds for c in cats) == pytest.approx(predict_step(job, ONE, H100).compute_s, rel=1e-9)
    names = {c.category for c in cats}
    assert ("conv" in names) == (job.model is None) and ("attention" in names) == (job.model is not None)


# ---- batch norm, DDP's copies, and the step as train's timed mode measures it ---------------------------------
def _bn_launches(kernels, layer):
    from meshscale.predict.training.kernels import launches_of
    mine = [k for k in kernels if k.name.startswith(f"{layer} ")]
    return sum(launches_of(k) for k in mine), sum(k.ops for k in mine)


@pytest.mark.parametrize("batch,image,staged", [(128, 224, True), (1, 32, False)])
def test_batch_norm_launches_the_kernels_pytorchs_channels_last_path_launches(batch, image, staged):
    # Normalization.cu/.cuh, training, channels-last: forward num_batches_tracked += 1, [semaphores zeroed],
    # Welford statistics, running statistics updated and inverted, input normalized; backward [semaphores
    # zeroed], reduce, input gradient. The semaphores exist only for a grid of 8 or more blocks along the rows.
    from meshscale.predict.training.workload import bn_grid_rows
    k = resnet_step(50, batch, image=image)
    forward, ops_f = _bn_launches(k.forward, "bn1.0")
    backward, ops_b = _bn_launches(k.backward, "bn1.0")
    rows = batch * (image // 4) ** 2                  # the first block's first convolution: 64 channels
    assert (bn_grid_rows(rows, 64) > 1) == staged
    assert (forward, backward) == ((5, 3) if staged else (4, 2))
    # the host issues three aten ops: the increment, batch norm forward, its backward
    assert ops_f + ops_b == 3


def test_batch_norm_bytes_and_time_grow_with_the_batch_and_the_reduction_never_reads_less_than_its_input():
    from meshscale.predict.training.workload import batch_norm_kernels
    r = rates(H100, "bf16")
    previous = 0.0
    for batch in (1, 8, 64, 256):
        rows = batch * 56 * 56
        kernels = batch_norm_kernels("bn", rows, 256, 2)
        stats = next(k for k in kernels if k.name.endswith("statistics") and "running" not in k.name)
        assert stats.bytes >= rows * 256 * 2
        t = sum(kernel_seconds(k, r) for k in kernels)
        assert t >= previous
        previous = t


def test_ddp_copies_every_gradient_into_its_bucket_and_back_once_per_parameter_tensor():
    from meshscale.predict.training.step import step_kernels
    from meshscale.models.images import resnet_tensors
    job = TrainingJob(None, ParallelLayout(), 32, resnet_depth=50, autocast=True)
    copies = [k for k in step_kernels(job).layer.backward if k.name.startswith("DDP")]
    assert sum(k.ops for k in copies) == 2 * resnet_tensors(50)
    assert sum(k.bytes for k in copies) == 2 * 2 * 4 * resnet_params(50)     # fp32, read and written, twice


@pytest.mark.parametrize("job", [
    TrainingJob(None, ParallelLayout(), 8, resnet_depth=50, autocast=True),
    TrainingJob(None, ParallelLayout(), 128, resnet_depth=50, autocast=True),
    TrainingJob(preset("gpt2-small"), ParallelLayout(), 1, 64, "bf16", autocast=True, sharding="none"),
    TrainingJob(preset("gpt2-small"), ParallelLayout(), 16, 1024, "bf16", autocast=True, sharding="none"),
    TrainingJob(preset("llama-tiny"), ParallelLayout(micro_batches=2), 4, 64, "bf16", "full")])
def test_a_step_synced_every_step_is_never_faster_than_the_steady_one_and_a_graph_pays_nothing(job):
    from meshscale.predict.training.step import synced_step_seconds
    steady = predict_step(job, ONE, H100)
    synced = synced_step_seconds(steady)
    assert synced >= steady.step_s
    # the host's lead-in is at least its first op; at most the whole host time of the step
    from meshscale.predict.training.step import step_kernels
    kernels = step_kernels(job)
    all_kernels = list(kernels.layer.forward + kernels.layer.backward + kernels.ends.forward + kernels.ends.backward
                       + kernels.per_step)
    assert synced - steady.step_s <= host_seconds(all_kernels) * kernels.stage_layers * kernels.micro_batches + 1e-9
    graphed = predict_step(replace(job, cuda_graph=True), ONE, H100)
    assert synced_step_seconds(graphed) == graphed.step_s


def test_a_small_host_bound_step_exposes_more_when_synced_than_a_large_gpu_bound_one():
    from meshscale.predict.training.step import synced_step_seconds
    shares = []
    for batch in (4, 256):
        p = predict_step(TrainingJob(None, ParallelLayout(), batch, resnet_depth=50, autocast=True), ONE, H100)
        shares.append(synced_step_seconds(p) / p.step_s - 1)
    assert shares[0] > shares[1] >= 0


def test_the_profiles_shipped_calibrate_each_kind_by_category_and_move_to_the_other():
    # what the device check runs: each lent GPU kind's own `train --profile-batches` files (with their kernel
    # categories) predict its own kind and the other one
    from pathlib import Path

    from meshscale.predict.profile import profile_from_result
    from meshscale.predict.question import PredictRequest
    from meshscale.predict.request import predict_training
    from meshscale.results import load_result

    profiles = Path(__file__).resolve().parents[2] / "tests/fixtures/profiles"
    jobs = {"resnet50": dict(batch=128, channels_last=True), "gpt-small": dict(batch=16, seq_len=1024),
            "llama-1b": dict(batch=2, seq_len=2048, fsdp=1, checkpointing="full")}
    for kind, own, other in (("h100", "hgx-h100", "hgx-h200"), ("h200", "hgx-h200", "hgx-h100")):
        for model, options in jobs.items():
            path = profiles / kind / f"profile-{model}.json"
            profile = profile_from_result(load_result(path))
            assert profile.kernel_categories and profile.kernel_categories.batch_per_rank == options["batch"]
            found = {}
            for system in (own, other):
                req = PredictRequest(model=model, system=system, gpus=(1,), profile=path, **options)
                (found[system],), _ = predict_training(req)
                assert found[system].compute_source.startswith(f"calibrated per kernel category on {profile.gpu_model}")
            # on its own GPU the fit goes through the profile's largest batch (or its host's floor)
            measured = profile.step_time_s[profile.batches.index(options["batch"])]
            assert found[own].step_s == pytest.approx(measured, rel=0.05)
            # the H200's faster HBM only ever shortens a step; the same SMs and clock never lengthen one
            faster, slower = (found[other], found[own]) if kind == "h100" else (found[own], found[other])
            assert faster.step_s <= slower.step_s + found[own].host_s + found[other].host_s


def test_foreach_ops_launch_as_multi_tensor_apply_packs_tensors_and_chunks():
    from math import ceil

    from meshscale.predict.training.workload import FOREACH_MAX_TENSORS, foreach_launches
    assert foreach_launches([1000] * 10, 1) == 1                       # everything in one launch
    assert foreach_launches([], 2) == 0 and foreach_launches([0, 0], 2) == 0
    for numels in ([1] * 500, [70_000] * 300, [25_000_000, 3, 9_000_000] * 7):
        for depth in (1, 2, 3):
            n = foreach_launches(numels, depth)
            chunks = sum(ceil(x / 65536) for x in numels)
            # no launch holds more than 320 chunks, nor more tensors than the argument layout has room for
            assert n >= ceil(chunks / 320) and n >= ceil(len(numels) / FOREACH_MAX_TENSORS[depth, False])
            assert n <= chunks
            assert foreach_launches(numels + numels, depth) >= n       # more tensors never fewer launches


def test_tensor_lists_add_up_to_the_parameter_counts():
    from meshscale.models.images import resnet_tensor_numels
    from meshscale.predict.training.workload import end_tensor_numels, layer_tensor_numels
    for name in ("gpt2-small", "llama3-8b", "llama-1b"):
        m = preset(name)
        assert sum(layer_tensor_numels(m)) == m.layer_params()
        assert sum(end_tensor_numels(m)) == m.params() - m.layers * m.layer_params()
    assert sum(resnet_tensor_numels(50)) == resnet_params(50)


def test_a_profile_of_another_memory_format_precision_or_model_is_refused_and_the_same_job_calibrates(tmp_path):
    import json
    from pathlib import Path

    from meshscale.predict.question import PredictRequest
    from meshscale.predict.request import predict_training

    folder = Path(__file__).resolve().parents[2] / "src/meshscale/predict/corpus/emulated-two-node"
    nchw = folder / "resnet50-profile.json"   # bf16, NCHW, measured on an H200
    base = dict(system="hgx-h100", gpus=(1,), batch=128, precision="bf16", profile=nchw)
    with pytest.raises(MeshscaleError, match="NCHW images .* asks --channels-last"):
        predict_training(PredictRequest(model="resnet50", channels_last=True, **base))
    with pytest.raises(MeshscaleError, match="--model resnet50, the prediction asks --model resnet18"):
        predict_training(PredictRequest(model="resnet18", **base))
    with pytest.raises(MeshscaleError, match="--precision bf16, the prediction asks --precision fp32"):
        predict_training(PredictRequest(model="resnet50", **{**base, "precision": "fp32"}))
    (p,), _ = predict_training(PredictRequest(model="resnet50", **base))
    assert p.compute_source.startswith("calibrated on NVIDIA H200")
    # a transformer's profile records the layout options it ran (train writes them since layouts exist)
    profile = json.loads((folder / "gpt-small-profile.json").read_text())
    profile["meta"]["config"]["layout"] = {"checkpointing": "none", "seq_len": None}
    (tmp_path / "gpt.json").write_text(json.dumps(profile))
    gpt = dict(model="gpt-small", system="hgx-h100", gpus=(1,), batch=16, profile=tmp_path / "gpt.json")
    with pytest.raises(MeshscaleError, match="--seq-len 1024, the prediction asks --seq-len 512"):
        predict_training(PredictRequest(seq_len=512, **gpt))
    with pytest.raises(MeshscaleError, match="--activation-checkpointing none, the prediction asks "
                                             "--activation-checkpointing full"):
        predict_training(PredictRequest(checkpointing="full", **gpt))
    (p,), _ = predict_training(PredictRequest(**gpt))
    assert p.compute_source.startswith("calibrated on NVIDIA H200")


def test_a_corpus_run_the_step_model_refuses_is_named_with_its_file_and_row(cli, tmp_path):
    corpus = tmp_path / "runs.yaml"
    corpus.write_text("shapes: {}\nruns:\n"
                      "  - {source: x, gpu: NVIDIA H100 80GB HBM3, system: hgx-h100, gpus: 8, model: llama3-8b,\n"
                      "     seq_len: 8192, precision: bf16, layout: {fsdp: 8}, batch: 2, attention: bogus,\n"
                      "     measured: {tokens_per_s_per_gpu: 5000}}\n")
    res = cli("validate", "--training", "--corpus", str(corpus))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert res.stderr.startswith(f"meshscale: error: {corpus}: run 1: --attention bogus")


def test_torchtitans_own_selective_policy_keeps_less_and_its_published_oom_is_predicted():
    # torchtitan docs/performance.md (64 A100 80GB, FSDP): Llama 2 70B ran at local batch 1 with selective op
    # checkpointing and at batch 2 with full, while "the 70B training with local batch size 2 will cause an OOM
    # error when selective activation checkpointing is used"
    from meshscale.models.memory import activation_elements_per_token

    a100 = gpu_spec({"model": "NVIDIA A100-SXM4-80GB"})
    nodes = Allocation.of("dgx-a100", 8, 8, "hdr", 8)
    llama = preset("llama2-70b")

    def fits(batch, checkpointing):
        job = TrainingJob(llama, ParallelLayout(fsdp=64), batch, 4096, "bf16", checkpointing,
                          selective_policy="torchtitan", rotary="complex", memory_recipe="torchtitan")
        return predict_step(job, nodes, a100).fits

    assert fits(1, "selective") and fits(2, "full") and not fits(2, "selective")
    # every second mm recomputed: fewer elements kept than the engine's policy, more than full checkpointing
    for name in ("llama3-8b", "llama2-70b"):
        model = preset(name)
        kept = {p: activation_elements_per_token(model, "selective", p) for p in ("matmuls", "torchtitan")}
        assert activation_elements_per_token(model, "full") < kept["torchtitan"] < kept["matmuls"]
