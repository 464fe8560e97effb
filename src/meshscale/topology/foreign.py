"""A machine as other tools describe it: NCCL's topology dump (``NCCL_TOPO_DUMP_FILE``, XML) and the text of
``nvidia-smi topo -m`` (optionally after ``nvidia-smi -L``), read into a `Topology` and written back out.

Both are read into one `Sighting` (what the file says: GPUs, their PCIe common-ancestor levels, their NVLinks)
and built by NVML discovery itself, from a stand-in for NVML that answers with the file's facts, so a file
and a live machine give the same model. What a file does not say is filled and stated in ``attrs["assumed"]``:
the GPU model (from the compute capability in a dump, from ``nvidia-smi -L`` lines in a text), and the facts
of the model (SMs, FLOP/s, memory bandwidth) from the GPU model table, as discovery does.

What each format holds (NCCL 2.x ``graph/xml.cc`` dumps; nvidia-smi's topo -m legend):
- NCCL XML: ``<system><cpu numaid affinity ...><pci busid class link_speed link_width>`` nested as the PCIe
  tree, a GPU's ``<pci>`` holding ``<gpu dev sm rank>`` with ``<nvlink target count tclass>`` children
  (``tclass`` 0x030200 another GPU, 0x068000 an NVSwitch: all NVSwitches become one node, as NCCL reads
  them), NICs as ``<nic><net name speed .../></nic>``.
- topo -m: the relation of every GPU pair (X, NV#, PIX, PXB, PHB, NODE, SYS), CPU and NUMA affinity. An NV#
  pair hides its PCIe relation (taken as the closest one the other pairs allow), and NVSwitches show only as
  NV# between every pair (more links per GPU than the model has: one switch node stands for all of them).
NICs are not read from either (discovery reads them from sysfs); the GPU matrix is what round-trips.

Both are hostile-file safe: the XML is read with no DTD and no entity (refused in the raw text, before any
parsing) and with bounded depth and element count; every count the file gives (GPUs, NVLinks per pair and per
GPU) is checked against topology/limits.py before any work that grows with it; a self, duplicate, negative or
one-sided link is refused; and the built machine goes through the system file schema's checks, as YAML does.
"""
from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from meshscale.errors import MeshscaleError, TopologyError
from meshscale.topology.limits import (MAX_CPU_MASK_DIGITS, MAX_MACHINE_GPUS, MAX_NICS, MAX_NVLINKS_PER_GPU,
                                       MAX_XML_DEPTH, MAX_XML_ELEMENTS)
from meshscale.topology.model import Topology
from meshscale.units import is_digits

# NVML's common-ancestor levels (nvmlGpuTopologyLevel_t), as nvml_discovery reads them
LEVELS = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}
GPU_CLASS, NVSWITCH_CLASS, BRIDGE_CLASS = "0x030200", "0x068000", "0x060400"
# compute capability (NCCL's sm attribute) -> a GPU model name the GPU model table knows, SXM / PCIe
SM_MODELS = {60: ("Tesla P100-SXM2-16GB", "Tesla P100-PCIE-16GB"), 70: ("Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB"),
             80: ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"), 90: ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe")}
MODEL_SM = (("P100", 60), ("V100", 70), ("A100", 80), ("H100", 90), ("H200", 90), ("B200", 100), ("B300", 100))
ONE_SWITCH = "NVSWITCH"  # the bus id standing for all NVSwitches of a machine
PCIE_GT_S = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


@dataclass
class SeenGPU:
    """One GPU as a file describes it."""

    index: int
    bus_id: str
    model: str
    numa: int | None = None
    cpu_affinity: str | None = None
    pcie: tuple[int, int] | None = None             # (generation, width)
    nvlinks_to_gpus: dict[int, int] = field(default_factory=dict)        # peer index -> links
    nvlinks_to_switches: dict[str, int] = field(default_factory=dict)    # switch bus id -> links


@dataclass
class Sighting:
    """What a file says about a machine, and what had to be assumed to read it."""

    source: str                                      # "NCCL topology dump" | "nvidia-smi topo -m"
    gpus: list[SeenGPU]
    levels: dict[tuple[int, int], int]               # (i, j), i < j -> NVML common-ancestor level
    assumed: list[str] = field(default_factory=list)


