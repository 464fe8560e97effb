"""Partitioned GPUs: MIG instances (spatial: their own SMs, memory slices and L2) and time-sliced vGPUs (the whole
GPU for 1/N of the time), as a system whose devices are the slices.

A slice's share of the GPU is a fact of the profile: MIG's from NVIDIA's MIG User Guide (the `mig_profiles` of
gpu_models.yaml), a time-sliced vGPU's from the scheduler (NVIDIA Virtual GPU Software User Guide: the equal-share
and fixed-share schedulers give each of N vGPUs 1/N of the GPU's time; the frame buffer is split into N equal
profiles). Slices have no NVLink and no peer-to-peer path to one another, not even on one GPU (MIG instances are
isolated; P2P between vGPUs needs whole GPUs): what they exchange goes through host memory, over the GPU's PCIe
link, or over the network. So in the derived system every slice hangs off its GPU's CPU by its share of the GPU's
PCIe link, and the NVLinks and NVSwitches are gone.

Compute enters through the step time, not the FLOP rate: the whole step of the whole GPU (its fixed part too:
launches, the optimizer's memory-bound pass) is taken to run on the slice's share of the SMs, or, time-sliced, in
its share of the time, so a step takes 1 / share as long (`Partition.step_time_factor`). A slice's attributes keep
the GPU's peak rates (what its SMs run at) beside its shares; its memory is its share of the GPU's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import networkx as nx

from meshscale.errors import MeshscaleError, one_line
from meshscale.topology.model import Link, Node, Topology

MIG_SOURCE = "NVIDIA Multi-Instance GPU User Guide, Supported MIG Profiles"
VGPU_SOURCE = "NVIDIA Virtual GPU Software User Guide, time-sliced vGPU schedulers (equal / fixed share)"
COMPUTE_SLICES, MEMORY_SLICES = 7, 8
MAX_TIME_SLICES = 32   # the most vGPUs of one GPU in NVIDIA's profiles (e.g. A100 40GB: 40 x 1 GB is C-series 1/40;
                       # past a few dozen the frame buffer per vGPU is too small to train in)


@dataclass(frozen=True)
class MigProfile:
    name: str
    sm_slices: int
    memory_slices: int
    instances: int               # the most of this profile one GPU holds
    sms: int | None = None       # SMs of one instance, where the guide lists them


@dataclass(frozen=True)
class Partition:
    """One slice of a GPU and its shares of the whole GPU."""

    name: str                    # "3g.40gb" or "1/4"
    kind: str                    # "mig" or "time-sliced"
    compute_share: float         # of the GPU's FLOP/s
    memory_bandwidth_share: float
    memory_share: float          # of its memory
    per_gpu: int                 # slices one GPU holds
    gpu_model: str
    source: str

    @property
    def step_time_factor(self) -> float:
        return 1 / self.compute_share

    def describe(self) -> str:
        what = "MIG instance" if self.kind == "mig" else "time-sliced vGPU"
        return (f"{what} {self.name} of {self.gpu_model}: {self.compute_share:.1%} of the compute, "
                f"{self.memory_bandwidth_share:.1%} of the memory bandwidth, {self.memory_share:.1%} of the memory, "
                f"{self.per_gpu} per GPU ({self.source}); slices exchange through host memory or the network "
                "(no NVLink or P2P between slices)")


def _facts(gpu_model: str) -> dict:
    from meshscale.topology.gpu_facts import model_facts
    return model_facts(gpu_model)[0]


def mig_profiles(gpu_model: str) -> list[MigProfile]:
    """The MIG profiles of a GPU model as NVML or the catalog spells it; empty for a GPU without MIG."""
    from meshscale.topology.gpu_facts import mig_table

    facts = _facts(gpu_model)
    if not facts.get("mig"):
        return []
    return [MigProfile(**row) for row in mig_table(facts["mig"])]


def profile_names(profiles: list[MigProfile]) -> list[str]:
    """Every name a GPU's MIG profiles go by: each profile, and ``+me`` (the media extensions) on the profile of
    one compute and one memory slice, the only one that offers it (MIG User Guide, e.g. 1g.10gb+me on H100)."""
    names = []
    for p in profiles:
        names += [p.name] + ([f"{p.name}+me"] if p.sm_slices == 1 and p.memory_slices == 1 else [])
    return names


def mig_profile(text: str, gpu_model: str, where: str) -> MigProfile:
    """The MIG profile ``text`` names on ``gpu_model`` (exactly as NVIDIA spells it); one line listing the GPU's
    profiles otherwise."""
    profiles = mig_profiles(gpu_model)
    if not profiles:
        raise MeshscaleError(f"{where} {one_line(text)}: {one_line(gpu_model) or 'this GPU'} has no MIG profiles (MIG "
                             "is on A100, H100 and H200); a time-sliced share such as 1/4 works on any GPU")
    if text not in profile_names(profiles):
        raise MeshscaleError(f"{where} {one_line(text)!r}: not a MIG profile of {one_line(gpu_model)}; its profiles are "
                             f"{', '.join(profile_names(profiles))} ({MIG_SOURCE})")
    return next(p for p in profiles if p.name == text.removesuffix("+me"))


def parse_partition(text: str, gpu_model: str, gpu_sms: int | None = None) -> Partition:
    """``3g.40gb`` (a MIG profile of ``gpu_model``) or ``1/N`` (a time-sliced share); a one-line error otherwise."""
    fraction = re.fullmatch(r"1/([0-9]{1,6})", text)
    if fraction:
        n = int(fraction.group(1))
        if not 1 <= n <= MAX_TIME_SLICES:
            raise MeshscaleError(f"--partition {text}: a time-sliced share is 1/N with N from 1 to {MAX_TIME_SLICES}")
        return Partition(text, "time-sliced", 1 / n, 1 / n, 1 / n, n, gpu_model, VGPU_SOURCE)
    profile = mig_profile(text, gpu_model, "--partition")
    # an instance's SMs against the whole GPU's (a 7g instance of an A100 has 98 of its 108), else the guide's fraction
    gpu_sms = gpu_sms or _facts(gpu_model).get("sm_count")
    compute = profile.sms / gpu_sms if profile.sms and gpu_sms else profile.sm_slices / COMPUTE_SLICES
    share = profile.memory_slices / MEMORY_SLICES
    return Partition(text, "mig", compute, share, share, profile.instances, gpu_model, MIG_SOURCE)


def system_partition(topo: Topology, text: str) -> Partition:
    """``text`` as a partition of ``topo``'s GPUs (one model)."""
    gpus = topo.gpus()
    if not gpus:
        raise MeshscaleError(f"--partition splits GPUs; {topo.name} has none")
    attrs = topo.nodes[gpus[0]].attrs
    return parse_partition(text, str(attrs.get("model", "")), attrs.get("sm_count"))


