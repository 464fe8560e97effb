"""One resolution of the common options (`resolve_fabric`): sim, plan, place and predict each resolve the fabric
once, and the same options resolve to the same cluster, calibration and NCCL settings in every command."""
import pytest

from meshscale.errors import MeshscaleError
from meshscale.simulate import fabric as scenario
from meshscale.simulate.fabric import resolve_fabric
from meshscale.simulate.nccl_env import NcclSettings, nccl_settings

CLUSTER_FILE = "cluster:\n  node: dgx1-v100\n  nodes: 2\n  link: {link}\n  nics: 4\n"


@pytest.fixture
def resolved(monkeypatch):
    """The fabrics resolved while a command runs (the real function, watched)."""
    calls = []

    def watched(*args, **kwargs):
        calls.append(real(*args, **kwargs))
        return calls[-1]

    real = scenario.resolve_fabric
    monkeypatch.setattr(scenario, "resolve_fabric", watched)
    return calls


def test_sim_plan_place_and_predict_resolve_a_cluster_file_the_same_way(cli, tmp_path, resolved):
    edr, hdr = tmp_path / "edr.yaml", tmp_path / "hdr.yaml"
    edr.write_text(CLUSTER_FILE.format(link="edr"))
    hdr.write_text(CLUSTER_FILE.format(link="hdr"))
    env = ("--nccl-env", "NCCL_MAX_NCHANNELS=2")
    commands = [("sim", "all_reduce", "-s", edr, "--link", "hdr", "-b", "1M", "-e", "1M", *env),
                ("plan", "all_reduce", "-s", edr, "--link", "hdr", "--bytes", "1M", *env),
                ("predict", "--model", "resnet50", "-s", edr, "--link", "hdr", *env),
                ("place", "--gpus", "2", "-s", hdr, *env)]  # place has no --link: the file says it
    for args in commands:
        before = len(resolved)
        r = cli(*args)
        assert r.exit_code == 0, (args[0], r.output)
        assert len(resolved) == before + 1, f"{args[0]} resolved the fabric {len(resolved) - before} times"
    first = resolved[0]
    assert first.cluster is not None and first.cluster.link == "hdr"  # the option overrides the file
    for other in resolved[1:]:
        assert other.cluster == first.cluster
        assert other.nccl == first.nccl
        assert other.params is None  # nothing measured: the model's defaults everywhere
    assert first.nccl.env.max_channels == 2


def test_a_measured_multi_node_all_reduce_fits_the_same_network_for_sim_and_predict(cli, tmp_path, resolved):
    from meshscale.results import Result
    sizes = [1 << 20, 16 << 20, 64 << 20, 256 << 20]
    path = tmp_path / "inter.json"
    Result("bench-collective", [{"collective": "all_reduce", "size_bytes": s, "time_s": 500e-6 + s / 8e9,
                                 "busbw_bytes_per_s": s / (500e-6 + s / 8e9) * 30 / 16} for s in sizes],
           meta={"world_size": 16}).save(path)
    for args in (("sim", "all_reduce", "-s", "dgx1-v100", "--nodes", "2", "--bench", path, "-b", "1M", "-e", "1M"),
                 ("predict", "--model", "resnet50", "-s", "dgx1-v100", "--nodes", "2,4", "--bench", path)):
        assert cli(*args).exit_code == 0
    sim, predict = resolved
    assert sim.network_fit is not None and sim.network_fit == predict.network_fit
    assert sim.params == predict.params and sim.notices == predict.notices


def test_resolution_without_a_system_or_with_bad_settings_is_one_error():
    with pytest.raises(MeshscaleError, match="--nodes"):
        resolve_fabric(None, {"nodes": 2})
    with pytest.raises(MeshscaleError, match="NCCL_MAX_NCHANNELS"):
        nccl_settings(nccl_env=["NCCL_NOT_A_KEY=1"])
    assert nccl_settings() == NcclSettings() and not nccl_settings().given()  # the model's defaults, nothing forced


def test_a_topology_in_hand_resolves_as_its_name_does():
    """The tour hands over the machine it discovered; calibrated from the same bench p2p, it is priced alike."""
    from pathlib import Path

    from meshscale.topology import load_system
    p2p = Path(__file__).resolve().parents[1] / "fixtures" / "p2p_h200x2.json"
    named = resolve_fabric("hgx-h200", p2p=p2p)
    in_hand = resolve_fabric(load_system("hgx-h200"), p2p=p2p, nccl=NcclSettings(nvls=False))
    assert named.params is not None and in_hand.params == named.params
    assert in_hand.cluster is None and in_hand.nccl.given() == {"nvls": False}
    with pytest.raises(MeshscaleError, match="cluster"):
        resolve_fabric(load_system("hgx-h200"), {"nodes": 2})