def is_foreign(path: Path) -> bool:
    """True for a file this module reads (by suffix, or by its first bytes for a saved text)."""
    if path.suffix.lower() == ".xml":
        return True
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        return False
    try:
        with path.open("rb") as f:  # the head only: a huge file is refused by the bounded read later
            head = f.read(4096).decode(errors="replace")
    except OSError:
        return False
    return bool(re.search(r"^\s*GPU0\b", head, re.M) or head.lstrip().startswith("<"))


def load_foreign(path: str | Path) -> Topology:
    """A `Topology` from an NCCL topology dump or saved `nvidia-smi topo -m` text; a one-line error otherwise."""
    from meshscale.safe_io import read_text
    path = Path(path)
    try:  # a regular file, bounded in size, UTF-8
        text = read_text(path, "system file")
    except MeshscaleError as exc:
        raise TopologyError(str(exc)) from None
    sighting = read_nccl_xml(text, str(path)) if text.lstrip().startswith("<") else read_topo_text(text, str(path))
    return build(sighting, path.stem, str(path))


# ---- NCCL's XML ----------------------------------------------------------------------------------------
# Refused in the raw text before parsing: any markup declaration (a DTD, internal or external, and entity
# declarations: billion laughs, external entities), any entity reference but XML's five and character
# references, and an encoding other than UTF-8 (the text is already decoded as UTF-8).
_DECLARATION = re.compile(r"<!\s*(DOCTYPE|ENTITY|ELEMENT|ATTLIST|NOTATION)", re.I)
_ENTITY_REF = re.compile(r"&(?!(?:amp|lt|gt|quot|apos|#[0-9]{1,7}|#x[0-9a-fA-F]{1,6});)")
_ENCODING = re.compile(r"<\?xml[^>]*\bencoding\s*=\s*[\"']([^\"']*)[\"']")
_CHUNK_CHARS = 1 << 16


def _parse_xml(text: str, source: str) -> ET.Element:
    """The root of ``text``, parsed with no DTD or entity, at most MAX_XML_DEPTH deep and MAX_XML_ELEMENTS
    elements (counted as the parser goes, a chunk at a time, so a hostile file stops before its tree grows)."""
    found = _DECLARATION.search(text)
    if found:
        raise TopologyError(f"{source}: XML with a <!{found.group(1).upper()} declaration is refused (meshscale reads "
                            "no DTD or entity; an NCCL topology dump has none)")
    if _ENTITY_REF.search(text):
        raise TopologyError(f"{source}: XML with an entity reference is refused (meshscale reads no entity but "
                            "&amp; &lt; &gt; &quot; &apos; and character references)")
    encoding = _ENCODING.match(text.lstrip())
    if encoding and encoding.group(1).lower().replace("_", "-") not in ("utf-8", "utf8", "us-ascii", "ascii"):
        raise TopologyError(f"{source}: XML declares encoding {encoding.group(1)[:20]!r}; give it as UTF-8")
    parser = ET.XMLPullParser(events=("start", "end"))
    root, depth, count = None, 0, 0
    try:
        for start in range(0, len(text) + 1, _CHUNK_CHARS):
            if start < len(text):
                parser.feed(text[start:start + _CHUNK_CHARS])
            else:
                parser.close()
            for event, element in parser.read_events():
                depth += 1 if event == "start" else -1
                count += event == "start"
                root = element if root is None else root
                if depth > MAX_XML_DEPTH:
                    raise TopologyError(f"{source}: XML nests deeper than {MAX_XML_DEPTH} elements (the limit; an "
                                        "NCCL topology dump is about ten deep)")
                if count > MAX_XML_ELEMENTS:
                    raise TopologyError(f"{source}: XML has more than {MAX_XML_ELEMENTS} elements (the limit; an "
                                        "NCCL topology dump has a few hundred)")
    except ET.ParseError as exc:
        raise TopologyError(f"{source}: not an NCCL topology dump (XML: {exc})") from None
    return root


