"""Performance model: profile interpolation, buckets and overlap, exchange algorithms, scaling rows, CLI errors."""
import json

import pytest

from meshscale.errors import MeshscaleError
from meshscale.predict.exchange_cost import Exchange, cluster_topology
from meshscale.predict.frameworks import FRAMEWORKS, buckets, resolve_framework
from meshscale.predict.gradient_tensors import GradientTensor, resnet50_gradients, resnet50_tensors
from meshscale.predict.profile import ComputeProfile, linear_profile, profile_from_result
from meshscale.predict.scaling import Job, predict_cluster, predict_system, profile_for
from meshscale.predict.step_time import exposed_exchange_s, per_rank_batch
from meshscale.results import Result
from meshscale.simulate.alpha_beta import AlphaBetaCostModel
from meshscale.topology import load_system
from meshscale.topology.cluster import ClusterSpec

PROFILE = linear_profile(0.004, 0.02, gpu_flops=10.6e12)


def test_profile_interpolates_and_keeps_fixed_cost():
    p = ComputeProfile([8, 64], [0.05, 0.3])
    assert p.step_time(36) == pytest.approx(0.175)
    assert p.step_time(4) == pytest.approx(0.05 - 4 * 0.25 / 56)  # the line, not proportional time
    assert 4 / p.step_time(4) < 64 / p.step_time(64)  # small batches are less efficient


def test_profile_from_train_result():
    rows = [{"batch_per_rank": 8, "step_time_s": 0.05}, {"batch_per_rank": 8, "step_time_s": 0.07},
            {"batch_per_rank": 32, "step_time_s": 0.2}]
    p = profile_from_result(Result("train", rows, meta={"profile": True, "model": "resnet50"}))
    assert p.batches == [8, 32] and p.step_time(8) == pytest.approx(0.06)
    with pytest.raises(MeshscaleError, match="profile"):
        profile_from_result(Result("scale", rows))


def test_buckets_cover_gradients():
    sizes = buckets(100 << 20, 1 << 20, 25 << 20)
    assert sizes[0] == 1 << 20 and sum(sizes) == 100 << 20 and max(sizes) == 25 << 20


def test_overlap_hides_all_but_the_tail():
    ready = [0.25, 0.5, 0.75, 1.0]
    times = [0.01] * 4
    hidden = exposed_exchange_s(times, ready, backward_s=0.2, compute_s=0.3)
    assert hidden == pytest.approx(0.01)  # only the last bucket sticks out
    assert exposed_exchange_s(times, [1.0] * 4, 0.2, 0.3) == pytest.approx(0.04)  # no overlap: all after backward
    slow = exposed_exchange_s([0.1] * 4, ready, 0.2, 0.3)
    assert 0.1 < slow < 0.4


def test_each_framework_exchanges_its_own_calls():
    tensors = resnet50_tensors()
    assert len(tensors) == 161 and sum(tensors) == 25_557_032
    assert [t.elements for t in resnet50_gradients()] == tensors
    gradient = 4 * sum(tensors)
    sizes = lambda name, grads, wire=None: [b.nbytes for b in FRAMEWORKS[name].exchange(grads, wire)]  # noqa: E731
    unknown = [GradientTensor(n) for n in tensors]  # readiness unknown: buckets cut at the byte
    assert sizes("ddp", unknown) == buckets(gradient, 1 << 20, 25 << 20)
    ddp = sizes("ddp", resnet50_gradients())  # whole tensors: the first bucket closes past 1 MiB
    assert sum(ddp) == gradient and ddp[0] >= 1 << 20 and len(ddp) == 5
    assert sizes("horovod", resnet50_gradients()) == [64 << 20, gradient - (64 << 20)]
    assert sum(sizes("ddp", resnet50_gradients(), "bf16")) == gradient / 2
    cntk = sizes("cntk-2016", resnet50_gradients())
    # one all-reduce per matrix over 32 KiB (53 of them), and one for the 108 small ones packed together
    assert len(cntk) == 54 and sum(cntk) == gradient and cntk[-1] == 4 * sum(t for t in tensors if 4 * t <= 32 << 10)
    assert not FRAMEWORKS["cntk-2016"].overlap and FRAMEWORKS["cntk-2016"].nccl_version == "1.6"
    assert all(f.source for f in FRAMEWORKS.values())


def test_mode_and_framework_resolve_to_one_exchange():
    assert resolve_framework(None, None) == ("ddp", FRAMEWORKS["ddp"])
    assert resolve_framework("allreduce", None) == ("allreduce", FRAMEWORKS["horovod"])
    assert resolve_framework("allreduce", "horovod") == ("allreduce", FRAMEWORKS["horovod"])
    assert resolve_framework(None, "cntk-2016")[1] is FRAMEWORKS["cntk-2016"]
    assert resolve_framework("ps-sync", None) == ("ps-sync", None)


