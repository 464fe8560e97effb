"""GPUs as sold (SKUs, power limits, TF32), the framework that runs the step, and context parallelism at long
sequences: mechanisms that must hold whatever the constants."""
import random
from dataclasses import replace

import pytest

from meshscale.errors import MeshscaleError
from meshscale.models.layout import ParallelLayout
from meshscale.models.transformer import preset
from meshscale.predict.training.comm import Allocation
from meshscale.predict.training.hardware import gpu_spec, known_gpus, sku_spec
from meshscale.predict.training.kernels import kernel_seconds, rates
from meshscale.predict.training.step import TrainingJob, predict_step, step_kernels

H100 = sku_spec("H100 SXM")
NODE = Allocation.of("hgx-h100", 8)
ONE = Allocation.of("hgx-h100", 1)


# ---- GPUs as sold ----------------------------------------------------------------------------------------------
def test_every_sku_of_the_table_is_its_own_row_by_name_and_an_unknown_one_is_one_line_listing_them():
    names = known_gpus()
    assert {"H100 SXM", "H100 96GB HBM2e", "H800 SXM", "H100 PCIe", "H100 NVL", "A100 40GB SXM", "A100 80GB SXM",
            "A100 40GB PCIe", "A100 80GB PCIe", "V100 SXM2", "V100 32GB SXM2", "V100 PCIe", "V100 32GB PCIe",
            "H200 SXM", "B200 SXM"} <= set(names)
    for name in names:
        spec = sku_spec(name)
        assert spec.memory_bytes > 0 and spec.tdp_w, name      # every SKU sold has its memory and its TDP
    with pytest.raises(MeshscaleError) as e:
        sku_spec("H101 SXM")
    assert "\n" not in str(e.value) and all(n in str(e.value) for n in names)


def _jobs(rng):
    for _ in range(3):
        model = preset(rng.choice(["llama-1b", "llama3-8b", "gpt2-small"]))
        seq = rng.choice([1024, 2048, 8192])
        yield TrainingJob(model, ParallelLayout(fsdp=8), rng.choice([1, 2]), seq, "bf16",
                          rng.choice(["none", "selective", "full"]))
    yield TrainingJob(None, ParallelLayout(dp=8), 64, resnet_depth=50)


def test_a_power_cap_never_speeds_a_step_and_leaves_memory_bound_kernels_alone():
    capped = replace(H100, power_limit_w=500.0)
    assert 0 < capped.power_clock_ratio < 1 and H100.power_clock_ratio == 1
    assert replace(H100, power_limit_w=800.0).power_clock_ratio == 1     # a limit above the TDP binds nothing
    fast, slow = rates(H100, "bf16"), rates(capped, "bf16")
    for job in _jobs(random.Random(7)):
        a, b = predict_step(job, NODE, H100), predict_step(job, NODE, capped)
        assert b.step_s >= a.step_s
        for k in step_kernels(job).every():
            assert kernel_seconds(k, slow) >= kernel_seconds(k, fast) * (1 - 1e-12)
            if k.kind == "memory" and k.instructions.issued == 0:
                assert kernel_seconds(k, slow) == pytest.approx(kernel_seconds(k, fast))


def test_tf32_runs_the_matmuls_on_tensor_cores_where_the_gpu_has_them_and_is_refused_where_not():
    job = TrainingJob(preset("llama-1b"), ParallelLayout(), 1, 2048, "fp32")
    fp32, tf32 = predict_step(job, ONE, H100), predict_step(replace(job, precision="tf32"), ONE, H100)
    assert tf32.step_s < fp32.step_s
    assert tf32.memory.total_bytes == fp32.memory.total_bytes       # the same fp32 tensors
    with pytest.raises(MeshscaleError, match="no TF32"):
        predict_step(replace(job, precision="tf32"), ONE, gpu_spec({"model": "Tesla V100-SXM2-16GB"}))


