"""Under torch.compile the loss runs compiled only where the engine compiles it (torchtitan since 2025-04, not
meshscale's train, not torchtitan of 2024): the step's time and its memory read one rule
(`MemoryRecipe.loss_under`); and a backward kernel takes its category's backward ratio where the atlas has one."""
from dataclasses import replace

import pytest

from meshscale.models.layout import ParallelLayout
from meshscale.models.memory import RECIPES
from meshscale.models.transformer import TransformerConfig
from meshscale.models.atlas import shipped_atlases
from meshscale.predict.training.framework import step_framework
from meshscale.predict.training.measured import MeasuredKernels
from meshscale.predict.training.step import TrainingJob, compiles_loss, step_kernels


def _job(recipe: str, framework: str = "compile") -> TrainingJob:
    model = TransformerConfig("t", 2, 1024, 8, 8, 2816, 32000, 1024)
    return TrainingJob(model, ParallelLayout(), 2, 1024, "bf16", "none", framework=framework, memory_recipe=recipe)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_loss_is_fused_in_time_exactly_where_the_memory_model_compiles_it(recipe):
    job = _job(recipe)
    fw = step_framework(job.framework)
    if fw.memory_recipe and fw.memory_recipe != recipe:   # a framework that fixes its own recipe
        return
    compiled = RECIPES[recipe].loss_under(True) == "compiled"
    assert compiles_loss(job, fw) == compiled
    assert not compiles_loss(_job(recipe, "eager"), step_framework("eager"))
    if RECIPES[recipe].loss == "eager":   # an eager loss: three ops a pass, one fused kernel where compiled
        ends = step_kernels(job).ends
        loss = [k for k in ends.forward + ends.backward if k.name.startswith("cross-entropy")]
        assert loss and all(k.ops == 1 for k in loss) == compiled


def test_a_backward_kernel_takes_its_categorys_backward_ratio_where_measured():
    atlas = shipped_atlases()[0]
    ops = dict(atlas.memory_ops)
    forward = ops["embedding/loss"]
    for backward in (None, 1.1, 2.5):
        measured = dict(ops)
        measured.pop("embedding/loss backward", None)
        if backward is not None:
            measured["embedding/loss backward"] = backward
        m = MeasuredKernels(replace(atlas, memory_ops=measured), "bf16", atlas.dense_bf16_flops, 1.0)
        assert m.memory_seconds(1e9, "embedding/loss", 1e12) == pytest.approx(max(1.0, forward) * 1e-3)
        want = max(1.0, forward if backward is None else backward) * 1e-3
        assert m.memory_seconds(1e9, "embedding/loss", 1e12, backward=True) == pytest.approx(want)
        assert m.memory_seconds(1e9, "norm", 1e12, backward=True) == pytest.approx(max(1.0, ops["norm"]) * 1e-3)
