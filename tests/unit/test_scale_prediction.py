"""`meshscale scale` lays meshscale's prediction beside each measured row: the compute profile from the run's
own 1-worker row, the exchange from the predictor on the topology the run used."""
import pytest

from meshscale.errors import MeshscaleError
from meshscale.predict.profile import run_profile
from meshscale.predict.sweep import predicted_beside, scale_beside
from meshscale.results import Result, load_result
from meshscale.topology import load_system, to_dict
from meshscale.topology.discover import cpu_topology

ONE_WORKER_STEP_S = 0.5  # resnet50, batch 64 on one GPU: 128 samples/s


def _scale(topology, mode="ddp", worlds=(1, 2, 4, 8), measured_efficiency=0.9) -> Result:
    rows = [{"world_size": n, "mode": mode, "batch_per_rank": 64, "global_batch": 64 * n,
             "step_time_s": ONE_WORKER_STEP_S, "compute_s": 0.45, "data_s": 0.01,
             "throughput_samples_per_s": 64 / ONE_WORKER_STEP_S * n * (1 if n == 1 else measured_efficiency)}
            for n in worlds]
    return Result("scale", rows, meta={"model": "resnet50", "mode": mode, "scaling": "weak", "batch": 64,
                                       "topology": to_dict(topology) if topology else None})


def test_every_row_gets_a_predicted_throughput_and_its_error_on_a_catalog_system():
    result, note = predicted_beside(_scale(load_system("dgx1-v100")))
    rows = result.rows
    assert all(r["predicted_samples_per_s"] > 0 for r in rows)
    for r in rows:
        assert r["prediction_error"] == pytest.approx(r["predicted_samples_per_s"] / r["throughput_samples_per_s"] - 1)
    # the 1-worker row is the profile: predicted as measured; more GPUs predict more, never beyond linear
    assert rows[0]["prediction_error"] == pytest.approx(0, abs=1e-9)
    predicted = [r["predicted_samples_per_s"] for r in rows]
    assert predicted == sorted(predicted) and predicted[-1] <= 8 * predicted[0] * (1 + 1e-9)
    assert predicted[-1] > 4 * predicted[0]  # NVLink: resnet50's exchange hides well behind compute
    assert "PREDICTED on" in note and "calibrated from this run's 1-worker row" in note and "CPU/Gloo" not in note
    assert result.meta["prediction"]["profile"] == "calibrated from this run's 1-worker row"


def test_the_same_function_serves_predict_from():
    scale = _scale(load_system("dgx1-v100"))
    beside, _ = predicted_beside(scale)
    direct, _ = scale_beside(scale, load_system("dgx1-v100"))
    assert [r["predicted_samples_per_s"] for r in beside.rows] == [r["predicted_samples_per_s"] for r in direct]


def test_cpu_workers_say_the_prediction_is_the_cpu_gloo_model():
    result, note = predicted_beside(_scale(cpu_topology(2), worlds=(1, 2)))
    assert "the CPU/Gloo model" in note and result.rows[1]["predicted_samples_per_s"] > 0


@pytest.mark.parametrize("topology, mode, why", [
    (None, "ddp", "no prediction: the topology of the run's devices could not be told"),
    (load_system("dgx1-v100"), "ps-async", "no prediction: --mode ps-async is not modelled"),
])
def test_no_prediction_is_one_line_saying_why(topology, mode, why):
    scale = _scale(topology, mode=mode)
    result, note = predicted_beside(scale)
    assert note.startswith(why) and "\n" not in note
    assert result is scale and not any("predicted_samples_per_s" in r for r in result.rows)


def test_without_a_1_worker_row_the_smallest_worlds_compute_time_is_the_profile():
    profile = run_profile(_scale(None, worlds=(2, 4)))
    assert profile.batches == [64] and profile.step_time_s == [pytest.approx(0.46)]
    assert "2-worker row" in profile.source
    with pytest.raises(MeshscaleError, match="include 1 in the world sizes"):
        run_profile(Result("scale", [{"world_size": 2, "batch_per_rank": 8, "throughput_samples_per_s": 9.0}]))


def test_torchrun_sweeps_default_to_one_rank_a_node_and_the_world(monkeypatch):
    from meshscale.train.scale import torchrun_worlds
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert torchrun_worlds(None) == [1, 8, 16]
    assert torchrun_worlds([4, 2, 4]) == [2, 4]
    with pytest.raises(MeshscaleError, match="more than torchrun's 16 ranks"):
        torchrun_worlds([1, 32])


