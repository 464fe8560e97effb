"""Build a `Topology` of this machine's NVIDIA GPUs from NVML (nvidia-ml-py, imported as ``pynvml``).

What NVML tells, and how it becomes the model:
- GPUs: name, memory, PCI bus id, UUID, PCIe generation/width (current and max), CPU affinity, NUMA node,
  MIG mode and instances. NVML has no SM count, peak FLOP/s or memory bandwidth: those come from the catalog
  when it has the GPU model, else from the table of known models (gpu_models.yaml, datasheet per row), else
  from its stated default, named in ``attrs["assumed"]``; the SM count last from torch (with a CUDA build).
- NVLink: each active link's remote end. Links to another GPU are bonded into one link with ``count``; links to
  an NVSwitch go to one ``nvswitch`` node per distinct remote PCI bus id.
- PCIe: NVML gives no tree, only the common-ancestor level of each GPU pair. Grouping GPUs by level rebuilds
  a tree that reproduces those levels: PIX -> one shared switch, PXB -> leaf switches under one upper switch,
  PHB -> one host bridge, NODE -> host bridges of one CPU, SYS -> different CPUs joined by UPI.

Every call a driver or GPU may not support is guarded: the topology is then partial but valid, and
``attrs["nvml_unsupported"]`` names the calls that failed. Not in NVML, so left out: NICs (`nics.py` reads them from sysfs), and links between
NVSwitches (a DGX-2's two boards would appear joined only by PCIe).
"""
from __future__ import annotations

import itertools
import os
import re
from collections import Counter

import networkx as nx

import meshscale.topology.links as calc
from meshscale.topology.gpu_facts import GPU_MODELS_FILE, gpu_models, model_facts  # noqa: F401 (their home was here)
from meshscale.topology.model import DEFAULT_LATENCY_S, Link, Node, Topology

LEVEL_RELATION = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3, "prop": 4}
# nvidia-smi topo -p2p codes for nvmlGpuP2PStatus_t
P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "NS", 5: "NS", 6: "U"}
NVLINK_REMOTE_GPU, NVLINK_REMOTE_CPU, NVLINK_REMOTE_SWITCH = 0, 1, 2  # CPU: an IBM NPU (POWER9 over NVLink)
# nvmlDeviceGetNvLinkVersion returns NVML_NVLINK_VERSION_* (1_0, 2_0, 2_2, 3_0, 3_1, 4_0, 5_0), not the generation
NVML_VERSION_GENERATION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5}
# ... and some drivers return the bare generation, so a known GPU model decides first.
MODEL_GENERATION = (("P100", 1), ("V100", 2), ("A100", 3), ("A800", 3), ("H100", 4), ("H200", 4), ("H800", 4),
                    ("H20", 4), ("GH200", 4), ("B100", 5), ("B200", 5), ("GB200", 5))
# Inter-socket link when NVML says SYS: two UPI links at 10.4 GT/s (NVML cannot see it; `bench p2p` measures).
ASSUMED_SOCKET_LINK_BYTES_PER_S = calc.qpi_bandwidth(calc.UPI_DEFAULT_GT_S, 2)
FALLBACK_PCIE = (3, 16)  # when NVML cannot tell a GPU's PCIe link


class NoGPU(Exception):
    """NVML or its GPUs are not there; the message says which."""


class _Calls:
    """NVML calls that return None instead of raising when the driver or GPU does not support them."""

    def __init__(self, nvml):
        self.nvml = nvml
        self.unsupported: set[str] = set()

    def __call__(self, fname: str, *args, quiet: bool = False):
        fn = getattr(self.nvml, fname, None)
        if fn is None:
            self.unsupported.add(fname)
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            if not quiet:
                self.unsupported.add(fname)
            return None


def nvml_topology(nvml=None, sm_counts: dict[str, int] | None = None) -> Topology:
    """This machine's GPUs as a `Topology`. ``nvml`` is the pynvml module (or a fake for tests);
    ``sm_counts`` maps GPU UUID -> SM count (default: the catalog for known models, else torch, which starts
    CUDA in this process and so is asked only when needed). Raises `NoGPU` when there is none."""
    if nvml is None:
        import pynvml as nvml
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, or an OSError from ctypes
        raise NoGPU(f"NVML unavailable: {str(exc) or type(exc).__name__}") from None
    try:
        return _build(_Calls(nvml), sm_counts)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # shutting down must never hide the result or the real error
            pass


