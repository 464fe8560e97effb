"""The model registry, data sources, learning-rate recipe and scaling configurations (no processes)."""
import numpy as np
import pytest
import torch

from meshscale.errors import MeshscaleError
from meshscale.train.recipe import learning_rate
from meshscale.train.config import OptimizerOptions, TrainConfig
from meshscale.execute.datasets import image_folder, token_file
from meshscale.train.data import Batches, open_data, synthetic
from meshscale.models.registry import MODELS, get_model, image_spec
from meshscale.train.builders import build_model
from meshscale.train.scale import configurations


@pytest.mark.parametrize("name", ["small-cnn", "gpt-tiny", "llama-tiny"])
def test_params_match_the_built_model_and_it_runs(name):
    spec = get_model(name)
    torch.manual_seed(0)
    model = build_model(spec)
    assert sum(p.numel() for p in model.parameters()) == spec.params
    x = torch.randn(2, *spec.input_shape) if spec.input_kind == "image" else torch.randint(spec.num_classes, (2, *spec.input_shape))
    out = model(x)
    assert out.shape[-1] == spec.num_classes


def test_gpt_small_is_gpt2_small_and_flops_follow_6nt():
    spec = get_model("gpt-small")
    assert spec.params == get_model("gpt2-small").params  # the published GPT-2 small shape (models/presets.yaml)
    with torch.device("meta"):
        assert sum(p.numel() for p in build_model(spec).parameters()) == spec.params
    t = spec.input_shape[0]
    assert 6 * spec.params * t * 0.95 < spec.flops_per_sample < 6 * spec.params * t * 1.3
    assert get_model("gpt-medium").flops_per_sample > 2.5 * spec.flops_per_sample


def test_the_registry_imports_no_torch():
    import os
    import subprocess
    import sys
    from pathlib import Path
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    code = "import sys, meshscale.models.registry; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == "False"


def test_a_resnet_head_follows_the_classes():
    resnet = get_model("resnet18")
    fewer = image_spec(resnet, 3, 224, 224, 10)
    assert resnet.params - fewer.params == (1000 - 10) * (512 + 1)  # the 512-wide head's weights and biases
    head = 3 * 2 * 512  # forward + backward FLOPs of one class's row of the head, per image
    assert resnet.flops_per_sample - fewer.flops_per_sample == pytest.approx((1000 - 10) * head)
    quarter = image_spec(resnet, 3, 112, 112, 10).flops_per_sample  # a quarter of the pixels: the convolutions'
    assert quarter == pytest.approx((fewer.flops_per_sample - 10 * head) / 4 + 10 * head, rel=1e-3)


def test_every_entry_is_complete():
    for spec in MODELS.values():
        assert spec.params > 0 and spec.flops_per_sample > 0 and spec.input_kind in ("image", "tokens")
    assert MODELS["resnet50"].flops_per_sample > MODELS["resnet18"].flops_per_sample