def read_nccl_xml(text: str, source: str = "<xml>") -> Sighting:
    root = _parse_xml(text, source)
    if root.tag != "system" or not root.findall(".//gpu"):
        raise TopologyError(f"{source}: not an NCCL topology dump (no <system> with <gpu> entries); write one "
                            "with NCCL_TOPO_DUMP_FILE=FILE.xml during any NCCL run")
    gpus, paths, assumed = [], {}, []
    # each GPU's ancestors, the CPU first: (cpu element, [bridges...]) found by walking the tree
    def walk(element, cpu, bridges):
        for child in element:
            if child.tag == "cpu":
                walk(child, child, [])
            elif child.tag == "pci":
                gpu = child.find("gpu")
                if gpu is not None:
                    gpus.append((child, gpu, cpu, list(bridges)))
                walk(child, cpu, bridges + [child])
    walk(root, None, [])
    _check_count(len(gpus), MAX_MACHINE_GPUS, "GPUs", source)
    bus_of = {}
    seen = []
    for pci, gpu, cpu, bridges in gpus:
        index = _int(gpu.get("dev", gpu.get("rank")), f"{source}: <gpu dev>")
        bus = pci.get("busid", f"gpu{index}").upper()
        if bus in bus_of or index in bus_of.values():
            raise TopologyError(f"{source}: <gpu dev={index}> (bus {bus[:40]}) appears twice; a dump names each "
                                "GPU once")
        bus_of[bus] = index
        sm = _int(gpu.get("sm", "0"), f"{source}: <gpu sm>")
        has_nvlink = gpu.find("nvlink") is not None
        model = _sm_model(sm, has_nvlink)
        numa = _int(cpu.get("numaid"), f"{source}: <cpu numaid>") if cpu is not None and cpu.get("numaid") else None
        seen.append(SeenGPU(index, bus, model, numa, _affinity(cpu.get("affinity"), source) if cpu is not None else None,
                            _pcie(pci)))
        paths[index] = (id(cpu), bridges)
    assumed.append("GPU model from the compute capability in the dump (it names no model): "
                   + ", ".join(sorted({g.model for g in seen})))
    for (pci, gpu, _, _), g in zip(gpus, seen):
        _xml_nvlinks(gpu, g, bus_of, source)
    levels = {}
    for a, b in itertools.combinations(sorted(paths), 2):
        levels[(a, b)] = _tree_level(paths[a], paths[b])
    sighting = Sighting("NCCL topology dump", sorted(seen, key=lambda g: g.index), levels, assumed)
    return _checked_sighting(sighting, source)


def _xml_nvlinks(gpu: ET.Element, g: SeenGPU, bus_of: dict[str, int], source: str) -> None:
    """The ``<nvlink>`` children of one GPU into ``g``: each target once, never the GPU itself, each count in range."""
    targets = set()
    for link in gpu.findall("nvlink"):
        where = f"{source}: GPU{g.index} <nvlink>"
        count = _nvlink_count(_int(link.get("count", "1"), f"{where} count"), where)
        target = (link.get("target") or "").upper()
        if target == g.bus_id:
            raise TopologyError(f"{where} targets the GPU itself ({target[:40]}); a link joins two devices")
        if target in targets:
            raise TopologyError(f"{where} names target {target[:40]} twice; a dump gives each target once, "
                                "with its count")
        targets.add(target)
        if link.get("tclass") == GPU_CLASS and target in bus_of:
            g.nvlinks_to_gpus[bus_of[target]] = count
        elif link.get("tclass") == NVSWITCH_CLASS:  # NCCL too joins every NVSwitch into one node
            g.nvlinks_to_switches[ONE_SWITCH] = g.nvlinks_to_switches.get(ONE_SWITCH, 0) + count


def _check_count(count: int, limit: int, what: str, source: str) -> None:
    if count > limit:
        raise TopologyError(f"{source}: {count} {what} is more than one machine has (the limit is {limit})")


def _nvlink_count(count: int, where: str) -> int:
    if not 1 <= count <= MAX_NVLINKS_PER_GPU:
        raise TopologyError(f"{where}: NVLink count {count} is out of range (1 to {MAX_NVLINKS_PER_GPU}, the limit)")
    return count


