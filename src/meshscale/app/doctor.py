"""`meshscale doctor`: the checks that NCCL troubleshooting advice (the "GPU & CUDA multi-machine
communication" write-up, 2020) and common failures point at, each a pass/warn/fail/info line with its fix.
Every check takes a `DoctorEnv` (`doctor_env.py`: paths, environment, NVML module, limits), so tests fake a
machine with no driver, a link down or a small /dev/shm; works with no GPU. The multi-node checks (GPU-NIC
affinity for GPUDirect RDMA, the peer-memory module, NUMA binding of the rank, NCCL's interface and adapter
selection, InfiniBand ports) say so as info when there is nothing to look at. `run_doctor` runs these, the
deployment checks (`deployment.py`) and the error and health counters (`health.py`)."""
from __future__ import annotations

import os

from meshscale.app.deployment import check_container, check_memlock, check_partitions, check_shm
from meshscale.app.doctor_env import Check, DoctorEnv, ib_devices, nvml_gpus, nvml_text
from meshscale.app.health import CHECKS as HEALTH_CHECKS
from meshscale.report.verdicts import expected_nvlinks
from meshscale.topology.nvml_discovery import cpu_list, mask_cpus
from meshscale.topology.nics import (RELATIONS, gpu_pci_path, infiniband_ports, interface_names, pci_relation,
                                     read_sysfs)
from meshscale.errors import MeshscaleError
from meshscale.units import is_digits

P2P_STATUS = {1: "chipset not supported", 2: "GPU not supported", 3: "IOH topology not supported",
              4: "disabled by registry key", 5: "not supported", 6: "unknown"}

# NCCL knobs: (what it does, whether setting it to a true value slows things down)
NCCL_KNOBS = {
    "NCCL_DEBUG": ("log level (WARN, INFO, TRACE); INFO prints the rings/trees and transports chosen", False),
    "NCCL_DEBUG_SUBSYS": ("which subsystems NCCL_DEBUG logs (INIT, NET, GRAPH...)", False),
    "NCCL_P2P_DISABLE": ("turns off GPU peer-to-peer over NVLink/PCIe: traffic goes through host memory", True),
    "NCCL_P2P_LEVEL": ("how far apart two GPUs may be for P2P (LOC, NVL, PIX, PXB, PHB, SYS)", False),
    "NCCL_SHM_DISABLE": ("turns off the shared-memory transport between processes of one node", True),
    "NCCL_IB_DISABLE": ("turns off InfiniBand/RoCE: NCCL falls back to TCP sockets across nodes", True),
    "NCCL_IB_HCA": ("which InfiniBand adapters (and ports) NCCL may use", False),
    "NCCL_NET_GDR_LEVEL": ("how close a NIC must be to a GPU for GPUDirect RDMA", False),
    "NCCL_SOCKET_IFNAME": ("which network interfaces NCCL uses for sockets and bootstrap", False),
    "NCCL_NVLS_ENABLE": ("NVLink SHARP (NVSwitch multicast); meshscale sets 0, multicast is off on these machines", False),
    "NCCL_ALGO": ("forces the algorithm (Ring, Tree, NVLS...) instead of NCCL's choice", True),
    "NCCL_PROTO": ("forces the protocol (LL, LL128, Simple) instead of NCCL's choice", True),
    "NCCL_MIN_NCHANNELS": ("lower bound on channels (parallel rings)", False),
    "NCCL_MAX_NCHANNELS": ("upper bound on channels (parallel rings); low values cap bandwidth", False),
    "NCCL_BUFFSIZE": ("size of the buffers between ranks", False),
    "NCCL_CUMEM_ENABLE": ("cuMem-based buffer allocation", False),
    "NCCL_TOPO_FILE": ("an XML topology file that overrides NCCL's discovery", False),
}


def check_driver(env: DoctorEnv) -> list[Check]:
    if env.nvml is None:
        return [Check("warn", "driver", f"no NVIDIA driver or NVML ({env.nvml_error or 'not found'}): meshscale will use "
                      "CPU workers over Gloo and the simulator",
                      "install the NVIDIA driver (nvidia-smi must work); in Docker run with --gpus all")]
    driver = nvml_text(env.nvml.nvmlSystemGetDriverVersion())
    return [Check("pass", "driver", f"NVIDIA driver {driver}, NVML present")]