# ---- the framework that runs the step ----------------------------------------------------------------------
def _transformer_jobs():
    llama, gpt = preset("llama-1b"), preset("gpt2-small")
    yield TrainingJob(llama, ParallelLayout(fsdp=8), 2, 2048, "bf16", "selective")
    yield TrainingJob(llama, ParallelLayout(fsdp=4, tp=2), 2, 2048, "bf16", "full")
    yield TrainingJob(gpt, ParallelLayout(fsdp=8, micro_batches=2), 4, 1024, "bf16", "none", autocast=True)


def test_every_framework_changes_a_transformers_answer_or_is_refused_in_one_line():
    from meshscale.predict.training.framework import STEP_FRAMEWORKS
    from meshscale.predict.request import split_framework
    from meshscale.predict.frameworks import FRAMEWORKS
    for job in _transformer_jobs():
        base = predict_step(job, NODE, H100)
        for name in STEP_FRAMEWORKS:
            if name == "eager":
                continue
            try:
                other = predict_step(replace(job, framework=name), NODE, H100)
            except MeshscaleError as e:
                assert "\n" not in str(e) and name in str(e)
                continue
            assert (other.step_s, other.memory.total_bytes) != (base.step_s, base.memory.total_bytes), name
    for name in FRAMEWORKS:           # the replicas' frameworks run eager PyTorch's step with their exchange
        assert split_framework(name) == ("eager", name)
    with pytest.raises(MeshscaleError, match="use one of eager, compile, megatron"):
        split_framework("caffe")
    with pytest.raises(MeshscaleError, match="transformer"):
        predict_step(TrainingJob(None, ParallelLayout(dp=8), 64, resnet_depth=50, framework="compile"), NODE, H100)


def test_compile_never_adds_a_memory_bound_pass_nor_a_launch_and_fuses_some():
    """Inductor's fusion only removes traffic and launches: for any layer, each pass under compile moves no more
    bytes outside the library kernels and launches no more kernels than eager's; the library kernels (GEMMs,
    attention) are the same."""
    from meshscale.predict.training.kernels import launches_of
    rng = random.Random(3)
    for _ in range(8):
        model = preset(rng.choice(["llama-1b", "llama3-8b", "gpt2-small"]))
        layout = ParallelLayout(fsdp=rng.choice([1, 2, 8]), tp=rng.choice([1, 2]))
        job = TrainingJob(model, layout, 2, rng.choice([1024, 4096]), "bf16",
                          rng.choice(["none", "selective", "full"]), autocast=rng.random() < 0.5)
        eager, compiled = step_kernels(job), step_kernels(replace(job, framework="compile"))
        for part in ("layer", "ends"):
            for pass_ in ("forward", "backward", "recompute"):
                a, b = getattr(getattr(eager, part), pass_), getattr(getattr(compiled, part), pass_)
                memory = lambda ks: sum(k.bytes * k.count for k in ks if k.kind == "memory")  # noqa: E731
                assert memory(b) <= memory(a) * (1 + 1e-12)
                assert sum(launches_of(k) * k.count for k in b) <= sum(launches_of(k) * k.count for k in a)
                library = lambda ks: sorted((k.name, k.flops) for k in ks if k.kind in ("matmul", "attention"))  # noqa
                assert library(b) == library(a)
        if model.style == "llama":   # rotary's and SwiGLU's traffic, at least, fuse away
            assert sum(k.bytes for k in compiled.layer.forward) < sum(k.bytes for k in eager.layer.forward)
        assert compiled.host_ops() < eager.host_ops()


def test_overlapping_tensor_parallel_comm_never_exposes_more_than_running_it_apart():
    from meshscale.predict.training.framework import overlapped_tp_seconds
    rng = random.Random(5)
    for _ in range(200):
        tp = rng.choice([2, 4, 8])
        pairs = [(rng.uniform(0, 1e-3), rng.uniform(0, 1e-3)) for _ in range(4)]
        exposed = overlapped_tp_seconds(pairs, tp)
        assert sum(c / tp for c, _ in pairs) - 1e-15 <= exposed <= sum(c for c, _ in pairs) + 1e-15