def _checked_sighting(sighting: Sighting, source: str) -> Sighting:
    """The sighting, once its GPUs are numbered 0..n-1, each GPU pair's NVLinks agree from both ends and no GPU
    has more NVLinks than the limit (the checks common to both formats)."""
    gpus = sighting.gpus
    if [g.index for g in gpus] != list(range(len(gpus))):
        raise TopologyError(f"{source}: GPUs are numbered {[g.index for g in gpus][:8]}; number them 0 to "
                            f"{len(gpus) - 1}")
    for g in gpus:
        total = sum(g.nvlinks_to_gpus.values()) + sum(g.nvlinks_to_switches.values())
        if total > MAX_NVLINKS_PER_GPU:
            raise TopologyError(f"{source}: GPU{g.index} has {total} NVLinks (the limit is {MAX_NVLINKS_PER_GPU})")
        for peer, n in g.nvlinks_to_gpus.items():
            if gpus[peer].nvlinks_to_gpus.get(g.index) != n:
                raise TopologyError(f"{source}: GPU{g.index} has {n} NVLinks to GPU{peer}, which has "
                                    f"{gpus[peer].nvlinks_to_gpus.get(g.index, 0)} back; the two ends must agree")
    return sighting


def _tree_level(a: tuple[int, list], b: tuple[int, list]) -> int:
    """NVML's level for two GPUs from their CPU and bridges: a bridge with one child is a port, not a switch."""
    (cpu_a, bridges_a), (cpu_b, bridges_b) = a, b
    if cpu_a != cpu_b:
        return LEVELS["SYS"]
    common = 0
    while common < min(len(bridges_a), len(bridges_b)) and bridges_a[common] is bridges_b[common]:
        common += 1
    if common == 0:
        return LEVELS["PHB"]
    below = [x for x in bridges_a[common:] + bridges_b[common:] if len(list(x)) > 1]
    return LEVELS["PIX"] if not below else LEVELS["PXB"]


def _sm_model(sm: int, has_nvlink: bool) -> str:
    family = SM_MODELS.get(sm - sm % 10) or SM_MODELS[max(k for k in SM_MODELS if k <= max(sm, 60))]
    return family[0] if has_nvlink else family[1]


def _pcie(pci) -> tuple[int, int] | None:
    speed = re.match(r"\s*([\d.]+)\s*GT/s", pci.get("link_speed") or "")
    width = pci.get("link_width")
    if not speed or not is_digits(width):
        return None
    generation = PCIE_GT_S.get(float(speed.group(1)))
    return (generation, int(width)) if generation else None


def _affinity(mask: str | None, source: str) -> str | None:
    """NCCL's hex CPU mask ('ffffffff,00000000', most significant word first) as a CPU list ('32-63')."""
    from meshscale.topology.nvml_discovery import cpu_list
    if not mask:
        return None
    if len(mask) > MAX_CPU_MASK_DIGITS:
        raise TopologyError(f"{source}: <cpu affinity> mask of {len(mask)} characters is longer than the limit "
                            f"({MAX_CPU_MASK_DIGITS} hex digits)")
    try:
        value = int(mask.replace(",", ""), 16)
    except ValueError:
        return None
    return cpu_list(b for b in range(value.bit_length()) if value >> b & 1) or None


def _int(value, where: str) -> int:
    try:
        return int(str(value), 0)
    except (TypeError, ValueError):
        raise TopologyError(f"{where} {value!r} is not a whole number") from None