def check_gpu_count(env: DoctorEnv) -> list[Check]:
    if env.nvml is None:
        return [Check("info", "gpus", "no GPU visible (see driver)")]
    gpus = nvml_gpus(env)
    if not gpus:
        return [Check("warn", "gpus", "the driver is loaded but sees no GPU", "check `nvidia-smi`; in a container pass --gpus all")]
    names = sorted({name for _, _, name in gpus})
    out = [Check("pass", "gpus", f"{len(gpus)} GPU(s): {', '.join(names)}")]
    versions = env.versions()
    if not versions.get("cuda"):
        out.append(Check("fail", "torch-cuda", f"torch {versions.get('torch')} is a CPU build on a machine with GPUs: "
                         "everything would run on the CPU", "install a CUDA build of PyTorch (or use the NGC container)"))
    elif versions.get("cuda_devices", len(gpus)) < len(gpus):
        out.append(Check("info", "cuda-visible", f"CUDA sees {versions['cuda_devices']} of {len(gpus)} GPUs "
                         f"(CUDA_VISIBLE_DEVICES={env.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"))
    return out


# nvmlDeviceGetNvLinkRemoteDeviceType: a GPU or an NVSwitch at the far end means the link has a peer
NVLINK_PEER_TYPES = (0, 2)
NVML_GPU_VIRTUALIZATION_MODE_NONE = 0


def _link_states(env: DoctorEnv, handle) -> tuple[int, int, bool]:
    """(links up, links down, whether any link's far end is a known GPU or NVSwitch) of one GPU."""
    nvml = env.nvml
    up = down = 0
    peer_known = False
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except Exception:  # links beyond what this GPU has raise "not supported"
            continue
        if state == 1:  # NVML_FEATURE_ENABLED
            up += 1
        else:
            down += 1
        try:
            peer_known |= nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link) in NVLINK_PEER_TYPES
        except Exception:  # an inactive link often has no remote end to report
            pass
    return up, down, peer_known


