"""Partitioned GPUs: MIG instances and time-sliced vGPUs derived from the whole GPU's model. Slices never add up to
more than the GPU they split, bigger slices are never slower, and slices talk only through host memory."""
from __future__ import annotations

import pytest
import yaml

from meshscale.errors import MeshscaleError
from meshscale.predict import PredictRequest, predict_rows
from meshscale.topology import load_system
from meshscale.topology.nvml_discovery import GPU_MODELS_FILE
from meshscale.topology.partitions import (COMPUTE_SLICES, MEMORY_SLICES, mig_profiles, partitioned, split_system,
                                           system_partition)

SPLITS = [("dgx-a100-320gb", "1g.5gb", 7), ("hgx-h100", "1g.10gb", 7), ("hgx-h200", "1g.18gb", 7), ("dgx-a100-320gb", "2g.10gb", 3),
          ("dgx-a100", "3g.40gb", 2), ("dgx-a100", "1g.10gb", 7), ("hgx-h100", "1/4", 4), ("dgx1-p100", "1/2", 2), ("dgx-a100", "1/7", 7)]


# a batch at which the whole GPU's step is its kernels, not its host's pace of issuing them (seven slices are seven
# processes, each with a host of its own: a host-bound whole GPU would lose to them for a reason that is not the GPU)
def _rate(system: str, gpus: int, partition: str | None = None, batch: int = 256) -> float:
    rows, _, _ = predict_rows(PredictRequest(model="resnet50", system=system, gpus=(gpus,), batch=batch,
                                             partition=partition))
    return rows[0]["throughput_samples_per_s"]


@pytest.mark.parametrize("system, partition, slices", SPLITS)
def test_all_slices_of_one_gpu_predict_no_more_than_the_whole_gpu(system, partition, slices):
    assert _rate(system, slices, partition) <= _rate(system, 1) * (1 + 1e-9)


@pytest.mark.parametrize("system", ["dgx-a100", "hgx-h100", "hgx-h200"])
def test_a_bigger_instance_is_never_slower(system):
    gpu = load_system(system).nodes[load_system(system).gpus()[0]].attrs["model"]
    profiles = sorted(mig_profiles(gpu), key=lambda p: (p.sm_slices, p.sms or 0))
    rates = [_rate(system, 1, p.name) for p in profiles]
    assert rates == sorted(rates) and rates[-1] <= _rate(system, 1) * (1 + 1e-9)


def test_every_profile_set_fits_its_gpu():
    table = yaml.safe_load(GPU_MODELS_FILE.read_text())
    used = {row["mig"] for row in table["models"] if "mig" in row}
    assert used == set(table["mig_profiles"])
    for row in table["models"]:
        for p in table["mig_profiles"].get(row.get("mig"), {"profiles": []})["profiles"]:
            assert p["instances"] * p["sm_slices"] <= COMPUTE_SLICES and p["instances"] * p["memory_slices"] <= MEMORY_SLICES
            assert p.get("sms", 0) <= row["sm_count"]


def test_slices_lose_nvlink_and_reach_each_other_through_the_host():
    topo = load_system("hgx-h100")
    split, partition = split_system(topo, "3g.40gb")
    assert len(split.devices()) == len(topo.devices()) * partition.per_gpu == 16
    assert not split.nodes_of("nvswitch") and not any(l.kind == "nvlink" for l in split.links)
    for d in split.devices():
        (link,) = split.links_of(d)
        assert split.nodes[link.other(d)].kind == "cpu"
        whole = topo.nodes[split.nodes[d].attrs["parent_gpu"]].attrs
        assert split.nodes[d].attrs["compute_share"] < 1
        assert split.nodes[d].attrs["memory_bytes"] == int(whole["memory_bytes"] * partition.memory_share)
    # a slice's share of the PCIe link: the slices of one GPU together have the GPU's link
    per_gpu = {}
    for d in split.devices():
        per_gpu.setdefault(split.nodes[d].attrs["parent_gpu"], []).append(split.links_of(d)[0].bandwidth_bytes_per_s)
    whole_link = min(l.bandwidth_bytes_per_s for l in topo.links if l.kind == "pcie")
    assert all(sum(v) == pytest.approx(whole_link) for v in per_gpu.values())


def test_time_slices_share_everything_equally():
    p = system_partition(load_system("dgx1-p100"), "1/4")
    assert p.kind == "time-sliced" and p.compute_share == p.memory_bandwidth_share == p.memory_share == 0.25
    assert len(partitioned(load_system("dgx1-p100"), p).devices()) == 32


@pytest.mark.parametrize("system, text, message", [
    ("dgx-a100-320gb", "3g.40gb", "not a MIG profile of NVIDIA A100-SXM4-40GB"),
    ("dgx1-p100", "3g.40gb", "has no MIG profiles"),
    ("dgx-a100", "1/0", "1/N"),
    ("dgx-a100", "2/3", "not a MIG profile"),
])
def test_a_partition_the_gpu_cannot_have_is_refused(system, text, message):
    with pytest.raises(MeshscaleError, match=message):
        system_partition(load_system(system), text)


def test_predict_prints_the_shares_and_their_source(cli):
    r = cli("predict", "--model", "resnet50", "--system", "hgx-h100", "--partition", "3g.40gb", "--gpus", "1,2")
    assert r.exit_code == 0, r.output
    assert "MIG instance 3g.40gb" in r.stdout and "NVIDIA Multi-Instance GPU User Guide" in r.stdout
    assert "through host memory or the network" in r.stdout
    bad = cli("predict", "--model", "resnet50", "--system", "dgx-a100", "--partition", "9g.1gb")
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and "9g.1gb" in bad.stderr
    nodes = cli("predict", "--model", "resnet50", "--nodes", "1,2", "--partition", "1/2")
    assert nodes.exit_code == 2 and "--partition" in nodes.stderr
