"""Performance model: profile interpolation, buckets and overlap, exchange algorithms, scaling rows, CLI errors."""
import json

import pytest

from meshscale.errors import MeshscaleError
from meshscale.predict import PredictRequest, predict_rows
from meshscale.predict.frameworks import FRAMEWORKS, buckets, resolve_framework
from meshscale.predict.gradient_tensors import GradientTensor, resnet50_gradients, resnet50_tensors
from meshscale.predict.profile import ComputeProfile, linear_profile, p100_resnet50_profile, profile_from_result
from meshscale.predict.sweep import per_rank_batch
from meshscale.predict.training.comm import Allocation
from meshscale.predict.training.replicas import GradientExchange, exposed_exchange_s, parameter_server_s
from meshscale.results import Result

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


def _rows(**kw) -> list[dict]:
    """A sweep of resnet50 on dgx1-p100 timed by PROFILE (a measured step: the exchange is what differs)."""
    rows, _, _ = predict_rows(PredictRequest(**{"model": "resnet50", "system": "dgx1-p100", "profile": PROFILE,
                                                "batch": 64, "gpus": (8,), **kw}))
    return rows


def test_modes_as_train_names_them():
    rate = {}
    for mode, framework in (("ddp", None), ("allreduce", None), (None, "cntk-2016"), ("ps-sync", None)):
        rows = _rows(mode=mode, framework=framework)
        rate[framework or mode] = rows[0]["throughput_samples_per_s"]
    assert rate["cntk-2016"] < rate["ddp"]  # no overlap: the whole exchange is exposed
    assert rate["ps-sync"] < rate["cntk-2016"]  # one server's links carry every gradient


def test_nvlink_faster_than_pcie_and_ps_slowest():
    nv = _rows()[0]["comm_s"]
    pcie = _rows(system="pcie-8gpu-2socket")[0]["comm_s"]
    ps = parameter_server_s(4 * 25_557_032, 8, Allocation.of("dgx1-p100", 8))
    assert nv < pcie and nv < ps


def test_cluster_exchange_ring_slower_than_nccls_pick_and_ib_beats_ethernet():
    t = {(link, algo): _rows(nodes=(64,), gpus=None, link=link, nics=4 if link == "edr" else 2,
                             nccl_algo=algo)[0]["comm_s"] for link in ("edr", "10gbe") for algo in (None, "ring")}
    assert t[("edr", None)] <= t[("edr", "ring")]
    assert t[("edr", "ring")] < t[("10gbe", "ring")]


def test_scaling_rows_weak_and_strong():
    rows = _rows(gpus=(1, 2, 4, 8))
    assert [r["world_size"] for r in rows] == [1, 2, 4, 8]
    assert rows[0]["speedup"] == pytest.approx(1.0)
    assert all(a["throughput_samples_per_s"] < b["throughput_samples_per_s"] for a, b in zip(rows, rows[1:]))
    strong = _rows(gpus=(1, 8), global_batch=64)
    assert strong[1]["batch_per_rank"] == 8 and strong[1]["efficiency"] < rows[-1]["efficiency"]


def test_profile_rescaled_to_another_gpu():
    # P100 PCIe: 9.3 vs 10.6 TFLOP/s at the boost clocks; PROFILE states no base-clock rate
    one = lambda system: _rows(system=system, gpus=(1,))[0]["compute_s"]  # noqa: E731
    assert one("pcie-8gpu-2socket") == pytest.approx(one("dgx1-p100") * 10.6 / 9.3)


def test_cluster_prediction_ethernet_scales_worse():
    ib = _rows(gpus=None, nodes=(1, 16), link="edr", nics=4, batch=32)
    eth = _rows(gpus=None, nodes=(1, 16), link="10gbe", nics=2, batch=32)
    assert eth[-1]["efficiency"] < ib[-1]["efficiency"]