def virtual_machine(env: DoctorEnv) -> str:
    """Why this looks like a virtual machine ("" when it does not): NVML's virtualization mode of a GPU
    (passthrough, vGPU) or the hypervisor flag in /proc/cpuinfo."""
    for i, handle, _ in nvml_gpus(env):
        try:
            mode = env.nvml.nvmlDeviceGetVirtualizationMode(handle)
        except Exception:  # older drivers and fakes lack the call
            continue
        if mode != NVML_GPU_VIRTUALIZATION_MODE_NONE:
            return f"NVML reports GPU{i} virtualized (mode {mode})"
    try:
        flags = next((line for line in env.cpuinfo.read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return ""
    return "the CPU reports a hypervisor" if "hypervisor" in flags.split() else ""


def check_nvlink(env: DoctorEnv) -> list[Check]:
    """Links up against the model's count. A GPU with no link up and no peer behind any link (one GPU visible,
    a VM, a partition of a larger board) is told apart from links down on a multi-GPU board."""
    if env.nvml is None:
        return []
    gpus, out = nvml_gpus(env), []
    states = {i: _link_states(env, handle) for i, handle, _ in gpus}
    any_peer = any(up or peer for up, _, peer in states.values())
    vm = virtual_machine(env) if not any_peer or len(gpus) == 1 else ""
    for i, handle, name in gpus:
        up, down, _ = states[i]
        want = expected_nvlinks(name)
        no_peer = [why for why, holds in (("one GPU visible", len(gpus) == 1), (vm, bool(vm)),
                                          ("no link's far end is a GPU or NVSwitch", not any_peer)) if holds]
        if up == 0 and no_peer:  # no link up and nothing to link to: idle links, or none NVML reports (a VM)
            idle = f"{down} link(s) idle" if down else "NVML reports no NVLink state"
            out.append(Check("info", f"nvlink GPU{i}", f"NVLink inactive: no peer visible ({'; '.join(no_peer)}; "
                             f"{idle} on {name}): normal for one GPU, a VM or a partition",
                             "on a multi-GPU NVLink board, check `nvidia-smi nvlink -s` and that the fabric manager runs"))
        elif want is None:
            out.append(Check("info", f"nvlink GPU{i}", f"{up} NVLink(s) up ({name}: no fixed count for this model)"))
        elif up < want:
            out.append(Check("fail", f"nvlink GPU{i}", f"{up} of {want} NVLinks up on {name}: {want - up} down "
                             "(links down on a multi-GPU board)",
                             "check `nvidia-smi nvlink -s`; a down link halves a ring's bandwidth (reseat the GPU/bridge, "
                             "update the driver/fabric manager, or RMA)"))
        else:
            out.append(Check("pass", f"nvlink GPU{i}", f"{up} of {want} NVLinks up"))
    return out


def check_p2p(env: DoctorEnv) -> list[Check]:
    if env.nvml is None:
        return []
    gpus = nvml_gpus(env)
    if len(gpus) < 2:
        return []
    bad = []
    for i, a, _ in gpus:
        for j, b, _ in gpus:
            if i < j:
                status = env.nvml.nvmlDeviceGetP2PStatus(a, b, 0)  # NVML_P2P_CAPS_INDEX_READ
                if status != 0:
                    bad.append(f"GPU{i}-GPU{j} ({P2P_STATUS.get(status, status)})")
    if bad:
        return [Check("warn", "p2p", f"peer-to-peer unavailable for {len(bad)} pair(s): {', '.join(bad[:8])}"
                      + (" ..." if len(bad) > 8 else ""),
                      "copies between these GPUs go through host memory; enable ACS/IOMMU passthrough in the BIOS "
                      "or VM, or keep the job on GPUs that are P2P-capable")]
    return [Check("pass", "p2p", f"peer-to-peer available between all {len(gpus) * (len(gpus) - 1) // 2} GPU pairs")]


def check_pcie(env: DoctorEnv) -> list[Check]:
    if env.nvml is None:
        return []
    nvml, out = env.nvml, []
    for i, handle, _ in nvml_gpus(env):
        gen, max_gen = nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle), nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)
        width, max_width = nvml.nvmlDeviceGetCurrPcieLinkWidth(handle), nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)
        rates = _pcie_rates(gen, width, max_gen, max_width)
        if width < max_width:
            out.append(Check("warn", f"pcie GPU{i}", f"PCIe link runs x{width} of x{max_width}, gen {gen} of {max_gen}"
                             f"{rates}: trained down", "reseat the card or move it to a full-width slot; check the "
                             "riser and BIOS lane bifurcation"))
        elif gen < max_gen and _busy(env, handle):
            out.append(Check("warn", f"pcie GPU{i}", f"PCIe gen {gen} of {max_gen} (x{width}){rates} while the GPU "
                             "is busy (P0)", "check the slot, riser and the BIOS PCIe speed setting; reseat the card"))
        elif gen < max_gen:
            # GPUs lower the PCIe generation when idle to save power: only a loaded GPU says something.
            out.append(Check("info", f"pcie GPU{i}", f"PCIe gen {gen} of {max_gen} (x{width}); normal when idle",
                             "recheck while a benchmark runs; if it stays low, check the slot and BIOS PCIe speed"))
        else:
            out.append(Check("pass", f"pcie GPU{i}", f"PCIe gen {gen} x{width}"))
    return out


def _pcie_rates(gen: int, width: int, max_gen: int, max_width: int) -> str:
    """" (x GB/s of y GB/s per direction)", or "" for a generation or width the link table lacks."""
    from meshscale.topology.links import pcie_bandwidth
    try:
        now, full = pcie_bandwidth(gen, width), pcie_bandwidth(max_gen, max_width)
    except MeshscaleError:
        return ""
    return f" ({now / 1e9:.1f} GB/s of {full / 1e9:.1f} GB/s per direction)"


def _busy(env: DoctorEnv, handle) -> bool:
    """Whether the GPU runs at its top performance state (P0), where a low PCIe generation is no power saving."""
    try:
        return env.nvml.nvmlDeviceGetPerformanceState(handle) == 0
    except Exception:  # older drivers and fakes lack the call: assume idle, as before
        return False