def _host_path(topo: Topology, gpu: str) -> tuple[str, float, float]:
    """(CPU, narrowest bandwidth, total latency) of the PCIe path from ``gpu`` to its nearest CPU."""
    pcie = nx.Graph()
    for link in topo.links:
        if link.kind == "pcie":
            pcie.add_edge(link.a, link.b, link=link)
    cpus = [c for c in topo.nodes_of("cpu") + topo.nodes_of("host") if c in pcie]
    if gpu not in pcie or not cpus:
        raise MeshscaleError(f"{topo.name}: {gpu} has no PCIe path to a CPU, so its slices could not exchange anything")
    lengths, paths = nx.single_source_dijkstra(pcie, gpu)
    cpu = min((c for c in cpus if c in paths), key=lambda c: lengths[c])
    links = [pcie.edges[a, b]["link"] for a, b in zip(paths[cpu], paths[cpu][1:])]
    return cpu, min(l.bandwidth_bytes_per_s for l in links), sum(l.latency_s for l in links)


def partitioned(topo: Topology, partition: Partition) -> Topology:
    """``topo`` with each GPU replaced by ``partition.per_gpu`` slices, their shares in their attributes, each
    on its GPU's CPU by an equal share of the GPU's PCIe link; no NVLink, no NVSwitch. Slice k of GPU g has index
    g x per_gpu + k, so the first N devices fill one GPU before the next."""
    gpus = topo.gpus()
    per = partition.per_gpu
    nodes = {n: node for n, node in topo.nodes.items() if node.kind not in ("gpu", "nvswitch")}
    links = [l for l in topo.links if l.a in nodes and l.b in nodes]
    for gpu in gpus:
        cpu, bandwidth, latency = _host_path(topo, gpu)
        attrs = dict(topo.nodes[gpu].attrs)
        if attrs.get("memory_bytes"):
            attrs["memory_bytes"] = int(attrs["memory_bytes"] * partition.memory_share)
        if attrs.get("sm_count") and partition.kind == "mig":
            attrs["sm_count"] = round(attrs["sm_count"] * partition.compute_share)
        attrs.update(nvlinks=0, partition=partition.name, parent_gpu=gpu, compute_share=partition.compute_share,
                     memory_bandwidth_share=partition.memory_bandwidth_share)
        for k in range(per):
            name = f"{gpu}.{k}" if per > 1 else gpu
            nodes[name] = Node(name, "gpu", {**attrs, "index": topo.nodes[gpu].index * per + k})
            links.append(Link(name, cpu, "pcie", bandwidth / per, latency, generation=None, width=None))
    title = f"{topo.title or topo.name}, each GPU as {per} x {partition.name}"
    return Topology(f"{topo.name}/{partition.name}", nodes, links, title, {**topo.attrs, "partition": partition.name})