def test_image_spec_adapts_shape_classes_and_flops():
    small = image_spec(get_model("small-cnn"), 1, 8, 8, 10)
    model = build_model(small)
    assert model(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    assert sum(p.numel() for p in model.parameters()) == small.params
    assert small.flops_per_sample < get_model("small-cnn").flops_per_sample
    with pytest.raises(MeshscaleError, match="takes tokens"):
        image_spec(get_model("gpt-tiny"), 1, 8, 8, 10)


def test_unknown_model_and_unusable_torchvision_are_clear_errors():
    with pytest.raises(MeshscaleError, match="unknown model 'nope'.*small-cnn"):
        get_model("nope")
    try:
        import torchvision  # noqa: F401
        pytest.skip("torchvision works here")
    except Exception:
        pass
    with pytest.raises(MeshscaleError, match="resnet50 needs a working torchvision"):
        build_model(get_model("resnet50"))


def test_batches_do_not_depend_on_the_world_size():
    data = open_data("digits", "image", (1, 8, 8), 10)
    one = Batches(data, 12, 0, 1, seed=3, device=torch.device("cpu"))
    parts = [Batches(data, 4, r, 3, seed=3, device=torch.device("cpu")) for r in range(3)]
    for step in (0, 5, one.steps_per_epoch + 1):  # also across an epoch boundary
        x, y = one.get(step)
        xs, ys = zip(*(p.get(step) for p in parts))
        assert torch.equal(torch.cat(xs), x) and torch.equal(torch.cat(ys), y)
    assert not torch.equal(one.get(0)[1], one.get(one.steps_per_epoch)[1])  # a new shuffle each epoch


def test_token_file_windows_shift_by_one(tmp_path):
    tokens = np.arange(100, dtype=np.uint16) % 50
    path = tmp_path / "t.bin"
    tokens.tofile(path)
    data = token_file(path, seq_len=8, vocab_size=64)
    assert data.n == (100 - 1) // 8
    x, y = data.fetch(np.array([2]))
    assert x.tolist()[0] == tokens[16:24].tolist() and y.tolist()[0] == tokens[17:25].tolist()
    with pytest.raises(MeshscaleError, match="vocabulary is 16"):
        token_file(path, 8, 16)


def test_image_folder_reads_classes_from_sub_folders(tmp_path):
    from PIL import Image
    for c, colour in (("cat", 255), ("dog", 0)):
        (tmp_path / c).mkdir()
        for i in range(2):
            Image.new("RGB", (20, 10), (colour, 0, 0)).save(tmp_path / c / f"{i}.png")
    data = image_folder(tmp_path, (6, 6))
    x, y = data.fetch(np.array([0, 3]))
    assert data.n == 4 and data.num_classes == 2 and x.shape == (2, 3, 6, 6)
    assert y.tolist() == [0, 1] and x[0, 0].mean() > 0.99 and x[1, 0].mean() < 0.01
    with pytest.raises(MeshscaleError, match="does not exist"):
        image_folder(tmp_path / "missing")


def test_synthetic_data_has_the_model_shape_and_ignores_the_world():
    data = synthetic("tokens", (16,), 100)
    x, y = Batches(data, 4, 0, 1, 0, torch.device("cpu")).get(7)
    assert x.shape == y.shape == (4, 16) and int(x.max()) < 100
    halves = [Batches(data, 2, r, 2, 0, torch.device("cpu")).get(0) for r in range(2)]
    assert torch.equal(torch.cat([h[0] for h in halves]), x) and torch.equal(torch.cat([h[1] for h in halves]), y)


def test_learning_rate_scales_linearly_and_warms_up():
    spec = get_model("small-cnn")
    cfg = TrainConfig(world=4, batch_per_rank=64, optimizer=OptimizerOptions(base_lr=0.1, ref_batch=256, warmup_steps=10))
    peak = learning_rate(cfg, spec, 100)
    assert peak == pytest.approx(0.1 * 256 / 256)
    assert learning_rate(cfg, spec, 0) == pytest.approx(peak / 10)
    bigger = TrainConfig(world=8, batch_per_rank=64, optimizer=OptimizerOptions(base_lr=0.1, ref_batch=256))
    assert learning_rate(bigger, spec, 0) == pytest.approx(2 * peak)


def test_scaling_configurations():
    base = TrainConfig(model="small-cnn")
    weak = configurations(base, [4, 1, 2], weak=True, batch=32)
    assert [(c.world, c.batch_per_rank) for c in weak] == [(1, 32), (2, 32), (4, 32)]
    strong = configurations(base, [1, 2, 4], weak=False, batch=64)
    assert [c.global_batch for c in strong] == [64, 64, 64]
    with pytest.raises(MeshscaleError, match="not divisible by 3"):
        configurations(base, [1, 3], weak=False, batch=64)
    if not torch.cuda.is_available():
        with pytest.raises(MeshscaleError, match="--gpus 8: this machine has 0 GPUs"):
            configurations(TrainConfig(device="cuda"), [8], weak=True, batch=32)


def test_scaling_plot_is_written(tmp_path):
    from meshscale.results import Result
    from meshscale.plots import save, scale_result_chart
    rows = [{"world_size": n, "throughput_samples_per_s": 100.0 * n * 0.9 ** (n > 1), "speedup": n * 0.9 ** (n > 1)}
            for n in (1, 2, 4)]
    path = save(scale_result_chart(Result("scale", rows, meta={"model": "m", "mode": "ddp", "scaling": "weak", "batch": 8})),
                tmp_path / "s.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("gone", ["meshscale.train.models", "meshscale.train.gpt", "meshscale.train.gpt_config",
                                  "meshscale.train.cnn"])
def test_one_registry_and_one_gpt(gone):
    # the registry lives in models/registry.py (torch-free), GPTs are TransformerConfigs built by train/transformer.py
    import importlib
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(gone)
