"""The Python API: docs/api.md's example runs as written, and `import meshscale` stays light."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import meshscale
from meshscale.errors import MeshscaleError

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_the_documented_example_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    exec(compile(blocks[0], str(DOC), "exec"), {"__name__": "api_doc"})
    printed = capsys.readouterr().out
    assert "all_reduce 1 GiB on 8 GPUs:" in printed and "plan:" in printed
    page = tmp_path.glob("*/report/index.html")
    html = next(page).read_text()
    assert "plot-busbw-all-reduce" in html and "Predicted scaling (not measured)" in html


def test_every_entry_point_is_documented():
    for name in meshscale.__all__:
        fn = getattr(meshscale, name)
        assert fn.__doc__ and len(fn.__doc__) > 40, name
        assert f"`{name}(" in DOC.read_text(), name
    from meshscale.predict import PredictRequest, predict_rows
    assert PredictRequest.__doc__ and predict_rows.__doc__


def test_import_meshscale_is_light():
    code = "import sys, meshscale; print(sorted(m for m in sys.modules if m.startswith(('meshscale.', 'matplotlib', 'torch'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_bad_input_is_a_one_line_error():
    with pytest.raises(MeshscaleError, match="has 8 devices; ask for 1 to 8, not 9"):
        meshscale.plan("hgx-h200", "all_reduce", 1 << 20, gpus=9)
