"""Kernel time per category: measured under torch.profiler (train.kernel_categories), and a profile's categories
moved to another GPU by their roofline and the SMs' own time (predict.training.kernels.CategoryCalibration)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from meshscale.errors import MeshscaleError
from meshscale.models.layout import ParallelLayout
from meshscale.models.transformer import preset
from meshscale.predict.training.breakdown import predicted_categories, step_kernel_list
from meshscale.predict.training.comm import Allocation
from meshscale.predict.training.hardware import gpu_spec, system_gpu
from meshscale.predict.training.kernels import kernel_seconds, rates, roofline_seconds
from meshscale.train.kernel_categories import CATEGORIES
from meshscale.predict.question import PredictRequest
from meshscale.predict.request import predict_training
from meshscale.predict.training.step import TrainingJob, predict_step
from meshscale.results import Result

H100, _ = system_gpu("hgx-h100")
H200 = gpu_spec({"model": "NVIDIA H200"})
A100 = gpu_spec({"model": "NVIDIA A100-SXM4-80GB"})


@pytest.mark.parametrize("job", [
    TrainingJob(preset("llama-1b"), ParallelLayout(), 2, 2048, "bf16", "full"),
    TrainingJob(preset("gpt2-small"), ParallelLayout(), 16, 1024, "bf16", autocast=True, sharding="none"),
    TrainingJob(None, ParallelLayout(), 64, resnet_depth=50, autocast=True, channels_last=True),
], ids=["llama-1b", "gpt2-small", "resnet50"])
def test_the_roofline_part_of_a_kernel_is_never_more_than_the_kernel(job):
    for gpu in (H100, H200, A100):
        r = rates(gpu, "bf16")
        for k in step_kernel_list(job):
            assert 0 <= roofline_seconds(k, r) <= kernel_seconds(k, r) * (1 + 1e-9), k.name


def _gpt_profile(tmp_path, gpu, scale: dict[str, float] | None = None, drop: tuple[str, ...] = ()):
    """A gpt-small profile on ``gpu`` whose steps and categories are the model's own datasheet times there,
    each category multiplied by ``scale`` (and the steps by what that adds)."""
    req = PredictRequest(model="gpt-small", system="hgx-h100", gpus=(1,), batch=16, seq_len=1024, precision="bf16")
    (p,), _ = predict_training(req)
    r = rates(gpu, "bf16", 1.0, p.job.attention)
    rows, cats = [], {}
    for b in (8, 16):
        job = replace(p.job, batch=b)
        per = {c.category: c.seconds * (scale or {}).get(c.category, 1.0) for c in predicted_categories(job, r)}
        extra = sum(per.values()) - sum(c.seconds for c in predicted_categories(job, r))
        rows.append({"batch_per_rank": b, "step_time_s": predict_step(job, Allocation.of("hgx-h100", 1), gpu).step_s
                     + extra})
        cats = per
    cats = {c: s for c, s in cats.items() if c not in drop}
    path = tmp_path / f"profile-{gpu.model.replace(' ', '_')}.json"
    Result("train", rows, False, {"profile": True, "model": "gpt-small", "precision": "bf16",
                                  "kernel_categories": {"batch_per_rank": 16, "kernel_s_per_step": sum(cats.values()),
                                                        "seconds_per_step": cats}},
           {"gpus": [gpu.model]}).save(path)
    return path, p.job


def _predict(path, system):
    (p,), _ = predict_training(PredictRequest(model="gpt-small", system=system, gpus=(1,), batch=16, seq_len=1024,
                                               profile=path))
    return p


def test_a_profile_of_the_datasheet_itself_predicts_the_datasheet_on_its_own_gpu(tmp_path):
    path, job = _gpt_profile(tmp_path, H100)
    p = _predict(path, "hgx-h100")
    assert p.compute_source.startswith("calibrated per kernel category on NVIDIA H100")
    assert p.step_s == pytest.approx(predict_step(job, Allocation.of("hgx-h100", 1), H100).step_s, rel=1e-3)


def test_time_beyond_the_roofline_moves_with_the_sms_and_the_roofline_with_its_resource(tmp_path):
    # the head measured 4x its datasheet time on the H100: the excess is the SMs' own, and the H200 has the
    # same SMs at the same clock, so the head takes as long there; a category at its roofline on the H100
    # (scaled down to it) moves by the roofline alone
    job = _gpt_profile(tmp_path, H100)[1]
    r100, r200 = rates(H100, "bf16", 1.0, job.attention), rates(H200, "bf16", 1.0, job.attention)
    assert r100.issue_per_s == r200.issue_per_s
    roof = {c: 0.0 for c in CATEGORIES}
    from meshscale.predict.training.kernels import category_of
    for k in step_kernel_list(job):
        roof[category_of(k, True)] += roofline_seconds(k, r100)
    datasheet = {c.category: c.seconds for c in predicted_categories(job, r100)}
    scale = {"matmul: head": 4.0, "optimizer": roof["optimizer"] / datasheet["optimizer"]}
    path, _ = _gpt_profile(tmp_path, H100, scale)
    moved = _predict(path, "hgx-h200")
    by = {}
    for k in step_kernel_list(job):
        c = category_of(k, True)
        by[c] = by.get(c, 0.0) + kernel_seconds(k, moved.rates) / moved.rates.factor
    assert by["matmul: head"] == pytest.approx(4.0 * datasheet["matmul: head"] - sum(
        roofline_seconds(k, r100) - roofline_seconds(k, r200) for k in step_kernel_list(job)
        if category_of(k, True) == "matmul: head"), rel=1e-6)
    opt200 = sum(roofline_seconds(k, r200) for k in step_kernel_list(job) if category_of(k, True) == "optimizer")
    assert by["optimizer"] == pytest.approx(opt200, rel=1e-6)
    assert opt200 < roof["optimizer"]   # the H200's HBM is faster


def test_a_category_the_profile_did_not_measure_is_priced_from_the_datasheet(tmp_path):
    path, job = _gpt_profile(tmp_path, H100, {"matmul: MLP": 2.0}, drop=("attention",))
    moved = _predict(path, "hgx-h200")
    plain = rates(H200, "bf16", 1.0, job.attention)
    for k in step_kernel_list(job):
        if k.kind == "attention":
            assert kernel_seconds(k, moved.rates) / moved.rates.factor == pytest.approx(kernel_seconds(k, plain))


def test_a_profile_with_bad_categories_is_refused_in_one_line(tmp_path):
    import json

    path, _ = _gpt_profile(tmp_path, H100)
    data = json.loads(path.read_text())
    data["meta"]["kernel_categories"]["seconds_per_step"]["warp drive"] = 1.0
    path.write_text(json.dumps(data))
    with pytest.raises(MeshscaleError, match="unknown category 'warp drive'"):
        _predict(path, "hgx-h200")
    data["meta"]["kernel_categories"] = {"batch_per_rank": 16}
    path.write_text(json.dumps(data))
    with pytest.raises(MeshscaleError, match="kernel_categories wants"):
        _predict(path, "hgx-h200")


@pytest.mark.slow  # a profiled training step
def test_a_traced_step_puts_each_op_in_the_category_the_step_model_uses():
    # CPU: the leaf ops stand for kernels; a tiny GPT's forward, backward and AdamW step
    import torch

    from meshscale.models.transformer import config_from_fields
    from meshscale.train.kernel_categories import StepShapes, categorize, trace
    from meshscale.train.transformer import Transformer

    torch.manual_seed(0)
    cfg = config_from_fields("tiny", {"layers": 1, "d_model": 32, "heads": 2, "ffn_dim": 128, "vocab_size": 96,
                                      "max_seq_len": 16, "style": "gpt2"}, "test")
    model = Transformer(cfg, 16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 96, (2, 16))

    def step(_):
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()

    step(0)
    device = torch.device("cpu")
    measured = categorize(trace(step, 1, 1, device, detailed=True), StepShapes(True, 96, 128), device)
    found = {c for c, s in measured.seconds.items() if s > 0}
    assert {"matmul: head", "matmul: MLP", "embedding/loss", "optimizer", "norm"} <= found
    assert found <= set(CATEGORIES)


def _categories_of(ctx, cfg):
    import torch

    from meshscale.train.kernel_categories import kernel_categories
    torch.set_num_threads(1)
    return kernel_categories(cfg, torch.device("cpu"), warm=1, steps=1)


@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny"])
def test_train_s_own_step_is_traced_into_the_categories_on_one_rank(model):
    # the step `train --profile-batches` traces on a GPU, here on a CPU rank over Gloo
    from meshscale.execute import launch
    from meshscale.train.config import LayoutOptions, TrainConfig
    from meshscale.train.parallel.plan import with_default_layout

    cfg = TrainConfig(model=model, device="cpu", batch_per_rank=2, timing=False)
    if model == "llama-tiny":
        cfg = with_default_layout(TrainConfig(model=model, device="cpu", batch_per_rank=2, timing=False,
                                              layout=LayoutOptions(seq_len=32)))
    [found] = launch(_categories_of, 1, (cfg,), timeout_s=60, deadline_s=120)
    seconds = found["seconds_per_step"]
    assert found["batch_per_rank"] == 2 and set(seconds) <= set(CATEGORIES)
    found = {c for c, s in seconds.items() if s > 0}
    assert {"matmul: head", "optimizer", "embedding/loss"} <= found
    if model == "llama-tiny":   # (gpt-tiny's MLP is as wide as its vocabulary, 256: its matmuls read as the head)
        assert "matmul: MLP" in found
        assert seconds.get("rotary", 0) > 0 and seconds.get("FSDP copies", 0) > 0