def test_the_table_shows_measured_predicted_and_error_side_by_side(cli, monkeypatch):
    from meshscale.train import scale as scale_module
    fabricated = _scale(load_system("dgx1-v100"), worlds=(1, 8))
    monkeypatch.setattr(scale_module, "scale", lambda *args, **kwargs: fabricated)
    run = cli("scale", "--cpus", "1,2", "--weak", "--batch", "64", "--model", "resnet50")
    assert run.exit_code == 0, run.output
    beside, _ = predicted_beside(fabricated)
    eight = next(line for line in run.stdout.splitlines() if line.strip("│ ").startswith("8 "))
    assert f"{beside.rows[1]['predicted_samples_per_s']:,.1f}" in eight
    assert f"{beside.rows[1]['prediction_error']:+.1%}" in eight and f"{fabricated.rows[1]['throughput_samples_per_s']:,.1f}" in eight
    assert "PREDICTED/s" in run.stdout and "calibrated from this run's 1-worker row" in run.stdout


def test_a_run_without_per_step_timing_takes_its_step_time_from_its_throughput():
    # `scale --no-timing` leaves step, compute and comm times empty: the 1-worker row's batch over its throughput
    # is then its step time (a 2-GPU torchrun run on the device machine printed "no prediction" before)
    scale = _scale(load_system("dgx1-v100"), worlds=(1, 2))
    for r in scale.rows:
        r.update(step_time_s=None, compute_s=None, data_s=None)
    profile = run_profile(scale)
    assert profile.step_time_s == pytest.approx([ONE_WORKER_STEP_S])
    result, note = predicted_beside(scale)
    assert result.rows[0]["prediction_error"] == pytest.approx(0, abs=1e-9) and "no prediction" not in note


def test_predict_from_a_two_host_run_uses_whole_nodes_of_the_cluster_and_its_own_profile(cli, tmp_path):
    # `predict --from` a scale run of 1 and 2 one-GPU hosts: the 2-GPU row is two nodes of the cluster (a one-GPU
    # system has no second GPU), and `--profile` takes the run's own 1-worker row
    import json
    from pathlib import Path
    node = Path(__file__).parents[2] / "src/meshscale/predict/corpus/emulated-two-node/node-h200-1gpu.json"
    scale = _scale(load_system(node), worlds=(1, 2))
    scale.save(tmp_path / "scale.json")
    out = tmp_path / "p.json"
    args = ["predict", "--model", "resnet50", "--from", tmp_path / "scale.json", "--profile", tmp_path / "scale.json",
            "-s", node, "--nodes", "1,2", "--nics", "1", "--batch", "64", "--json", out]
    rows = {}
    for link in ("10gbe", "400gbe"):
        done = cli(*args, "--link", link)
        assert done.exit_code == 0, done.stderr
        rows[link] = json.loads(out.read_text())["rows"]
        assert [r["throughput_samples_per_s"] for r in load_result(out).rows] == [r["predicted_samples_per_s"]
                                                                              for r in rows[link]]  # it loads back
    one, two = rows["10gbe"]
    assert one["predicted_samples_per_s"] == pytest.approx(64 / ONE_WORKER_STEP_S)  # the run's own profile
    assert 0 < two["predicted_samples_per_s"] < 2 * one["predicted_samples_per_s"]
    assert rows["400gbe"][1]["predicted_samples_per_s"] > two["predicted_samples_per_s"]  # the network is the cluster's


def test_a_run_over_hosts_joined_by_an_assumed_network_says_how_to_measure_it():
    from pathlib import Path

    from meshscale.topology.multinode import ASSUMED_PORT, HostReport, join_hosts
    from meshscale.topology.nics import Port
    node = load_system(Path(__file__).parents[2] / "src/meshscale/predict/corpus/emulated-two-node/node-h200-1gpu.json")
    assumed = join_hosts([HostReport("node0", node), HostReport("node1", node)])
    known = join_hosts([HostReport(h, node, [Port("mlx5_0/1", "infiniband", "ACTIVE", 400.0)]) for h in ("node0", "node1")])
    assert ASSUMED_PORT.name in assumed.attrs["network_ports"]["node0"]
    _, note = predicted_beside(_scale(assumed, worlds=(1, 2)))
    assert "10 GbE assumed" in note and "measure it (`bench collective" in note and "--bench ar.json" in note
    _, note = predicted_beside(_scale(known, worlds=(1, 2)))
    assert "PREDICTED on" in note and "a guess" not in note


def test_cpu_workers_take_their_measured_step_at_any_batch():
    """A device without a datasheet has no roofline: its measured step is the compute at every batch, also one
    the profile did not measure (the line through its points), never the kernels."""
    from meshscale.predict.profile import ComputeProfile
    from meshscale.predict.question import PredictRequest
    from meshscale.predict.request import prepare, where_on

    topo = cpu_topology(2)
    profile = ComputeProfile([8, 16], [0.1, 0.18])
    prepared = prepare(PredictRequest(model="resnet50", system=topo.name, profile=profile), where=where_on(topo))
    for batch in (8, 64):
        p = prepared.at(prepared.allocation(gpus=2), batch)
        assert p.compute_s == pytest.approx(profile.step_time(batch)) and p.samples_per_s > 0