def nccl_selects(spec: str, names: list[str]) -> list[str]:
    """The names an NCCL_SOCKET_IFNAME / NCCL_IB_HCA value selects, in NCCL's syntax: a comma list of prefixes,
    '^' before the list to exclude them, '=' before it (or an entry) for exact names; an entry 'dev:port'
    also names the port of names written 'dev:port'."""
    exclude = spec.startswith("^")
    spec = spec.removeprefix("^")
    exact = spec.startswith("=")
    parts = [p for p in spec.removeprefix("=").split(",") if p]

    def hit(name: str, part: str) -> bool:
        whole = exact or part.startswith("=")
        dev, _, port = part.removeprefix("=").partition(":")
        name_dev, _, name_port = name.partition(":")
        return (name_dev == dev if whole else name_dev.startswith(dev)) and (not port or port == name_port)

    return [n for n in names if any(hit(n, p) for p in parts) != exclude]


def check_nccl_env(env: DoctorEnv) -> list[Check]:
    out = []
    for var, value in sorted(env.environ.items()):
        if not var.startswith("NCCL_"):
            continue
        what, slows = NCCL_KNOBS.get(var, ("not a knob meshscale knows; see the NCCL documentation", False))
        status = "warn" if slows and value not in ("0", "") else "info"
        if var == "NCCL_IB_DISABLE" and not ib_devices(env):
            status = "info"  # no InfiniBand here, so nothing is lost
        fix = f"unset {var} unless you are debugging" if status == "warn" else ""
        if var == "NCCL_SOCKET_IFNAME":
            names = interface_names(env.net_dir)
            if not nccl_selects(value, names):
                status, fix = "fail", f"no interface matches; choose from {', '.join(names) or 'none found'}"
        if var == "NCCL_IB_HCA":
            status, fix = _ib_hca_selection(env, value, status)
        out.append(Check(status, var, f"={value}: {what}", fix))
    return out or [Check("pass", "nccl-env", "no NCCL_* variables set: NCCL's defaults apply")]


def _ib_hca_selection(env: DoctorEnv, value: str, status: str) -> tuple[str, str]:
    """(status, fix) of an NCCL_IB_HCA value against the InfiniBand ports that exist."""
    ports = {p.name.replace("/", ":"): p for p in infiniband_ports(env.ib_dir)}
    if not ports:
        return "warn", "no InfiniBand device here: unset NCCL_IB_HCA (NCCL will use sockets)"
    chosen = nccl_selects(value, list(ports))
    if not chosen:
        return "fail", f"no InfiniBand port matches; choose from {', '.join(ports)}"
    if not any(ports[c].usable for c in chosen):
        return "fail", f"every port it selects is down ({', '.join(chosen)}); select an ACTIVE one"
    return status, ""


def check_network(env: DoctorEnv) -> list[Check]:
    names = [n for n in interface_names(env.net_dir) if n != "lo"]
    described = []
    for n in names:
        speed = read_sysfs(env.net_dir / n / "speed", "?")
        speed = f", {int(speed) / 1000:g} Gb/s" if is_digits(speed.removeprefix("-")) and int(speed) > 0 else ""
        described.append(f"{n} ({read_sysfs(env.net_dir / n / 'operstate', '?')}{speed})")
    out = [Check("info", "network", f"interfaces: {', '.join(described) or 'none besides lo'}")]
    ib = ib_devices(env)
    if not ib:
        out.append(Check("info", "infiniband", "no InfiniBand device: across nodes NCCL would use TCP sockets",
                         "for multi-node training use InfiniBand/RoCE (check with `ibstat` and `ib_write_bw`)"))
    out += check_ib_ports(env)
    return out