def split_system(topo: Topology, text: str) -> tuple[Topology, Partition]:
    """``topo`` with its GPUs split as ``text`` says (`parse_partition`), and the partition."""
    partition = system_partition(topo, text)
    return partitioned(topo, partition), partition


MAX_MIG_INSTANCES = 7      # a GPU holds at most seven MIG instances (seven compute slices; MIG User Guide)
_INSTANCE_PROFILE = re.compile(r"(?:^|\s)([0-9]{1,2}g\.[0-9]{1,4}gb(?:\+me)?)$")


def check_mig_instances(attrs: dict, where: str) -> None:
    """A GPU's MIG state as a system file states it (`topo --json` writes it from NVML): mig_mode enabled or
    disabled, at most seven instances, each named (as NVML names them, ending in the profile) after a profile
    the GPU offers; one line naming the field otherwise. A GPU model meshscale has no facts of is not judged."""
    mode = attrs.get("mig_mode")
    if mode is not None and mode not in ("enabled", "disabled"):
        raise MeshscaleError(f"{where}: mig_mode {one_line(str(mode))[:40]!r} is not enabled or disabled")
    instances = attrs.get("mig_instances")
    if instances is None:
        return
    if not isinstance(instances, list) or len(instances) > MAX_MIG_INSTANCES:
        raise MeshscaleError(f"{where}: mig_instances is not a list of at most {MAX_MIG_INSTANCES} instances")
    if instances and mode != "enabled":
        raise MeshscaleError(f"{where}: mig_instances listed but mig_mode is {mode!r}; MIG instances need MIG on")
    from meshscale.topology.gpu_facts import model_facts
    model = attrs.get("model") if isinstance(attrs.get("model"), str) else ""
    known = bool(model) and model_facts(model)[1]
    for k, instance in enumerate(instances):
        name = instance.get("name") if isinstance(instance, dict) else None
        if not isinstance(name, str) or len(name) > 200 or not name.isprintable():
            raise MeshscaleError(f"{where}: mig_instances[{k}].name is not a one-line name")
        found = _INSTANCE_PROFILE.search(name)
        if known and found is None:
            raise MeshscaleError(f"{where}: mig_instances[{k}].name {name!r} names no MIG profile (e.g. "
                                 f"'{model} MIG 1g.10gb')")
        if known:
            mig_profile(found.group(1), model, f"{where}: mig_instances[{k}].name")


def partition_text(instance_name: str, gpu_model: str, gpu_sms: int | None = None) -> str:
    """A MIG instance as NVML names it ("NVIDIA H100 80GB HBM3 MIG 3g.40gb") with its shares of the GPU."""
    m = re.search(r"\d+g\.\d+gb", instance_name)
    if not m:
        return instance_name or "unnamed instance"
    try:
        p = parse_partition(m.group(0), gpu_model, gpu_sms)
    except MeshscaleError:
        return f"{m.group(0)} (not in the MIG profiles meshscale knows for {gpu_model})"
    return f"{p.name} ({p.compute_share:.0%} of the SMs, {p.memory_bandwidth_share:.0%} of the memory bandwidth)"


def partition_lines(topo: Topology) -> list[str]:
    """One line per GPU in MIG mode (as NVML discovery found it): its instances and their shares."""
    lines = []
    for gpu in topo.gpus():
        attrs = topo.nodes[gpu].attrs
        if attrs.get("mig_mode") != "enabled":
            continue
        found = [partition_text(i.get("name") or "", attrs.get("model", ""), attrs.get("sm_count"))
                 for i in attrs.get("mig_instances") or []]
        lines.append(f"{gpu}: MIG on, {len(found)} instance(s){': ' + '; '.join(found) if found else ''}; instances "
                     "exchange through host memory (no NVLink or P2P)")
    return lines