def _build(call: _Calls, sm_counts: dict[str, int] | None) -> Topology:
    nvml = call.nvml
    count = call("nvmlDeviceGetCount") or 0
    if count == 0:
        raise NoGPU("NVML sees no GPU")
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    gpus = [_gpu_attrs(call, h, i) for i, h in enumerate(handles)]
    _add_sm_counts(gpus, sm_counts or {})
    assumed = _add_catalog_facts(gpus)
    if sm_counts is None and any("sm_count" not in g for g in gpus):
        _add_sm_counts(gpus, _torch_sm_counts())
    nodes = {f"gpu{i}": Node(f"gpu{i}", "gpu", attrs) for i, attrs in enumerate(gpus)}
    levels = _levels(call, handles, gpus)
    links: list[Link] = []
    _add_pcie_tree(nodes, links, gpus, levels)
    _add_nvlinks(call, nodes, links, handles, gpus)
    from meshscale.topology.multinode import hostname as host_name
    hostname = host_name()
    models = sorted({g["model"] for g in gpus})
    attrs = {
        "source": "nvml",
        "hostname": hostname,
        "driver_version": _text(call("nvmlSystemGetDriverVersion")),
        "cuda_driver_version": call("nvmlSystemGetCudaDriverVersion"),
        "bandwidth_source": "line rate from NVML link state (measure with `meshscale bench p2p`)",
        "pcie_levels": {f"{i}-{j}": LEVEL_RELATION.get(level, "SYS") for (i, j), level in levels.items()},
        "p2p": _p2p_status(call, handles),
        "nvml_unsupported": sorted(call.unsupported),
    }
    if assumed:
        attrs["assumed"] = assumed
    title = f"this machine ({hostname}): {count}x {', '.join(models)} (NVML)"
    return Topology("gpu-host", nodes, links, title, attrs)