def check_ib_ports(env: DoctorEnv) -> list[Check]:
    """Every InfiniBand port: ACTIVE, and at the rate of the fastest active port (a slow one caps NCCL's rings)."""
    ports = infiniband_ports(env.ib_dir)
    fastest = max((p.rate_gbits or 0 for p in ports if p.usable), default=0)
    out = []
    for p in ports:
        text = f"{p.state or '?'}, {p.rate_text or 'rate unknown'}" + (f", {p.link_layer}" if p.link_layer else "")
        if not p.usable:
            out.append(Check("warn", f"ib {p.name}", text, "check the cable and the subnet manager (`ibstat`, `sminfo`)"))
        elif p.rate_gbits and p.rate_gbits < fastest:
            out.append(Check("warn", f"ib {p.name}", f"{text}: slower than the fastest port ({fastest:g} Gb/s)",
                             "check the cable, transceiver and switch port speed (`ibstat`, `mlxlink -d DEV`); "
                             "a slow port caps every ring through it"))
        else:
            out.append(Check("pass", f"ib {p.name}", text))
    return out


def _gpu_bus_ids(env: DoctorEnv) -> list[tuple[int, str]]:
    return [(i, nvml_text(env.nvml.nvmlDeviceGetPciInfo(handle).busId)) for i, handle, _ in nvml_gpus(env)]


def check_gpudirect(env: DoctorEnv) -> list[Check]:
    """Each GPU's nearest RDMA NIC: GPUDirect RDMA (NIC reads GPU memory directly) needs it behind the same
    PCIe switch (PIX/PXB, NCCL_NET_GDR_LEVEL's default); farther, NCCL stages through host memory."""
    nics = [p for p in infiniband_ports(env.ib_dir) if p.pci_path]
    if env.nvml is None or not nics:
        what = "no GPU" if env.nvml is None else "no InfiniBand/RoCE NIC with a visible PCI path"
        return [Check("info", "gpudirect", f"{what}: GPU-NIC affinity for GPUDirect RDMA does not apply")]
    out = []
    for i, bus in _gpu_bus_ids(env):
        numa, path = gpu_pci_path(bus, env.sys_root)
        if not path:
            out.append(Check("info", f"gpudirect GPU{i}", f"PCI path of {bus} not visible in sysfs"))
            continue
        relation, nic = min(((pci_relation(path, numa, p.pci_path, p.numa), p.name) for p in nics),
                            key=lambda r: RELATIONS.index(r[0]))
        if relation in ("PIX", "PXB"):
            out.append(Check("pass", f"gpudirect GPU{i}", f"nearest NIC {nic} is {relation}: GPUDirect RDMA applies"))
        else:
            out.append(Check("warn", f"gpudirect GPU{i}", f"nearest NIC {nic} is {relation}: NCCL stages this GPU's "
                             "network traffic through host memory (GPUDirect RDMA needs PIX or PXB)",
                             "put a NIC under the GPU's PCIe switch, or bind the rank to a GPU that has one; "
                             "NCCL_NET_GDR_LEVEL=PHB lets NCCL try anyway"))
    return out


PEER_MEMORY_MODULES = ("nvidia_peermem", "nv_peer_mem")


def check_peermem(env: DoctorEnv) -> list[Check]:
    """The kernel module that lets the NIC pin GPU memory (GPUDirect RDMA), where there are GPUs and RDMA NICs."""
    if env.nvml is None or not ib_devices(env):
        what = "no GPU" if env.nvml is None else "no InfiniBand/RoCE device"
        return [Check("info", "peermem", f"{what}: the GPU peer-memory module does not apply")]
    try:
        loaded = {line.split()[0] for line in env.proc_modules.read_text().splitlines() if line.strip()}
    except OSError:
        return [Check("info", "peermem", f"{env.proc_modules} is not readable: cannot tell whether nvidia_peermem is loaded")]
    found = [m for m in PEER_MEMORY_MODULES if m in loaded]
    if found:
        return [Check("pass", "peermem", f"{found[0]} loaded: NICs can read and write GPU memory directly")]
    return [Check("warn", "peermem", "neither nvidia_peermem nor nv_peer_mem is loaded: GPUDirect RDMA is off and "
                  "NCCL stages network traffic through host memory (unless it uses DMA-BUF)",
                  "sudo modprobe nvidia_peermem (it ships with the driver; load it at boot via /etc/modules-load.d)")]


