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