# ---- GPUs --------------------------------------------------------------------------------------------
def _gpu_attrs(call: _Calls, handle, index: int) -> dict:
    """Everything NVML tells about one GPU, as plain JSON-able values."""
    nvml = call.nvml
    model = _text(call("nvmlDeviceGetName", handle)) or "NVIDIA GPU"
    uuid = _text(call("nvmlDeviceGetUUID", handle))
    pci = call("nvmlDeviceGetPciInfo", handle)
    memory = call("nvmlDeviceGetMemoryInfo", handle)
    attrs = {"index": index, "model": model, "uuid": uuid, "pci_bus_id": _bus(pci.busId) if pci else None,
             "memory_bytes": int(memory.total) if memory else None}
    for key, fname in (("pcie_generation", "nvmlDeviceGetCurrPcieLinkGeneration"),
                       ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
                       ("pcie_max_generation", "nvmlDeviceGetMaxPcieLinkGeneration"),
                       ("pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth")):
        attrs[key] = call(fname, handle)
    words = max(1, -(-(os.cpu_count() or 1) // 64))  # 64-bit words needed for the CPU mask
    mask = call("nvmlDeviceGetCpuAffinity", handle, words)
    attrs["cpu_affinity"] = _cpu_list(list(mask)) if mask is not None else None
    attrs["numa"] = _numa(call, handle, attrs["pci_bus_id"])
    mode = call("nvmlDeviceGetMigMode", handle)
    if mode is not None:
        enabled = mode[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)
        attrs["mig_mode"] = "enabled" if enabled else "disabled"
        attrs["mig_instances"] = _mig_instances(call, handle) if enabled else []
    return {k: v for k, v in attrs.items() if v is not None}


# Facts NVML does not give (peak FLOP/s, memory bandwidth, SM count, NVLinks per GPU of the model).
CATALOG_FACTS = ("sm_count", "memory_bandwidth_bytes_per_s", "fp64_flops", "fp32_flops", "tf32_flops", "fp16_flops",
                 "bf16_flops", "fp8_flops", "fp4_flops", "tensor_cores")
MODEL_FACTS = (*CATALOG_FACTS, "nvlink_generation")
def _add_catalog_facts(gpus: list[dict]) -> list[str]:
    """Fill in what NVML does not tell (what NVML said wins): from the catalog system whose GPU model NVML's
    name equals, else from the table of known models, else the table's default. Returns what was assumed."""
    from meshscale.topology.shipped import catalog_gpus

    known = catalog_gpus()
    assumed = []
    for gpu in gpus:
        facts, found = model_facts(gpu["model"])
        if gpu["model"] in known:
            system, catalog = known[gpu["model"]]
            facts, found = {**facts, **catalog}, True
            gpu["facts_from"] = f"catalog {system}"
        else:
            gpu["facts_from"] = f"{facts['name']}: {facts['source']}"
        gpu.update({k: facts[k] for k in MODEL_FACTS if k in facts and k not in gpu})
        if "nvlinks" in facts:
            gpu["model_nvlinks"] = facts["nvlinks"]  # links per GPU of the model; attrs["nvlinks"] counts those up
        if not found:
            gpu["facts_assumed"] = True
            assumed.append(f"gpu{gpu['index']} ({gpu['model']}): {facts['source']}")
    return [f"assumed: {text}" for text in assumed]


def _add_sm_counts(gpus: list[dict], counts: dict[str, int]) -> None:
    for gpu in gpus:
        sm = counts.get(_uuid_key(gpu["uuid"])) if gpu.get("uuid") else None
        if sm and "sm_count" not in gpu:
            gpu["sm_count"] = sm


def mig_instances(nvml, handle) -> list[dict]:
    """The MIG instances (name, uuid, memory_bytes) of one GPU of an initialised NVML module (doctor's too)."""
    return _mig_instances(_Calls(nvml), handle)


def _mig_instances(call: _Calls, handle) -> list[dict]:
    out = []
    for k in range(call("nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
        mig = call("nvmlDeviceGetMigDeviceHandleByIndex", handle, k, quiet=True)  # empty slots raise NotFound
        if mig is None:
            continue
        memory = call("nvmlDeviceGetMemoryInfo", mig)
        out.append({"name": _text(call("nvmlDeviceGetName", mig)), "uuid": _text(call("nvmlDeviceGetUUID", mig)),
                    "memory_bytes": int(memory.total) if memory else None})
    return out


def _numa(call: _Calls, handle, bus: str | None) -> int | None:
    node = call("nvmlDeviceGetNumaNodeId", handle)
    if node is None and bus:  # older drivers: the kernel knows (sysfs names the domain with 4 hex digits)
        try:
            with open(f"/sys/bus/pci/devices/{bus[-12:].lower()}/numa_node") as f:
                node = int(f.read())
        except (OSError, ValueError):
            node = None
    return node if node is not None and node >= 0 else None


def _torch_sm_counts() -> dict[str, int]:
    """SM count per GPU UUID from torch; empty without a CUDA build (NVML has no SM count for full GPUs)."""
    try:
        import torch
        if not torch.cuda.is_available():
            return {}
        return {_uuid_key(str(torch.cuda.get_device_properties(i).uuid)): torch.cuda.get_device_properties(i).multi_processor_count
                for i in range(torch.cuda.device_count())}
    except Exception:  # an optional figure: a broken CUDA set-up must not stop discovery
        return {}


# ---- PCIe --------------------------------------------------------------------------------------------
def _levels(call: _Calls, handles: list, gpus: list[dict]) -> dict[tuple[int, int], int]:
    """NVML common-ancestor level of each GPU pair; when unsupported, guessed from the NUMA nodes."""
    levels = {}
    for i, j in itertools.combinations(range(len(handles)), 2):
        level = call("nvmlDeviceGetTopologyCommonAncestor", handles[i], handles[j])
        if level is None:
            level = 50 if gpus[i].get("numa", 0) != gpus[j].get("numa", 0) else 30
        levels[(i, j)] = int(level)
    return levels


def _groups(members: list[int], levels: dict[tuple[int, int], int], threshold: int) -> list[list[int]]:
    """Members joined when their common ancestor is at most ``threshold``, each group sorted, by first index."""
    g = nx.Graph()
    g.add_nodes_from(members)
    g.add_edges_from((i, j) for i, j in itertools.combinations(members, 2) if levels[(min(i, j), max(i, j))] <= threshold)
    return sorted(sorted(c) for c in nx.connected_components(g))


def _gpu_pcie(attrs: dict) -> tuple[int, int]:
    """(generation, width) the GPU's link is capable of (an idle GPU drops to a lower generation to save power,
    so the current one would understate the path; `doctor` compares the two under load); the current one, or
    PCIe 3.0 x16, where NVML did not say."""
    for gen, width in ((attrs.get("pcie_max_generation"), attrs.get("pcie_max_width")),
                       (attrs.get("pcie_generation"), attrs.get("pcie_width"))):
        if gen in calc.PCIE_GENERATIONS and width in calc.PCIE_WIDTHS:
            return gen, width
    return FALLBACK_PCIE


def _add_pcie_tree(nodes: dict, links: list, gpus: list[dict], levels: dict) -> None:
    """CPUs, host bridges and switches that reproduce NVML's common-ancestor level of every GPU pair."""
    names = Counter()

    def add(kind: str, prefix: str, attrs: dict, members: list[int], parent: str | None) -> str:
        name = f"{prefix}{names[prefix]}"
        names[prefix] += 1
        nodes[name] = Node(name, kind, attrs)
        if parent:  # an uplink is given the fastest link below it
            gen, width = max(_gpu_pcie(gpus[m]) for m in members)
            links.append(_pcie_link(name, parent, gen, width))
        return name

    cpus = []
    for socket in _groups(list(range(len(gpus))), levels, 40):
        bridges = _groups(socket, levels, 30)
        first = gpus[socket[0]]
        cpu_attrs = {"numa": first.get("numa", len(cpus)), "pcie_relation": "NODE" if len(bridges) > 1 else "PHB"}
        if "cpu_affinity" in first:
            cpu_attrs["cpu_affinity"] = first["cpu_affinity"]
        cpu = add("cpu", "cpu", cpu_attrs, socket, None)
        cpus.append(cpu)
        for bridge in bridges:
            top = add("pcie_switch", "hostbridge", {"host_bridge": True}, bridge, cpu) if len(bridges) > 1 else cpu
            for upper in _groups(bridge, levels, 20):
                leaves = _groups(upper, levels, 10)
                parent = add("pcie_switch", "pcie_up", {}, upper, top) if len(leaves) > 1 else top
                for leaf in leaves:
                    switch = add("pcie_switch", "pcie", {}, leaf, parent)
                    for g in leaf:
                        links.append(_pcie_link(f"gpu{g}", switch, *_gpu_pcie(gpus[g])))
    for a, b in itertools.combinations(cpus, 2):
        links.append(Link(a, b, "upi", ASSUMED_SOCKET_LINK_BYTES_PER_S, DEFAULT_LATENCY_S["upi"]))


def _pcie_link(a: str, b: str, generation: int, width: int) -> Link:
    return Link(a, b, "pcie", calc.pcie_bandwidth(generation, width), DEFAULT_LATENCY_S["pcie"],
                generation=generation, width=width)


# ---- NVLink ------------------------------------------------------------------------------------------
def _add_nvlinks(call: _Calls, nodes: dict, links: list, handles: list, gpus: list[dict]) -> None:
    """Active NVLinks: bonded GPU-GPU links and GPU-NVSwitch links, with generation and counts on the GPUs."""
    nvml = call.nvml
    by_bus = {g.get("pci_bus_id"): i for i, g in enumerate(gpus)}
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    p2p_cap = getattr(nvml, "NVML_NVLINK_CAP_P2P_SUPPORTED", 0)
    to_gpu: dict[int, Counter] = {}
    to_switch: dict[int, Counter] = {}
    for i, handle in enumerate(handles):
        peers, switches, versions, p2p = Counter(), Counter(), set(), []
        reported = 0
        for link in range(max_links):
            # links past the GPU's count answer InvalidArgument; NotSupported on link 0 means no NVLink at all
            state = call("nvmlDeviceGetNvLinkState", handle, link, quiet=link > 0)
            reported += state is not None
            if state != enabled:
                continue
            remote = call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            bus = _bus(remote.busId) if remote is not None else "unknown"
            kind = call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            version = call("nvmlDeviceGetNvLinkVersion", handle, link)
            if version is not None:
                versions.add(int(version))
            p2p.append(call("nvmlDeviceGetNvLinkCapability", handle, link, p2p_cap))
            if kind == NVLINK_REMOTE_CPU:
                continue  # not part of the GPU fabric
            if kind not in (NVLINK_REMOTE_GPU, NVLINK_REMOTE_SWITCH):  # unsupported or UNKNOWN: the bus id decides
                kind = NVLINK_REMOTE_GPU if bus in by_bus else NVLINK_REMOTE_SWITCH
            if kind == NVLINK_REMOTE_SWITCH:
                switches[bus] += 1
            elif bus in by_bus and by_bus[bus] != i:
                peers[by_bus[bus]] += 1
        to_gpu[i], to_switch[i] = peers, switches
        attrs = nodes[f"gpu{i}"].attrs
        attrs["nvlinks"] = sum(peers.values()) + sum(switches.values())
        if reported:
            attrs["nvlinks_reported"] = reported  # up or not: what this GPU has
        generation = _generation(attrs.get("model", ""), versions) or attrs.get("nvlink_generation")
        if generation:
            attrs["nvlink_generation"] = generation
        if versions:
            attrs["nvlink_version_nvml"] = max(versions)
        if p2p and None not in p2p:
            attrs["nvlink_p2p_supported"] = all(bool(x) for x in p2p)

    def bandwidth(i: int, count: int) -> tuple[float, int | None]:
        gen = nodes[f"gpu{i}"].attrs.get("nvlink_generation")
        return calc.nvlink_bandwidth(gen or 2, count), gen  # unknown generation: 25 GB/s per link

    for i, j in itertools.combinations(range(len(handles)), 2):
        count = max(to_gpu[i][j], to_gpu[j][i])  # each side should see the same links; trust the larger
        if count:
            bw, gen = bandwidth(i, count)
            links.append(Link(f"gpu{i}", f"gpu{j}", "nvlink", bw, DEFAULT_LATENCY_S["nvlink"], count, gen))
    buses = sorted({bus for c in to_switch.values() for bus in c})
    for k, bus in enumerate(buses):
        nodes[f"nvswitch{k}"] = Node(f"nvswitch{k}", "nvswitch", {"pci_bus_id": bus})
    for i in range(len(handles)):
        for bus, count in sorted(to_switch[i].items()):
            bw, gen = bandwidth(i, count)
            links.append(Link(f"gpu{i}", f"nvswitch{buses.index(bus)}", "nvlink", bw, DEFAULT_LATENCY_S["nvlink"], count, gen))


def _generation(model: str, versions: set[int]) -> int | None:
    """NVLink generation: from a known GPU model first, else from NVML's version enum."""
    for key, generation in MODEL_GENERATION:
        if re.search(rf"\b{key}\b", model):
            return generation
    return NVML_VERSION_GENERATION.get(max(versions)) if versions else None


def _p2p_status(call: _Calls, handles: list) -> dict[str, dict[str, str]]:
    """nvidia-smi topo -p2p codes (OK, CNS, GNS, TNS, NS, U) per GPU pair and capability."""
    out = {}
    for i, j in itertools.combinations(range(len(handles)), 2):
        status = {cap: call("nvmlDeviceGetP2PStatus", handles[i], handles[j], idx) for cap, idx in P2P_CAPS.items()}
        status = {cap: P2P_STATUS.get(code, "U") for cap, code in status.items() if code is not None}
        if status:
            out[f"{i}-{j}"] = status
    return out


# ---- small conversions ---------------------------------------------------------------------------------
def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _bus(value) -> str:
    """Normalised PCI bus id: '00000000:18:00.0' (upper-case hex, 8-digit domain)."""
    text = (_text(value) or "").strip().upper()
    parts = text.split(":")
    if len(parts) == 2:  # no domain given
        parts = ["0", *parts]
    try:
        return f"{int(parts[0], 16):08X}:{parts[1]}:{parts[2]}" if len(parts) == 3 else text
    except ValueError:
        return text


def _uuid_key(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-")


def _cpu_list(mask_words: list[int], word_bits: int = 64) -> str:
    """A CPU bit mask (NVML's array of 64-bit words) as nvidia-smi prints it: '0-51,104-155'."""
    return cpu_list(mask_cpus(mask_words, word_bits))


def mask_cpus(mask_words: list[int], word_bits: int = 64) -> list[int]:
    """The CPUs set in a bit mask given as words (NVML's CPU affinity), in order."""
    return [w * word_bits + b for w, word in enumerate(mask_words) for b in range(word_bits) if int(word) >> b & 1]


def cpu_list(cpus) -> str:
    """CPU numbers as ranges, the way nvidia-smi and taskset print them: '0-51,104-155'."""
    ranges = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges)