def test_modes_as_train_names_them():
    topo = load_system("dgx1-p100")
    rate = {}
    for mode, framework in (("ddp", None), ("allreduce", None), ("allreduce", FRAMEWORKS["cntk-2016"]), ("ps-sync", None)):
        rows = predict_system(Job("resnet50", 25_557_032, PROFILE, 64, mode=mode, framework=framework), topo, [8])
        rate[framework.name if framework else mode] = rows[0]["throughput_samples_per_s"]
        assert rows[0]["exchange_mode"] == mode
    assert rate["cntk-2016"] < rate["ddp"]  # no overlap: the whole exchange is exposed
    assert rate["ps-sync"] < rate["cntk-2016"]  # one server's links carry every gradient
    assert rows[0]["algorithm"] == "ps" and rows[0]["framework"] == "parameter server"


def test_nvlink_faster_than_pcie_and_ps_slowest():
    nbytes = 100e6
    alpha_beta = AlphaBetaCostModel()
    nv = Exchange(load_system("dgx1-p100"), 8, intra=alpha_beta).allreduce_s(nbytes)
    pcie = Exchange(load_system("pcie-8gpu-2socket"), 8, intra=alpha_beta).allreduce_s(nbytes)
    ps = Exchange(load_system("dgx1-p100"), 8, "ps").allreduce_s(nbytes)
    assert nv < pcie and nv < ps


def test_cluster_exchange_hierarchical_beats_flat_ring_and_ib_beats_ethernet():
    ib = cluster_topology(ClusterSpec("dgx1-p100", 1, 4, "edr"), 64)
    eth = cluster_topology(ClusterSpec("dgx1-p100", 1, 2, "10gbe"), 64)
    t = {(name, alg): Exchange(f, None, alg, intra=AlphaBetaCostModel()).allreduce_s(25e6)
         for name, f in (("ib", ib), ("eth", eth)) for alg in ("ring", "hierarchical")}
    assert t[("ib", "hierarchical")] < t[("ib", "ring")]
    assert t[("ib", "ring")] < t[("eth", "ring")]


def test_scaling_rows_weak_and_strong():
    topo = load_system("dgx1-p100")
    job = Job("resnet50", 25_557_032, PROFILE, 64, weak=True)
    rows = predict_system(job, topo, [1, 2, 4, 8])
    assert [r["world_size"] for r in rows] == [1, 2, 4, 8]
    assert rows[0]["speedup"] == pytest.approx(1.0)
    assert all(a["throughput_samples_per_s"] < b["throughput_samples_per_s"] for a, b in zip(rows, rows[1:]))
    strong = predict_system(Job("resnet50", 25_557_032, PROFILE, 64, weak=False), topo, [1, 8])
    assert strong[1]["batch_per_rank"] == 8 and strong[1]["efficiency"] < rows[-1]["efficiency"]


def test_profile_rescaled_to_another_gpu():
    pcie = load_system("pcie-8gpu-2socket")  # P100 PCIe: 9.3 vs 10.6 TFLOP/s
    assert profile_for(pcie, PROFILE, None).step_time(64) == pytest.approx(PROFILE.step_time(64) * 10.6 / 9.3)


def test_cluster_prediction_ethernet_scales_worse():
    job = Job("resnet50", 25_557_032, PROFILE, 32)
    ib = predict_cluster(job, ClusterSpec("dgx1-p100", 1, 4, "edr"), [1, 16])
    eth = predict_cluster(job, ClusterSpec("dgx1-p100", 1, 2, "10gbe"), [1, 16])
    assert eth[-1]["efficiency"] < ib[-1]["efficiency"]


def test_documented_profile_for_resnet50_on_p100():
    sxm2, pcie = load_system("dgx1-p100"), load_system("pcie-8gpu-2socket")
    profile = profile_for(sxm2, None, 1.0, model="resnet50")
    assert 64 / profile.step_time(64) == pytest.approx(200.0)  # the whitepaper's one-GPU bar
    assert profile.step_time(8) / 8 > 1.5 * profile.step_time(64) / 64  # small batches are slower per image
    # at the base clocks, the rate each holds under its power cap: 1328 MHz (SXM2) vs 1126 MHz (PCIe)
    assert profile_for(pcie, None, 1.0, model="resnet50").step_time(64) == pytest.approx(0.32 * 1328 / 1126)
    assert "FLOPs" in profile_for(sxm2, None, 1e9, model="gpt-small").source


def test_exchange_passes_the_framework_nccl_version(monkeypatch):
    import meshscale.simulate.auto as auto
    seen = []
    real = auto.nccl_result

    def spy(*args, **kwargs):
        seen.append(kwargs.get("nccl_version"))
        return real(*args, **kwargs)

    monkeypatch.setattr(auto, "nccl_result", spy)
    job = Job("resnet50", 25_557_032, PROFILE, 64, framework=FRAMEWORKS["cntk-2016"], mode="allreduce")
    job.step(job.exchange(load_system("dgx1-p100"), 2), 64)
    assert seen and set(seen) == {"1.6"}
    job = Job("resnet50", 25_557_032, PROFILE, 64)
    job.exchange(load_system("dgx1-p100"), 2).allreduce_s(1 << 20)
    assert seen[-1] is None


