"""`train --profile-batches` on a GPU (pytest -m gpu): the profile carries the largest batch's kernel time per
category, which adds up to about the step's kernel time and calibrates `predict --profile` category by category."""
import pytest
import torch

from meshscale.train.config import LayoutOptions, SpeedOptions, TrainConfig
from meshscale.train.kernel_categories import CATEGORIES
from meshscale.train.runner import profile

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny"])
def test_a_gpu_profile_records_each_kernel_category(model, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    cfg = TrainConfig(model=model, device="cuda", steps=12, timing_warmup=2, timeout_s=120,
                      speed=SpeedOptions(precision="bf16"),
                      layout=LayoutOptions(seq_len=64) if model == "llama-tiny" else LayoutOptions())
    result = profile(cfg, [2, 4])
    found = result.meta["kernel_categories"]
    seconds = found["seconds_per_step"]
    assert found["batch_per_rank"] == 4 and set(seconds) <= set(CATEGORIES)
    assert {"matmul: head", "optimizer", "embedding/loss"} <= set(seconds)
    # every kernel is in one category: the categories add up to the traced kernels' time
    assert sum(seconds.values()) == pytest.approx(found["kernel_s_per_step"], rel=1e-4)  # trace timestamps to 1 ns
    from meshscale.predict.profile import profile_from_result
    assert profile_from_result(result).kernel_categories.batch_per_rank == 4
