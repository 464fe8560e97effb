"""System files: a good user file loads; every malformed case is refused naming the file and the entry."""
import textwrap

import pytest

from meshscale.errors import TopologyError
from meshscale.topology import load, load_system, pair_bandwidth, relation

GOOD = """
name: my-server
gpu_count: 2
defaults:
  nvlink: {generation: 2}
nodes:
  - {name: cpu0, kind: cpu}
  - {name: gpu0, kind: gpu, index: 0}
  - {name: gpu1, kind: gpu, index: 1}
links:
  - {a: gpu0, b: gpu1, kind: nvlink, count: 2}
  - {a: gpu0, b: cpu0, kind: pcie, generation: 3, width: 16}
  - {a: gpu1, b: cpu0, kind: pcie, generation: 3, width: 16}
"""


def write(tmp_path, text, name="system.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_a_user_file_loads_like_a_catalog_system(tmp_path):
    topo = load_system(str(write(tmp_path, GOOD)))
    assert relation(topo, 0, 1) == "NV2" and pair_bandwidth(topo, 0, 1) == pytest.approx(50e9)


BAD = {  # case -> (replace this, with this, words the message must contain besides the file name)
    "unknown link kind": ("kind: nvlink, count: 2", "kind: warp, count: 2", ["links[0]", "unknown link kind 'warp'", "nvlink"]),
    "negative bandwidth": ("kind: nvlink, count: 2", "kind: nvlink, count: 2, bandwidth_gb_per_s: -5",
                           ["links[0]", "not positive"]),
    "link to a missing node": ("b: cpu0, kind: pcie, generation: 3, width: 16}\n  - {a: gpu1",
                               "b: cpu9, kind: pcie, generation: 3, width: 16}\n  - {a: gpu1",
                               ["links[1]", "missing node 'cpu9'"]),
    "gpu_count mismatch": ("gpu_count: 2", "gpu_count: 4", ["gpu_count", "says 4 but 2"]),
    "duplicate node names": ("{name: gpu1, kind: gpu, index: 1}", "{name: gpu0, kind: gpu, index: 1}",
                             ["nodes[2] (gpu0)", "duplicate node name"]),
    "duplicate links": ("  - {a: gpu0, b: cpu0", "  - {a: cpu0, b: gpu0, kind: pcie, generation: 3, width: 8}\n  - {a: gpu0, b: cpu0",
                        ["link 2 (gpu0 - cpu0)", "repeats link 1", "count"]),
    "unknown node kind": ("{name: cpu0, kind: cpu}", "{name: cpu0, kind: tpu}", ["nodes[0] (cpu0)", "unknown node kind 'tpu'"]),
    "bad count": ("nvlink, count: 2", "nvlink, count: 0", ["links[0]", "count", "0"]),
    "duplicate index": ("{name: gpu1, kind: gpu, index: 1}", "{name: gpu1, kind: gpu, index: 0}", ["distinct integer index"]),
    "unknown key": ("kind: nvlink, count: 2", "kind: nvlink, count: 2, speed: 9", ["links[0]", "unknown key", "speed"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_files_are_refused_with_file_and_entry(tmp_path, case):
    old, new, words = BAD[case]
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(TopologyError) as err:
        load(path)
    message = str(err.value)
    assert str(path) in message and "\n" not in message
    for word in words:
        assert word in message, (word, message)


def test_not_yaml_is_refused(tmp_path):
    path = write(tmp_path, "name: x\nnodes: [unclosed\n")
    with pytest.raises(TopologyError, match="not valid YAML") as err:
        load(path)
    assert str(path) in str(err.value)
    with pytest.raises(TopologyError, match="not a mapping"):
        load(write(tmp_path, "just words", "words.yaml"))
    with pytest.raises(TopologyError, match="not valid JSON"):
        load(write(tmp_path, "{", "x.json"))


def test_unknown_system_lists_the_valid_names(tmp_path):
    with pytest.raises(TopologyError) as err:
        load_system("dgx-9000")
    assert "dgx-9000" in str(err.value) and "dgx1-p100" in str(err.value) and "hgx-h200" in str(err.value)
    with pytest.raises(TopologyError, match="cannot read"):
        load_system(str(tmp_path / "absent.yaml"))


def test_cli_refuses_a_bad_file_with_one_line_and_exit_2(tmp_path, cli_process):
    path = write(tmp_path, GOOD.replace("kind: nvlink, count: 2", "kind: warp, count: 2"), "bad.yaml")
    proc = cli_process("topo", "--system", str(path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshscale: error:") and "bad.yaml" in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_topo_json_written_by_the_cli_loads_again(tmp_path, cli):
    out = tmp_path / "h200.json"
    result = cli("topo", "--system", "hgx-h200", "--format", "json", "--output", str(out))
    assert result.exit_code == 0 and out.exists()
    assert load(out) == load_system("hgx-h200")
    result = cli("topo", "--system", "hgx-h200", "--format", "json", "--output", str(tmp_path / "no" / "x.json"))
    assert result.exit_code != 0 and "cannot write" in result.stderr