# ---- nvidia-smi topo -m ----------------------------------------------------------------------------------
def read_topo_text(text: str, source: str = "<text>") -> Sighting:
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if re.match(r"^\s*GPU0(\s|$)", line)), None)
    if header is None:
        raise TopologyError(f"{source}: not `nvidia-smi topo -m` output (no header line starting with GPU0); "
                            "save it with `nvidia-smi -L; nvidia-smi topo -m` > FILE.txt")
    labels = [t for t in lines[header].split() if re.fullmatch(r"(GPU|NIC)\d+", t)]
    gpu_labels = [l for l in labels if l.startswith("GPU")]
    _check_count(len(gpu_labels), MAX_MACHINE_GPUS, "GPUs", source)
    _check_count(len(labels) - len(gpu_labels), MAX_NICS, "NICs", source)
    names = dict(re.findall(r"^GPU (\d+): (.+?)(?: \(UUID:.*)?$", text, re.M))
    rows = {}
    for line in lines[header + 1:]:
        words = line.split()
        if not words or words[0] not in gpu_labels:
            if words and words[0].startswith("Legend"):
                break
            continue
        cells = words[1:1 + len(labels)]
        if len(cells) < len(labels):
            raise TopologyError(f"{source}: row {words[0]} has {len(cells)} relations for {len(labels)} columns")
        if int(words[0][3:]) in rows:
            raise TopologyError(f"{source}: row {words[0]} appears twice; nvidia-smi writes one row per GPU")
        rows[int(words[0][3:])] = (dict(zip(labels, cells)), words[1 + len(labels):])
    if sorted(rows) != list(range(len(gpu_labels))):
        raise TopologyError(f"{source}: rows {sorted(rows)} do not match the columns {gpu_labels}")
    gpus, assumed = [], []
    for i, (cells, rest) in sorted(rows.items()):
        numa = int(rest[1]) if len(rest) > 1 and is_digits(rest[1]) else None
        gpus.append(SeenGPU(i, f"gpu{i}", names.get(str(i), "").strip() or "NVIDIA GPU", numa,
                            rest[0] if rest and rest[0] != "N/A" else None))
    if len(names) < len(gpus):
        assumed.append("GPU model: add `nvidia-smi -L` lines to the file to name it; the model table's default "
                       "stands for the unnamed GPUs")
    known, nvlinked = _relations(rows, source)
    levels = dict(known)
    for (i, j) in nvlinked:  # the closest level the pairs the text states allow (levels form a tree)
        bounds = [max(known[(min(i, k), max(i, k))], known[(min(j, k), max(j, k))]) for k in range(len(gpus))
                  if (min(i, k), max(i, k)) in known and (min(j, k), max(j, k)) in known]
        same_numa = gpus[i].numa == gpus[j].numa
        levels[(i, j)] = min(bounds) if bounds else LEVELS["PHB" if same_numa else "SYS"]
    if nvlinked:
        assumed.append("PCIe relation of NVLink pairs (the text shows only NV#): the closest the other pairs allow")
    _nvlinks_from_text(gpus, nvlinked, assumed)
    return _checked_sighting(Sighting("nvidia-smi topo -m", gpus, levels, assumed), source)


def _relations(rows: dict[int, tuple[dict, list]], source: str) -> tuple[dict, dict]:
    """Each GPU pair's PCIe level or NVLink count, (i, j) with i < j, from a square, symmetric matrix: X on the
    diagonal only, and the same relation read from either end."""
    known, nvlinked = {}, {}
    for i, (cells, _) in rows.items():
        for j in range(len(rows)):
            relation = cells[f"GPU{j}"]
            if (relation == "X") != (i == j):
                raise TopologyError(f"{source}: GPU{i} to GPU{j}: {relation!r}; nvidia-smi writes X on the diagonal "
                                    "only (a GPU has no link to itself)")
            if relation != rows[j][0][f"GPU{i}"]:
                raise TopologyError(f"{source}: GPU{i} to GPU{j} is {relation!r} but GPU{j} to GPU{i} is "
                                    f"{rows[j][0][f'GPU{i}']!r}; the two ends must agree")
            if i >= j:
                continue
            if relation.startswith("NV") and is_digits(relation[2:]):
                nvlinked[(i, j)] = _nvlink_count(int(relation[2:]), f"{source}: GPU{i} to GPU{j}")
            elif relation in LEVELS:
                known[(i, j)] = LEVELS[relation]
            else:
                raise TopologyError(f"{source}: GPU{i} to GPU{j}: unknown relation {relation!r} "
                                    f"(nvidia-smi writes X, NV#, {', '.join(LEVELS)})")
    return known, nvlinked