@pytest.mark.parametrize("bad", [
    lambda: per_rank_batch(3, 64, weak=False),
    lambda: Exchange(load_system("dgx1-p100"), 9),
    lambda: profile_for(load_system("dgx1-p100"), None, None),
    lambda: Exchange(load_system("dgx1-p100"), 2, "butterfly"),
    lambda: Job("resnet50", 25_557_032, PROFILE, 64, mode="ps-async"),
    lambda: Job("resnet50", 25_557_032, PROFILE, 64, mode="sync"),
    lambda: Job("resnet50", 25_557_032, PROFILE, 64, algorithm="ps"),
    lambda: Job("resnet50", 25_557_032, PROFILE, 64, wire="int8"),
    lambda: resolve_framework(None, "tensorflow"),
    lambda: resolve_framework("ddp", "cntk-2016"),
    lambda: resolve_framework("ps-sync", "ddp"),
])
def test_bad_input_is_one_line(bad):
    with pytest.raises(MeshscaleError) as info:
        bad()
    assert "\n" not in str(info.value)


def test_cli_predict_json_and_errors(tmp_path, cli_process):
    out = tmp_path / "p.json"
    done = cli_process("predict", "--model", "resnet50", "--gpus", "1,8", "--json", str(out))
    assert done.returncode == 0 and "PREDICTED" in done.stdout
    data = json.loads(out.read_text())
    assert data["kind"] == "predict" and data["predicted"] is True and len(data["rows"]) == 2
    bad = cli_process("predict", "--model", "resnet50", "--gpus", "16")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "error" in bad.stderr
    scale = Result("scale", [{"world_size": 2, "mode": "weak", "batch_per_rank": 64,
                              "throughput_samples_per_s": 300.0}], meta={"model": "resnet50"})
    scale.save(tmp_path / "s.json")
    done = cli_process("predict", "--from", str(tmp_path / "s.json"), "--system", "dgx1-p100")
    assert done.returncode == 0 and "%" in done.stdout
    bad = cli_process("cluster", "--nodes", "129", "--levels", "2")
    assert bad.returncode == 2 and "--levels 3" in bad.stderr


def _rates(cli, tmp_path, *args):
    out = tmp_path / "p.json"
    done = cli("predict", "--model", "resnet50", "--gpus", "1,8", "--json", str(out), *args)
    assert done.exit_code == 0, done.stderr
    return [(r["variant"], r["world_size"], r["throughput_samples_per_s"]) for r in json.loads(out.read_text())["rows"]]


def test_cli_predict_modes_algo_overlap_and_global_batch(cli, tmp_path):
    ddp = _rates(cli, tmp_path)
    assert _rates(cli, tmp_path, "--mode", "ddp", "--algo", "ring", "--framework", "ddp") == ddp  # the defaults
    cntk = _rates(cli, tmp_path, "--framework", "cntk-2016")
    assert cntk[-1][2] < ddp[-1][2]
    assert _rates(cli, tmp_path, "--framework", "cntk-2016", "--wire", "bf16")[-1][2] > cntk[-1][2]  # half the bytes
    assert _rates(cli, tmp_path, "--mode", "ps-sync")[-1][2] < ddp[-1][2]
    strong = _rates(cli, tmp_path, "--strong", "--global-batch", "64")
    assert strong[-1][2] < ddp[-1][2]
    compared = _rates(cli, tmp_path, "--compare", "algorithms")
    assert [v for v, n, _ in compared if n == 8] == ["nccl", "ring", "hierarchical", "ps-sync"]
    assert [v for v, n, _ in _rates(cli, tmp_path, "--compare", "modes") if n == 8] == ["ddp", "allreduce", "ps-sync"]
    assert [v for v, n, _ in _rates(cli, tmp_path, "--compare", "frameworks") if n == 8] == ["ddp", "horovod", "cntk-2016"]
    assert [v for v, n, _ in _rates(cli, tmp_path, "--compare", "nvlink-pcie") if n == 8] == ["dgx1-p100", "pcie-8gpu-2socket"]


@pytest.mark.parametrize("args, message", [
    (["--mode", "ps-async"], "ps-async is not modelled"),
    (["--mode", "gossip"], "unknown mode 'gossip'"),
    (["--algo", "ps"], "--mode ps-sync"),
    (["--algo", "butterfly"], "unknown all-reduce algorithm"),
    (["--strong"], "--strong needs --global-batch"),
    (["--global-batch", "64"], "--global-batch is for --strong"),
    (["--mode", "ps-sync", "--compare", "algorithms"], "use --mode ddp or allreduce"),
    (["--framework", "caffe"], "unknown framework 'caffe'; use one of ddp, horovod, cntk-2016"),
    (["--mode", "ddp", "--framework", "horovod"], "give --framework alone"),
    (["--mode", "ps-sync", "--framework", "ddp"], "parameter server"),
    (["--wire", "int4"], "unknown wire precision"),
])
def test_cli_predict_bad_exchange_is_one_line(cli, args, message):
    bad = cli("predict", "--model", "resnet50", "--gpus", "1,8", *args)
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and message in bad.stderr, bad.stderr
