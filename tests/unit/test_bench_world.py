"""Choosing ranks and backend (bench, train, scale), mapping CUDA devices to topology indices, timing on CPU."""
import time

import pytest
import torch

from meshscale.bench.harness import time_op
from meshscale.execute.world_topology import visible_indices, world_topology
from meshscale.errors import MeshscaleError
from meshscale.execute.world import World, resolve_sweep, resolve_world


def _no_torchrun(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")
def test_resolve_world_on_a_cpu_machine(monkeypatch):
    _no_torchrun(monkeypatch)
    default = resolve_world(None, None)
    assert default.backend == "gloo" and default.size == 2 and "no GPU" in default.notice
    assert resolve_world(None, 3).size == 3 and resolve_world(None, 3).notice == ""
    with pytest.raises(MeshscaleError, match="--gpus 8: this machine has 0 GPUs; use --cpus"):
        resolve_world(8, None)
    with pytest.raises(MeshscaleError, match="not both"):
        resolve_world(1, 1)
    with pytest.raises(MeshscaleError, match="at least 1"):
        resolve_world(None, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")
def test_train_default_and_scale_sweeps(monkeypatch):
    _no_torchrun(monkeypatch)
    one = World(1, "gloo")
    assert resolve_world(None, None, default=one) is one
    assert resolve_world(None, 3, default=one) == World(3, "gloo") and one.device == "cpu"
    assert resolve_sweep(None, [4, 1, 2, 2]) == [World(1, "gloo"), World(2, "gloo"), World(4, "gloo")]
    assert resolve_sweep(None, None) == [World(1, "gloo")]
    with pytest.raises(MeshscaleError, match="not both"):
        resolve_sweep([1], [1])
    with pytest.raises(MeshscaleError, match="--cpus 0: need at least 1"):
        resolve_sweep(None, [1, 0])
    with pytest.raises(MeshscaleError, match="--gpus 2: this machine has 0 GPUs"):
        resolve_sweep([1, 2], None)


def test_under_torchrun_the_launcher_decides(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("MASTER_ADDR", "node0")
    monkeypatch.setenv("MASTER_PORT", "29500")
    world = resolve_world(None, 2)
    assert world.size == 16 and world.backend == "gloo"


@pytest.mark.parametrize("local_ranks, gpus, cpus, outcome", [
    (2, 1, None, "error"),   # more ranks on this node than GPUs: refused before any rank touches a device
    (2, 1, 2, "gloo"),       # --cpus: CPU workers whatever the GPUs
    (2, 2, None, "nccl"),
    (2, 0, None, "gloo"),    # no GPU: CPU workers
])
def test_under_torchrun_ranks_per_node_must_fit_the_gpus(monkeypatch, local_ranks, gpus, cpus, outcome):
    import meshscale.execute.world as world_module
    for key, value in (("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", str(local_ranks)),
                       ("MASTER_ADDR", "node0"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(world_module, "gpu_count", lambda: gpus)
    if outcome == "error":
        with pytest.raises(MeshscaleError, match=f"started {local_ranks} ranks on this node, which has {gpus} GPU"):
            resolve_world(None, cpus)
    else:
        assert resolve_world(None, cpus).backend == outcome


def test_cpu_world_topology_has_one_worker_per_rank(monkeypatch):
    _no_torchrun(monkeypatch)
    topo = world_topology(resolve_world(None, 3))
    assert topo is not None and len(topo.devices()) == 3 and topo.device_kind == "worker"


def test_visible_devices_map_to_topology_indices():
    assert visible_indices("2,3", [0, 1, 2, 3]) == [2, 3]
    assert visible_indices(None, [0, 1]) == [0, 1]
    assert visible_indices("GPU-8f2c,GPU-77aa", [0, 1]) == [0, 1]  # UUIDs: not mapped
    assert visible_indices("7", [0, 1]) == [0, 1]  # not a device of this topology


def test_cpu_time_op_is_per_iteration_and_after_warmup():
    calls, barriers = [], []
    per_op = time_op(lambda: (calls.append(1), time.sleep(0.01)), torch.device("cpu"), lambda: barriers.append(1), 2, 3)
    assert len(calls) == 5 and barriers == [1]
    assert 0.01 <= per_op < 0.5


def test_cpu_time_op_times_each_call_and_a_stall_shows_in_the_slowest():
    seconds = iter([0.01, 0.01, 0.01, 0.12, 0.01])  # two warm-up calls, then three timed: the second stalls
    each = []
    per_op = time_op(lambda: time.sleep(next(seconds)), torch.device("cpu"), lambda: None, 2, 3, iter_seconds=each)
    assert len(each) == 3
    assert max(each) >= 0.12 and sorted(each)[1] < 0.06  # the median is a normal call
    assert per_op == pytest.approx(sum(each) / 3, rel=1e-9)  # the mean is still nccl-tests' figure


def test_ranks_beyond_the_visible_gpus_have_no_local_topology(monkeypatch):
    """Two torchrun agents on one host, one GPU each (CUDA_VISIBLE_DEVICES=0 and 1): NVML still sees both GPUs,
    but this process's two ranks are not both here, so there is no local topology to bound them with."""
    from types import SimpleNamespace

    from meshscale.execute import world_topology as wt
    from meshscale.topology import load_system
    two = load_system("hgx-h200")
    two = wt.subset(two, [0, 1])
    monkeypatch.setattr(wt, "discover", lambda workers=None: SimpleNamespace(topology=two))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert wt.world_topology(World(2, "nccl")) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert len(wt.world_topology(World(2, "nccl")).devices()) == 2


def test_closing_lines_say_when_the_bound_rests_on_an_assumed_network():
    from meshscale.bench.tables import closing_lines
    from meshscale.results import measured
    row = {"busbw_bytes_per_s": 9.3e9, "wrong": 0}
    title = "2 hosts (node0, node1): 1x NVIDIA H200 each, joined by 10 GbE assumed (no port with a known rate)"
    assumed = measured("bench-collective", [row], topology={"title": title, "attrs": {
        "network_ports": {"node0": ["assumed"], "node1": ["assumed"]}}})
    known = measured("bench-collective", [row], topology={"title": "2 hosts", "attrs": {
        "network_ports": {"node0": ["mlx5_0"], "node1": ["mlx5_0"]}}})
    note = [line for line in closing_lines(assumed) if "assumed" in line]
    assert len(note) == 1 and "faster than assumed" in note[0]
    assert not any("assumed" in line for line in closing_lines(known))


def test_the_median_cycle_is_reported_and_a_single_cycle_is_left_alone():
    from meshscale.collectives.rows import median_over_cycles

    def row(cycle, time_s, wrong=0):
        return {"collective": "all_reduce", "size_bytes": 4 << 20, "inplace": True, "time_s": time_s,
                "rank_times_s": [time_s * 0.99, time_s * 1.01], "wrong": wrong, "cycle": cycle,
                "algbw_bytes_per_s": 0.0, "busbw_bytes_per_s": 0.0}
    slow_phase = [row(0, 450e-6), row(1, 860e-6, wrong=1), row(2, 440e-6)]  # the second cycle met a slow phase
    (one,) = median_over_cycles(slow_phase, 2)
    assert one["time_s"] == 450e-6 and one["cycle_times_s"] == [450e-6, 860e-6, 440e-6]
    assert one["busbw_bytes_per_s"] == pytest.approx((4 << 20) / 450e-6)  # 2 ranks: busbw = algbw
    assert one["rank_times_s"] == pytest.approx([450e-6 * 0.99, 450e-6 * 1.01]) and one["wrong"] == 1
    (alone,) = median_over_cycles(slow_phase[:1], 2)
    assert alone["time_s"] == 450e-6 and "cycle_times_s" not in alone and "cycle" not in alone