def _nvlinks_from_text(gpus: list[SeenGPU], nvlinked: dict[tuple[int, int], int], assumed: list[str]) -> None:
    """NV# pairs as direct links, or, where a GPU would need more links than it has, one NVSwitch for all."""
    from meshscale.topology.nvml_discovery import model_facts
    switched = False
    for g in gpus:
        total = sum(n for pair, n in nvlinked.items() if g.index in pair)
        has = model_facts(g.model)[0].get("nvlinks") or 18
        switched |= total > has
    for (i, j), n in nvlinked.items():
        if switched:
            for g in (gpus[i], gpus[j]):
                g.nvlinks_to_switches[ONE_SWITCH] = max(g.nvlinks_to_switches.get(ONE_SWITCH, 0), n)
        else:
            gpus[i].nvlinks_to_gpus[j] = n
            gpus[j].nvlinks_to_gpus[i] = n
    if switched:
        assumed.append("NVSwitches: one switch node stands for all of them (the text shows only NV# per pair)")


# ---- built by NVML discovery ----------------------------------------------------------------------------
class _Unsupported(Exception):
    pass


def _stand_in(sighting: Sighting):
    """An object answering the NVML calls discovery makes, from the sighting (anything else: unsupported)."""
    gpus = sighting.gpus
    by_bus = {g.bus_id: g for g in gpus}

    def links(g: SeenGPU) -> list[tuple[str, int]]:  # (remote bus, remote type) per NVLink
        out = []
        for peer, n in sorted(g.nvlinks_to_gpus.items()):
            out += [(gpus[peer].bus_id, 0)] * n
        for bus, n in sorted(g.nvlinks_to_switches.items()):
            out += [(bus, 2)] * n
        return out

    def level(a, b):
        return sighting.levels[(min(a.index, b.index), max(a.index, b.index))]

    def pcie(index):
        def get(g):
            if g.pcie is None:
                raise _Unsupported()
            return g.pcie[index]
        return get

    def link_of(g, k):
        all_links = links(g)
        if k >= len(all_links):
            raise _Unsupported()
        return all_links[k]

    return SimpleNamespace(
        NVMLError=_Unsupported, NVML_FEATURE_ENABLED=1, NVML_NVLINK_MAX_LINKS=max([18] + [len(links(g)) for g in gpus]),
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(gpus), nvmlDeviceGetHandleByIndex=lambda i: gpus[i],
        nvmlDeviceGetName=lambda g: g.model, nvmlDeviceGetPciInfo=lambda g: SimpleNamespace(busId=g.bus_id),
        nvmlDeviceGetNumaNodeId=lambda g: g.numa if g.numa is not None else -1,
        nvmlDeviceGetMaxPcieLinkGeneration=pcie(0), nvmlDeviceGetMaxPcieLinkWidth=pcie(1),
        nvmlDeviceGetTopologyCommonAncestor=level,
        nvmlDeviceGetNvLinkState=lambda g, k: link_of(g, k) and 1,
        nvmlDeviceGetNvLinkRemotePciInfo=lambda g, k: SimpleNamespace(busId=link_of(g, k)[0]),
        nvmlDeviceGetNvLinkRemoteDeviceType=lambda g, k: link_of(g, k)[1],
        by_bus=by_bus)


def build(sighting: Sighting, name: str, source: str = "") -> Topology:
    """The `Topology` NVML discovery builds from what the sighting says; its notes say what was assumed."""
    from meshscale.topology.nvml_discovery import nvml_topology
    found = nvml_topology(_stand_in(sighting), sm_counts={})
    for g in sighting.gpus:  # the CPU list the file gave (NVML's would be this process's machine)
        attrs = found.nodes[f"gpu{g.index}"].attrs
        attrs.pop("cpu_affinity", None)
        if g.cpu_affinity:
            attrs["cpu_affinity"] = g.cpu_affinity
    from meshscale.topology.nvml_discovery import FALLBACK_PCIE
    models = sorted({g.model for g in sighting.gpus})
    unsaid = [f"GPU{g.index}" for g in sighting.gpus if g.pcie is None]
    pcie = [f"PCIe {FALLBACK_PCIE[0]}.0 x{FALLBACK_PCIE[1]} for {', '.join(unsaid)} (the file gives no link speed)"] \
        if unsaid else []
    attrs = {"source": sighting.source, "bandwidth_source": "line rate from the file's links",
             "assumed": [*sighting.assumed, *pcie, *found.attrs.get("assumed", [])],
             "pcie_levels": found.attrs.get("pcie_levels", {})}
    title = f"{name}: {len(sighting.gpus)}x {', '.join(models)} (from {sighting.source})"
    # the checks a system file's YAML gets (every field's type and range, links between distinct nodes)
    from meshscale.topology.schema import from_dict, to_dict
    return from_dict(to_dict(Topology(name, found.nodes, found.links, title, attrs)), source or name)