def check_numa_binding(env: DoctorEnv) -> list[Check]:
    """This rank's CPUs against its GPU's NUMA node (LOCAL_RANK's GPU): a rank on the far socket crosses the
    inter-socket link for every copy and launch."""
    if env.nvml is None:
        return [Check("info", "numa-binding", "no GPU: rank-to-NUMA binding does not apply")]
    gpus = {i: handle for i, handle, _ in nvml_gpus(env)}
    words = max(1, -(-(os.cpu_count() or 1) // 64))
    visible = [int(x) for x in env.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if is_digits(x.strip())]
    if "LOCAL_RANK" not in env.environ:
        return [Check("info", "numa-binding", "not a launched rank (no LOCAL_RANK): bind each rank to its GPU's CPUs",
                      "under torchrun, run each rank with `numactl --cpunodebind=N --membind=N` of its GPU's NUMA node")]
    local = int(env.environ["LOCAL_RANK"])
    index = visible[local] if local < len(visible) else local
    if index not in gpus:
        return [Check("info", "numa-binding", f"LOCAL_RANK {local} names no GPU of this machine (GPU{index})")]
    gpu_cpus = set(mask_cpus(list(env.nvml.nvmlDeviceGetCpuAffinity(gpus[index], words))))
    mine = set(env.cpu_affinity())
    try:
        node = str(env.nvml.nvmlDeviceGetNumaNodeId(gpus[index]))
    except Exception:  # older drivers lack the call; the CPU list still says where to bind
        node = "N"
    fix = (f"bind the rank to GPU{index}'s CPUs {cpu_list(gpu_cpus)}: `numactl --cpunodebind={node} "
           f"--membind={node}` (or `taskset -c {cpu_list(gpu_cpus)}`) before the rank's command")
    if not gpu_cpus:
        return [Check("info", "numa-binding", f"NVML gives no CPU affinity for GPU{index}")]
    if mine <= gpu_cpus:
        return [Check("pass", "numa-binding", f"rank {local} runs on CPUs {cpu_list(mine)}, GPU{index}'s own")]
    if not mine & gpu_cpus:
        return [Check("fail", "numa-binding", f"rank {local} runs on CPUs {cpu_list(mine)}, none of GPU{index}'s "
                      f"({cpu_list(gpu_cpus)}): every copy crosses sockets", fix)]
    return [Check("warn", "numa-binding", f"rank {local} may run on CPUs {cpu_list(mine)}, beyond GPU{index}'s "
                  f"({cpu_list(gpu_cpus)})", fix)]


def check_versions(env: DoctorEnv) -> list[Check]:
    v = env.versions()
    text = f"torch {v.get('torch')}, CUDA {v.get('cuda') or 'none (CPU build)'}, NCCL {v.get('nccl') or 'none'}"
    if not v.get("gloo"):
        return [Check("fail", "versions", text + ", no Gloo", "install a PyTorch build with torch.distributed")]
    return [Check("pass", "versions", text + ", Gloo available")]


def _deployment_checks(env: DoctorEnv) -> list[Check]:
    return check_container(env) + check_partitions(env)


CHECKS = (check_driver, check_gpu_count, check_nvlink, check_p2p, check_pcie, check_shm, check_memlock,
          check_nccl_env, check_network, check_gpudirect, check_peermem, check_numa_binding, check_versions,
          _deployment_checks)


def run_doctor(env: DoctorEnv | None = None) -> list[Check]:
    """Every check's lines, configuration then error and health counters (`app/health.py`). A check that
    itself breaks becomes a warn line, never a traceback."""
    env = env or DoctorEnv.real()
    out = []
    for check in (*CHECKS, *HEALTH_CHECKS):
        try:
            out += check(env)
        except Exception as exc:
            out.append(Check("warn", check.__name__.removeprefix("check_"), f"could not run ({type(exc).__name__}: {exc})"))
    return out


def summary(checks: list[Check]) -> str:
    """The closing line: how many checks passed, warned and failed (and were info)."""
    count = {status: sum(c.status == status for c in checks) for status in ("pass", "warn", "fail", "info")}

    def said(n: int, word: str) -> str:
        return f"{n} {word}{'' if n == 1 else 's'}"

    return (f"doctor: {count['pass']} passed, {said(count['warn'], 'warning')}, {said(count['fail'], 'failure')}, "
            f"{count['info']} info")