def test_the_held_out_runs_load_with_their_sku_and_framework_and_are_predicted():
    from meshscale.predict.training.validate import corpus_path, validate_training
    rows = validate_training(corpus_path().with_name("training-heldout.yaml")).rows
    assert {r["gpu"] for r in rows} == {"H100 96GB HBM2e"} and all(r["predicted"] > 0 for r in rows)
    # torch.compile's runs are predicted faster than the eager runs of the same table, as they were measured
    by_source = {r["source"]: r["predicted"] for r in rows}
    for eager, compiled in ((k, k + " + torch.compile") for k in by_source if not k.endswith("compile")):
        assert by_source[compiled] > by_source[eager]


def test_transformer_engine_keeps_each_fused_op_its_own_kernel_and_every_library_kernel():
    """Megatron's fused ops are one kernel each (no chain merged, none lost): every element-wise op with fused
    traffic appears once per eager occurrence at that traffic (but grouped-query expansion, which its attention
    does not need: gone); GEMMs and attention are eager's."""
    from collections import Counter
    from meshscale.predict.training.kernels import GQA_EXPANSION
    for job in _transformer_jobs():
        eager, te = step_kernels(job), step_kernels(replace(job, framework="megatron"))
        for pass_ in ("forward", "backward", "recompute"):
            a, b = getattr(eager.layer, pass_), getattr(te.layer, pass_)
            assert not any(k.name.startswith(GQA_EXPANSION) for k in b)
            fused = Counter((k.name, k.fused_bytes) for k in a if k.kind == "memory" and k.fused_bytes
                            and not k.name.startswith(GQA_EXPANSION))
            kept = Counter((k.name, k.bytes) for k in b if k.kind == "memory" and (k.name, k.bytes) in fused)
            assert kept == fused
            library = lambda ks: Counter((k.name, k.flops) for k in ks if k.kind in ("matmul", "attention"))  # noqa
            assert library(b) == library(a)


def test_a_framework_that_fixes_its_memory_recipe_is_the_memory_models_own_and_zero_stages_shed_state_in_order():
    from meshscale.models.memory import training_memory
    from meshscale.predict.training.framework import STEP_FRAMEWORKS
    from meshscale.predict.training.step import job_memory
    from meshscale.predict.training.validate import _memory_recipe

    job = TrainingJob(preset("llama-1b"), ParallelLayout(fsdp=8), 2, 2048, "bf16", "full")
    for name, fw in STEP_FRAMEWORKS.items():
        # the job's own recipe counts only where the framework fixes none; a compiled step's blocks compiled
        mine = job_memory(replace(job, framework=name, memory_recipe="llm-foundry"))
        recipe = fw.memory_recipe or "llm-foundry"
        assert (mine == training_memory(job.model, job.layout, batch=2, seq_len=2048, checkpointing="full",
                                        recipe=recipe, compiled=fw.graph_layers)) == (not name.startswith("zero")), name
    static = [job_memory(replace(job, framework=f"zero{s}")) for s in (1, 2, 3)]
    # at the optimizer's step: parameters, gradients and state; each stage partitions one more of them
    held = [sum(m.parts[k] for k in ("params", "grads", "optimizer")) for e in static for m in e.moments
            if m.name == "optimizer"]
    assert held[0] > held[1] > held[2]
    assert all(e.total_bytes > 0 and e.reserved_bytes >= e.allocated_bytes for e in static)
    assert _memory_recipe({"framework": "megatron"}) == "megatron"
    assert _memory_recipe({"memory_recipe": "torchtitan"}) == "torchtitan"
    with pytest.raises(ValueError, match="drop it"):      # one question, one answer
        _memory_recipe({"framework": "megatron", "memory_recipe": "megatron"})
