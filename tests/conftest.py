"""What many tests share: running the `meshscale` command (in this process, or as a real process), and one fake
NVML that discovery and doctor talk to instead of the driver."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner, Result

os.environ.setdefault("OMP_NUM_THREADS", "1")

FIXTURES = Path(__file__).parent / "fixtures"


# ---- markers ----------------------------------------------------------------------------------------------
def pytest_collection_modifyitems(config, items):
    """GPU tests run only where -m names them (`pytest -m gpu` on the device machine): left out of a plain run and
    of `-m "not slow"` alike, so that a developer's quick run (`pytest -m "not slow"`) and CI's (`pytest`, every
    test but the GPU ones) need no second -m, which would replace the first."""
    if "gpu" in (config.getoption("markexpr") or ""):
        return
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]


# ---- the CLI ----------------------------------------------------------------------------------------------
@pytest.fixture
def cli(monkeypatch):
    """``cli(*args)`` runs `meshscale ARGS` in this process through the console script's main(), so bad input
    ends as users see it (one line on stderr, exit code 2), captured by typer's CliRunner: the result has
    .exit_code, .stdout, .stderr, .output (both) and .exception."""
    from meshscale.cli import main

    def run(*args) -> Result:
        runner = CliRunner()
        monkeypatch.setattr(sys, "argv", ["meshscale", *map(str, args)])
        code, exception = 0, None
        with runner.isolation() as (stdout, stderr, output):
            try:
                main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                exception = exc if code else None
            except Exception as exc:  # a crash, as CliRunner reports it
                code, exception = 1, exc
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
            return Result(runner, stdout.getvalue(), stderr.getvalue(), output.getvalue(), None, code, exception)

    return run


def run_console_script(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    """`meshscale ARGS` as a separate process (where a real exit status or a fresh interpreter matters)."""
    script = "import sys; from meshscale.cli import main; sys.argv[0] = 'meshscale'; main()"
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def cli_process():
    """`run_console_script` as a fixture: ``cli_process(*args)`` gives .returncode, .stdout, .stderr."""
    return run_console_script


# ---- NVML -------------------------------------------------------------------------------------------------
class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


NVSWITCH_BUS = "FFFFFFFF:FF:FF.0"  # where recent drivers hide the NVSwitches


class FakeNVML:
    """The pynvml calls discovery and doctor make, answered from a machine description in the shape
    benchmarks/nvml_dump.py records (tests/fixtures/nvml_h200x2.json): driver versions and, per GPU, name, uuid,
    bus id, memory, PCIe link figures, NUMA node, CPU mask, MIG mode and instances, PCIe common-ancestor level
    and P2P status towards every other GPU, and its NVLinks (state, version, remote bus id and type).

    Handles are GPU indices; MIG handles are (gpu, slot). A value the description lacks, a recorded "ERR:..."
    or a function named in ``unsupported`` raises NVMLError_NotSupported; a link past a GPU's last raises
    NVMLError_InvalidArgument. Build one with `machine` (from a few parameters) or `from_dump`."""

    NVMLError = NVMLError
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_NVLINK_CAP_P2P_SUPPORTED = 0

    def __init__(self, description: dict, unsupported=(), init_error: str | None = None):
        self.driver, self.cuda_driver = description.get("driver"), description.get("cuda_driver")
        self.gpus = description["gpus"]
        self.unsupported = set(unsupported)
        self.init_error = init_error  # nvmlInit fails with this (no driver loaded, say)
        self.initialized = 0

    @classmethod
    def from_dump(cls, path=FIXTURES / "nvml_h200x2.json", **kw) -> "FakeNVML":
        return cls(json.loads(Path(path).read_text()), **kw)

    @classmethod
    def machine(cls, name="NVIDIA H200", gpus=8, paths=None, nvlinks=18, nvlink_version=6, links_down=None,
                p2p=None, pcie=(4, 16), pcie_now=None, mig=None, driver=b"570.133.20", unsupported=(),
                init_error=None) -> "FakeNVML":
        """A machine of ``gpus`` GPUs called ``name``.

        ``paths[i]``: GPU i's PCIe chain (cpu, host bridge, upper switch, leaf switch); common-ancestor levels,
        NUMA node, CPU mask (8 cores per socket) and P2P status (CNS across sockets) follow from it, so they are
        consistent like a real PCIe tree (default: every GPU on its own switches under socket 0).
        ``nvlinks``: links per GPU to NVSwitches, or {gpu: [(remote bus id, remote type), ...]}, or None.
        ``links_down``: {gpu: how many of its first links are down}. ``p2p``: {(a, b): status} overrides.
        ``pcie``: (generation, width) the links can do; ``pcie_now``: {gpu: (generation, width)} they run at.
        ``mig``: {gpu: MIG instances}. ``init_error``: nvmlInit fails with this message."""
        paths = paths if paths is not None else [("c0", "hb0", f"up{g}", f"leaf{g}") for g in range(gpus)]
        bus = [f"00000000:{0x18 + g:02X}:00.0" for g in range(len(paths))]
        if isinstance(nvlinks, int):
            nvlinks = {g: [(NVSWITCH_BUS, 2)] * nvlinks for g in range(len(paths))}
        socket = [int(p[0][-1]) for p in paths]
        out = []
        for g, path in enumerate(paths):
            now = (pcie_now or {}).get(g, pcie)

            def level(other):
                shared = next((k for k in range(4) if path[k] != paths[other][k]), 4)  # common prefix length
                return {0: 50, 1: 40, 2: 30, 3: 20, 4: 10}[shared]

            gpu = {"name": name, "uuid": f"GPU-0000000{g}-1111-2222-3333-444444444444", "bus_id": bus[g].encode(),
                   "memory_total": 80 << 30, "pcie_gen_cur": now[0], "pcie_gen_max": pcie[0],
                   "pcie_width_cur": now[1], "pcie_width_max": pcie[1], "numa": socket[g],
                   "cpu_affinity": [((1 << 8) - 1) << (8 * socket[g]), 0, 0, 0],
                   "mig_mode": [1, 1] if g in (mig or {}) else [0, 0],
                   "mig": [{"name": f"{name} MIG 1g.10gb", "uuid": f"MIG-{g}-{k}", "memory_total": 10 << 30}
                           for k in range((mig or {}).get(g, 0))],
                   "ancestor": {str(o): level(o) for o in range(len(paths)) if o != g},
                   "p2p": {str(o): (p2p or {}).get((g, o), 0 if socket[g] == socket[o] else 1)
                           for o in range(len(paths)) if o != g}}
            if nvlinks is not None:
                down = (links_down or {}).get(g, 0)
                gpu["links"] = [{"link": k, "state": 0 if k < down else 1, "version": nvlink_version,
                                 "remote_bus_id": remote.encode(), "remote_type": kind}
                                for k, (remote, kind) in enumerate(nvlinks.get(g, []))]
            out.append(gpu)
        return cls({"driver": driver, "cuda_driver": 12080, "gpus": out}, unsupported, init_error)

    def __getattribute__(self, name):
        if name.startswith("nvml") and name in object.__getattribute__(self, "unsupported"):
            def unsupported(*args):
                raise NVMLError_NotSupported(name)
            return unsupported
        return object.__getattribute__(self, name)

    def _get(self, handle, key):
        gpu = self.gpus[handle[0] if isinstance(handle, tuple) else handle]
        if isinstance(handle, tuple):
            gpu = gpu["mig"][handle[1]]
        value = gpu.get(key, "ERR:NotSupported")
        if isinstance(value, str) and value.startswith("ERR:"):
            raise NVMLError_NotSupported(f"{key}: {value[4:]}")
        return value

    def _link(self, h, link):
        links = self._get(h, "links")
        if link >= len(links):
            raise NVMLError_InvalidArgument("no such link")
        entry = links[link]
        if "version" not in entry:
            raise NVMLError_NotSupported("link not supported")
        return entry

    def nvmlInit(self):
        if self.init_error:
            raise NVMLError(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self): self.initialized -= 1
    def nvmlSystemGetDriverVersion(self): return self.driver
    def nvmlSystemGetCudaDriverVersion(self): return self.cuda_driver
    def nvmlDeviceGetCount(self): return len(self.gpus)
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetName(self, h): return self._get(h, "name")
    def nvmlDeviceGetUUID(self, h): return self._get(h, "uuid")
    def nvmlDeviceGetPciInfo(self, h): return SimpleNamespace(busId=self._get(h, "bus_id"))
    def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(total=self._get(h, "memory_total"))
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h): return self._get(h, "pcie_gen_cur")
    def nvmlDeviceGetMaxPcieLinkGeneration(self, h): return self._get(h, "pcie_gen_max")
    def nvmlDeviceGetCurrPcieLinkWidth(self, h): return self._get(h, "pcie_width_cur")
    def nvmlDeviceGetMaxPcieLinkWidth(self, h): return self._get(h, "pcie_width_max")
    def nvmlDeviceGetNumaNodeId(self, h): return self._get(h, "numa")
    def nvmlDeviceGetCpuAffinity(self, h, words): return self._get(h, "cpu_affinity")[:words]
    def nvmlDeviceGetMigMode(self, h): return self._get(h, "mig_mode")
    def nvmlDeviceGetMaxMigDeviceCount(self, h): return 7
    def nvmlDeviceGetTopologyCommonAncestor(self, a, b): return self._get(a, "ancestor")[str(b)]
    def nvmlDeviceGetNvLinkState(self, h, link): return self._link(h, link)["state"]
    def nvmlDeviceGetNvLinkVersion(self, h, link): return self._link(h, link)["version"]
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link): return self._link(h, link)["remote_type"]
    def nvmlDeviceGetNvLinkCapability(self, h, link, cap): return self._link(h, link) and 1  # P2P over it: yes

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link): return SimpleNamespace(busId=self._link(h, link)["remote_bus_id"])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, k):
        if k >= len(self._get(h, "mig")):
            raise NVMLError("Not Found")
        return (h, k)

    # error and health counters (doctor's health checks): absent keys are "not supported" on this GPU
    def _counter(self, h, key, index=None):
        """A counter's value; a list is a counter read several times (each read takes the next value)."""
        value = self._get(h, key)
        if index is not None:
            if index not in value:
                raise NVMLError_NotSupported(f"{key}[{index}]")
            value = value[index]
        if isinstance(value, list):
            return value.pop(0) if len(value) > 1 else value[0]
        return value

    def nvmlDeviceGetTotalEccErrors(self, h, kind, when): return self._counter(h, "ecc", (kind, when))
    def nvmlDeviceGetRemappedRows(self, h): return tuple(self._get(h, "remapped_rows"))
    def nvmlDeviceGetRetiredPages(self, h, cause): return list(self._get(h, "retired_pages")[cause])
    def nvmlDeviceGetRetiredPagesPendingStatus(self, h): return self._counter(h, "retired_pending")
    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter): return self._counter(h, "nvlink_errors", (link, counter))
    def nvmlDeviceGetPcieReplayCounter(self, h): return self._counter(h, "pcie_replay")
    def nvmlDeviceGetCurrentClocksEventReasons(self, h): return self._counter(h, "throttle")
    def nvmlDeviceGetPersistenceMode(self, h): return self._counter(h, "persistence")
    def nvmlDeviceGetPerformanceState(self, h): return self._counter(h, "pstate")

    def nvmlDeviceGetP2PStatus(self, a, b, cap):
        status = self._get(a, "p2p")[str(b)]
        # the dump recorded the WRITE capability (nvidia-ml-py defines READ's index as a tuple, which failed)
        return status["NVML_P2P_CAPS_INDEX_WRITE"] if isinstance(status, dict) else status
