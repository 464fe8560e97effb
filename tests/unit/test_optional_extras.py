"""A missing optional extra is one line naming its pip command, before any rank starts."""
import sys

import pytest


@pytest.mark.parametrize("args, module, extra", [
    (("train", "--model", "small-cnn", "--data", "digits", "--cpus", "1", "--steps", "1"), "sklearn.datasets", "digits"),
    (("train", "--model", "small-cnn", "--cpus", "1", "--steps", "1", "--tensorboard", "tb"), "torch.utils.tensorboard",
     "tensorboard"),
    (("scale", "--model", "small-cnn", "--cpus", "1", "--weak", "--batch", "4", "--steps", "1", "--data", "digits"),
     "sklearn.datasets", "digits"),
])
def test_missing_extra_is_one_line_with_the_pip_command(cli, monkeypatch, tmp_path, args, module, extra):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    monkeypatch.setattr("meshscale.train.runner.train", lambda *a, **k: pytest.fail("training started"))
    monkeypatch.setattr("meshscale.train.scale.scale", lambda *a, **k: pytest.fail("scaling started"))
    out = cli(*args)
    assert out.exit_code == 2
    lines = out.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("meshscale: error: ")
    assert f"pip install 'meshscale[{extra}]'" in lines[0]


def test_step_log_refuses_tensorboard_it_cannot_write(monkeypatch, tmp_path):
    from meshscale.errors import MeshscaleError
    from meshscale.train.step_log import StepLog
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(MeshscaleError, match=r"meshscale\[tensorboard\]"):
        StepLog(None, str(tmp_path / "tb"), False, 1, 0, "t")


def test_extras_are_declared():
    import tomllib
    from pathlib import Path
    extras = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["digits"] == ["scikit-learn"] and extras["tensorboard"] == ["tensorboard"]
    assert extras["fp8"] == ["torchao"]
    assert "scikit-learn" in extras["test"]
