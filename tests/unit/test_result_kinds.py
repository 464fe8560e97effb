"""Every kind of result meshscale writes can be loaded again (load_result refuses unknown kinds)."""
import re
from pathlib import Path

from meshscale.results import KINDS, Result, load_result

SRC = Path(__file__).resolve().parents[2] / "src" / "meshscale"


def test_every_kind_written_is_a_known_kind(tmp_path):
    written = set()
    for path in SRC.rglob("*.py"):
        written |= set(re.findall(r'(?:Result|measured)\(\s*"([a-z-]+)"', path.read_text()))
    assert written and written <= set(KINDS), sorted(written - set(KINDS))
    for kind in sorted(written):
        assert load_result(Result(kind, [], meta={}).save(tmp_path / f"{kind}.json")).kind == kind


def test_a_figure_sampled_several_times_is_a_list_of_figures(tmp_path):
    """bench's host copies keep each sample's rate (sample_bytes_per_s): a list of finite figures, each checked."""
    import pytest

    from meshscale.errors import MeshscaleError
    from meshscale.results import Result, load_result

    row = {"direction": "host->device", "memory": "pinned", "size_bytes": 1 << 20, "seconds": 1e-4,
           "bandwidth_bytes_per_s": 1e10, "sample_bytes_per_s": [1e10, 1.1e10, 0.9e10]}
    path = Result("bench-host-copy", [row]).save(tmp_path / "copies.json")
    assert load_result(path).rows[0]["sample_bytes_per_s"] == [1e10, 1.1e10, 0.9e10]
    bad = Result("bench-host-copy", [dict(row, sample_bytes_per_s=[1e10, "fast"])]).save(tmp_path / "bad.json")
    with pytest.raises(MeshscaleError, match="sample_bytes_per_s"):
        load_result(bad)
