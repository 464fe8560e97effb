"""Dump what NVML says about this machine's GPUs (links, P2P, PCIe, ancestors) as JSON: the raw facts that
meshscale's discovery turns into a Topology. Run on a GPU machine: python3 benchmarks/nvml_dump.py OUT.json"""
import json
import sys

import pynvml as N


def safe(fn, *args):
    try:
        v = fn(*args)
        return v.decode() if isinstance(v, bytes) else v
    except Exception as exc:  # NotSupported etc.
        return f"ERR:{type(exc).__name__}"


N.nvmlInit()
out = {"driver": safe(N.nvmlSystemGetDriverVersion), "nvml": safe(N.nvmlSystemGetNVMLVersion),
       "cuda_driver": safe(N.nvmlSystemGetCudaDriverVersion), "gpus": []}
count = N.nvmlDeviceGetCount()
handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
for i, h in enumerate(handles):
    pci = N.nvmlDeviceGetPciInfo(h)
    g = {"index": i, "name": safe(N.nvmlDeviceGetName, h), "uuid": safe(N.nvmlDeviceGetUUID, h),
         "bus_id": pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId,
         "memory_total": N.nvmlDeviceGetMemoryInfo(h).total,
         "pcie_gen_cur": safe(N.nvmlDeviceGetCurrPcieLinkGeneration, h),
         "pcie_gen_max": safe(N.nvmlDeviceGetMaxPcieLinkGeneration, h),
         "pcie_width_cur": safe(N.nvmlDeviceGetCurrPcieLinkWidth, h),
         "pcie_width_max": safe(N.nvmlDeviceGetMaxPcieLinkWidth, h),
         "numa": safe(N.nvmlDeviceGetNumaNodeId, h) if hasattr(N, "nvmlDeviceGetNumaNodeId") else None,
         "cpu_affinity": [int(x) for x in safe(N.nvmlDeviceGetCpuAffinity, h, 4)] if not isinstance(safe(N.nvmlDeviceGetCpuAffinity, h, 4), str) else None,
         "mig_mode": safe(N.nvmlDeviceGetMigMode, h), "links": [], "ancestor": {}, "p2p": {}}
    for link in range(18 if True else 0):
        state = safe(N.nvmlDeviceGetNvLinkState, h, link)
        if isinstance(state, str):
            g["links"].append({"link": link, "state": state})
            continue
        rp = safe(N.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
        g["links"].append({"link": link, "state": state, "version": safe(N.nvmlDeviceGetNvLinkVersion, h, link),
                           "remote_bus_id": (rp.busId.decode() if isinstance(rp.busId, bytes) else rp.busId) if not isinstance(rp, str) else rp,
                           "remote_type": safe(N.nvmlDeviceGetNvLinkRemoteDeviceType, h, link) if hasattr(N, "nvmlDeviceGetNvLinkRemoteDeviceType") else None})
    for j, h2 in enumerate(handles):
        if j != i:
            g["ancestor"][j] = safe(N.nvmlDeviceGetTopologyCommonAncestor, h, h2)
            g["p2p"][j] = {k: safe(N.nvmlDeviceGetP2PStatus, h, h2, getattr(N, k)) for k in
                           ("NVML_P2P_CAPS_INDEX_READ", "NVML_P2P_CAPS_INDEX_WRITE", "NVML_P2P_CAPS_INDEX_NVLINK")}
    out["gpus"].append(g)
json.dump(out, open(sys.argv[1], "w"), indent=1, default=str)
print(json.dumps(out, default=str)[:3000])