def test_documented_profile_for_resnet50_on_p100():
    profile = p100_resnet50_profile()
    assert 64 / profile.step_time(64) == pytest.approx(200.0)  # the whitepaper's one-GPU bar
    assert profile.step_time(8) / 8 > 1.5 * profile.step_time(64) / 64  # small batches are slower per image
    # at the base clocks, the rate each holds under its power cap: 1328 MHz (SXM2) vs 1126 MHz (PCIe)
    one = lambda system: _rows(system=system, gpus=(1,), profile=None)[0]["compute_s"]  # noqa: E731
    assert one("dgx1-p100") == pytest.approx(0.32)
    assert one("pcie-8gpu-2socket") == pytest.approx(0.32 * 1328 / 1126)


def test_exchange_passes_the_framework_nccl_version(monkeypatch):
    import meshscale.predict.training.comm as comm
    seen = []
    real = comm.Allocation.at

    def spy(self, nodes, nccl_version=None):
        found = real(self, nodes, nccl_version)
        seen.append(found.nccl.version)
        return found

    monkeypatch.setattr(comm.Allocation, "at", spy)
    _rows(framework="cntk-2016", gpus=(2,))
    assert seen and set(seen) == {"1.6"}
    _rows(gpus=(2,), batch=63)
    assert seen[-1] is None


@pytest.mark.parametrize("bad", [
    lambda: per_rank_batch(3, 64, weak=False),
    lambda: _rows(gpus=(9,)),
    lambda: _rows(model="no-such-model"),
    lambda: _rows(mode="ps-async"),
    lambda: _rows(mode="sync"),
    lambda: GradientExchange(wire="int8"),
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
    bad = cli_process("predict", "--model", "resnet50", "--gpus", "12")  # not whole nodes of 8
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
    assert _rates(cli, tmp_path, "--mode", "ddp", "--framework", "ddp") == ddp  # the defaults
    cntk = _rates(cli, tmp_path, "--framework", "cntk-2016")
    assert cntk[-1][2] < ddp[-1][2]
    assert _rates(cli, tmp_path, "--framework", "cntk-2016", "--wire", "bf16")[-1][2] > cntk[-1][2]  # half the bytes
    assert _rates(cli, tmp_path, "--mode", "ps-sync")[-1][2] < ddp[-1][2]
    strong = _rates(cli, tmp_path, "--global-batch", "64")
    assert strong[-1][2] < ddp[-1][2]
    compared = _rates(cli, tmp_path, "--compare", "algorithms")
    assert [v for v, n, _ in compared if n == 8] == ["nccl", "ring", "tree", "ps-sync"]
    assert [v for v, n, _ in _rates(cli, tmp_path, "--compare", "modes") if n == 8] == ["ddp", "allreduce", "ps-sync"]
    assert [v for v, n, _ in _rates(cli, tmp_path, "--compare", "frameworks") if n == 8] == ["ddp", "horovod", "cntk-2016"]
    assert [v for v, n, _ in _rates(cli, tmp_path, "--compare", "nvlink-pcie") if n == 8] == ["dgx1-p100", "pcie-8gpu-2socket"]


@pytest.mark.parametrize("args, message", [
    (["--mode", "ps-async"], "ps-async is not modelled"),
    (["--mode", "gossip"], "unknown mode 'gossip'"),
    (["--mode", "ps-sync", "--compare", "algorithms"], "use --mode ddp or allreduce"),
    (["--framework", "caffe"], "unknown framework 'caffe'; use one of eager, compile, megatron, zero1, zero2, zero3, ddp, horovod, cntk-2016"),
    (["--mode", "ddp", "--framework", "horovod"], "give --framework alone"),
    (["--mode", "ps-sync", "--framework", "ddp"], "parameter server"),
    (["--wire", "int4"], "unknown wire precision"),
    (["--dp", "8"], "one layout on one count"),
    (["--top", "3"], "--top is for --search"),
])
def test_cli_predict_bad_exchange_is_one_line(cli, args, message):
    bad = cli("predict", "--model", "resnet50", "--gpus", "1,8", *args)
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and message in bad.stderr, bad.stderr
