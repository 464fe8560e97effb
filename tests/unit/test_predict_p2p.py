"""`meshscale predict --p2p`: the link model calibrated from a real bench p2p run (2x H200) changes the
prediction, and only the exchange part of it."""
import json
from pathlib import Path

FIX = Path(__file__).parents[1] / "fixtures"


def _predict(cli, tmp_path, name, *extra):
    out = tmp_path / f"{name}.json"
    res = cli("predict", "--model", "gpt-small", "--system", str(FIX / "topo_h200x2.json"),
              "--gpus", "1,2", "--global-batch", "8", "--json", str(out), *extra)
    assert res.exit_code == 0, res.output
    return {r["world_size"]: r["throughput_samples_per_s"] for r in json.loads(out.read_text())["rows"]}


def test_p2p_calibration_changes_only_the_exchange(tmp_path, cli):
    plain = _predict(cli, tmp_path, "plain")
    calibrated = _predict(cli, tmp_path, "cal", "--p2p", str(FIX / "p2p_h200x2.json"))
    assert calibrated[1] == plain[1]  # one GPU exchanges nothing
    assert calibrated[2] != plain[2]


def test_p2p_of_the_wrong_kind_is_refused(cli):
    res = cli("predict", "--model", "gpt-small", "--system", str(FIX / "topo_h200x2.json"),
              "--gpus", "1,2", "--p2p", str(FIX / "topo_h200x2.json"))
    assert res.exit_code != 0


def test_p2p_calibration_reaches_a_cluster(tmp_path, cli):
    """--p2p with --nodes: the calibrated links price the cluster's exchange too (it was dropped there)."""
    def across(name, *extra):
        out = tmp_path / f"{name}.json"
        res = cli("predict", "--model", "gpt-small", "--system", str(FIX / "topo_h200x2.json"), "--nodes", "2",
                  "--link", "ndr", "--json", str(out), *extra)
        assert res.exit_code == 0, res.output
        return [r["throughput_samples_per_s"] for r in json.loads(out.read_text())["rows"]]

    assert across("cal", "--p2p", str(FIX / "p2p_h200x2.json")) != across("plain")