# ---- writing the two formats (for tests and for users who want a dump of a catalog system) --------------
def to_topo_text(topology: Topology) -> str:
    """`nvidia-smi -L` lines, then the `nvidia-smi topo -m` matrix, as nvidia-smi prints them."""
    from meshscale.topology.text import relation_matrix
    names = [f"GPU {topology.nodes[g].index}: {topology.nodes[g].attrs.get('model', 'NVIDIA GPU')}"
             for g in topology.devices()]
    return "\n".join(names) + "\n" + relation_matrix(topology, bandwidth=False) + "\n"


def to_nccl_xml(topology: Topology) -> str:
    """The topology as NCCL dumps one (NCCL_TOPO_DUMP_FILE): CPUs, the PCIe tree, GPUs and their NVLinks."""
    gpus = topology.gpus()
    bus = {g: f"0000:{0x10 + topology.nodes[g].index:02x}:00.0" for g in gpus}
    bus.update({s: f"0000:{0xc0 + k:02x}:00.0" for k, s in enumerate(topology.nodes_of("nvswitch"))})
    root = ET.Element("system", version="1")
    done: set[str] = set()

    def children(node: str) -> list[str]:  # a Grace's GPUs on NVLink-C2C sit under it as PCIe GPUs would
        return sorted({other for link in topology.links if link.kind in ("pcie", "c2c") and node in (link.a, link.b)
                       for other in (link.a, link.b) if other != node and other not in done})

    def add(parent_xml, node: str) -> None:
        if node in done:  # reached twice (a GB300 GPU: under its Grace by C2C and its NIC's PCIe switch)
            return
        done.add(node)
        kind = topology.nodes[node].kind
        if kind == "pcie_switch":
            element = ET.SubElement(parent_xml, "pci", busid=f"0000:{0x80 + len(done):02x}:00.0", **{"class": BRIDGE_CLASS})
            for child in children(node):
                add(element, child)
        elif kind == "gpu":
            attrs = topology.nodes[node].attrs
            pcie = next((l for l in topology.links if l.kind == "pcie" and node in (l.a, l.b)), None)
            speed = {g: s for s, g in PCIE_GT_S.items()}.get(getattr(pcie, "generation", None) or 3)
            pci = ET.SubElement(parent_xml, "pci", busid=bus[node], link_speed=f"{speed} GT/s PCIe",
                                link_width=str(getattr(pcie, "width", None) or 16), **{"class": GPU_CLASS})
            sm = next((sm for key, sm in MODEL_SM if key in attrs.get("model", "")), 70)
            gpu = ET.SubElement(pci, "gpu", dev=str(attrs["index"]), sm=str(sm), rank=str(attrs["index"]), gdr="1")
            for link in topology.links:
                if link.kind == "nvlink" and node in (link.a, link.b):
                    other = link.b if link.a == node else link.a
                    tclass = GPU_CLASS if topology.nodes[other].kind == "gpu" else NVSWITCH_CLASS
                    ET.SubElement(gpu, "nvlink", target=bus[other], count=str(link.count), tclass=tclass)

    for k, cpu in enumerate(topology.nodes_of("cpu")):
        element = ET.SubElement(root, "cpu", numaid=str(topology.nodes[cpu].attrs.get("numa", k)), arch="x86_64")
        done.add(cpu)
        for child in children(cpu):
            if topology.nodes[child].kind in ("pcie_switch", "gpu"):
                add(element, child)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode") + "\n"
