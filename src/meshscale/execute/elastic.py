"""`meshscale launch`: torchrun's own elastic agent (rendezvous, restarts, worker monitoring), run in this process,
so that a failed run ends with one line per failed rank instead of torchrun's `ChildFailedError` block.

torchrun's options are read by torchrun's own parser (`torch.distributed.run.get_args_parser`) and turned into its
`LaunchConfig` by its own `config_from_args`; the agent is `launch_agent`. Each rank records its one-line error in
the error file torchrun gives it (TORCHELASTIC_ERROR_FILE, in torch's documented format), and the agent's
`ChildFailedError` carries that line back here with the rank's exit code or signal.

`--standalone` (and a single node with no endpoint, which torchrun treats alike) rendezvous through a store that
listens on 127.0.0.1 only: torchrun's c10d stores bind every interface whatever the endpoint says. The store is
made with `serving_store` and handed to torch's dynamic rendezvous through its documented handler registry.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import threading
import uuid
from pathlib import Path
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from meshscale.errors import Interrupted, MeshscaleError, one_line
from meshscale.execute.launcher import (first_line, loopback_interface, proc_state, resolve_host, serving_store,
                                        signal_name)
from meshscale.execute.world import LAUNCHER_REPORTS_ENV
from meshscale.safe_io import remove_stale_scratch
from meshscale.topology.limits import MAX_NODES
from meshscale.units import is_digits
from meshscale.validation import MAX_CPU_RANKS, MAX_CPU_RANKS_PER_CORE, max_cpu_ranks

LOOPBACK = "127.0.0.1"
LOOPBACK_BACKEND = "meshscale-loopback"   # torchrun's c10d rendezvous, its stores on loopback only
# what the ranks' command needs from us, so torchrun's options that name another program are refused
_OWN_OPTIONS = {"module": "-m/--module", "no_python": "--no-python", "run_path": "--run-path"}
# torchrun's log records (a banner about OMP_NUM_THREADS, one line per signal sent, the failure block): the
# summary replaces them; LOGLEVEL (torchrun's own variable) shows them again
_TORCH_LOGGERS = ("torch.distributed.run", "torch.distributed.launcher", "torch.distributed.elastic")
# Restarts of the whole group: each attempt leaves a folder per rank in the log folder, so the count bounds them
# (torchrun's default is 0; a run that failed 100 times in a row will not pass on the 101st).
MAX_RESTARTS = 100
NPROC_WORDS = ("auto", "cpu", "gpu")
RESOLVE_TIMEOUT_S = 10.0    # a name service that does not answer in 10 s will not answer the ranks either


@dataclass(frozen=True)
class RankFailure:
    """One failed rank as torchrun's agent saw it."""

    rank: int
    local_rank: int
    host: str
    exit_code: int          # negative: ended by that signal
    message: str            # the rank's own line (its error file), or "" when it left none
    after_rank: int | None = None   # ended by a signal, without a word, after this rank had failed first

    def cause(self) -> str:
        if self.exit_code >= 0:
            return f"exit code {self.exit_code}: {self.message or 'no message from it'}"
        name = signal_name(-self.exit_code)
        if self.after_rank is not None:
            return f"ended by {name} after rank {self.after_rank} failed (the launcher stops the others)"
        return f"killed by {name}{f': {self.message}' if self.message else ', no message from it'}"


def failure_lines(failures: list[RankFailure]) -> list[str]:
    """One line per failed rank, except that ranks which failed alike (the same host, exit and words: an option
    every rank refused, the ranks the launcher stopped) share one, in the order of the first of them."""
    groups: dict[tuple[str, str], list[RankFailure]] = {}
    for f in failures:
        groups.setdefault((f.host, f.cause()), []).append(f)
    lines = []
    for (host, cause), group in groups.items():
        ranks, local = _ranks_text([f.rank for f in group]), _ranks_text([f.local_rank for f in group])
        lines.append(f"rank{'s' if len(group) > 1 else ''} {ranks} (local {local}) on {host}: {cause}")
    return lines


def _ranks_text(ranks: list[int]) -> str:
    """``[0, 2, 3, 4, 7]`` as ``0, 2-4, 7``."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs)


@dataclass(frozen=True)
class LaunchPlan:
    """torchrun's config and the ranks' command, from `meshscale launch`'s arguments."""

    config: Any             # torch.distributed.launcher.api.LaunchConfig
    entrypoint: str
    entrypoint_args: list[str]
    rank_env: dict[str, str]  # variables the ranks get beside the agent's own
    own_log_dir: str | None  # a temporary folder for the ranks' error files, removed at the end


def plan_launch(tokens: list[str], check_command: Callable[[list[str]], None],
                rank_env: dict[str, str] | None = None) -> LaunchPlan:
    """torchrun's options before ``--`` (or before the first word that is not one of them), the meshscale
    subcommand after (given to ``check_command`` first); each refused with one line, leaving nothing behind.
    ``rank_env``: variables the ranks get beside the agent's environment."""
    import torch.distributed.run as torchrun

    remove_stale_scratch("launch")  # the error files' folders of launchers killed outright
    parser = torchrun.get_args_parser()

    def refuse(message: str) -> None:
        if "training_script" in message:  # argparse's name for the command torchrun runs
            message = ("give the meshscale command to run after `--`, e.g. meshscale launch --standalone "
                       "--nproc-per-node 2 -- train --steps 10")
        raise MeshscaleError(f"launch: {message.splitlines()[0] if message.strip() else 'bad torchrun options'}; "
                             "see `torchrun --help` for its options")

    parser.error = refuse  # argparse would print its usage and exit; one line instead
    if "--" in tokens:
        cut = tokens.index("--")
        options, command = tokens[:cut], tokens[cut + 1:]
        args = parser.parse_args([*options, "meshscale"])
        if args.training_script_args:  # a word before `--` that no option takes
            refuse(f"unexpected {args.training_script!r} before `--`")
    else:
        args = parser.parse_args(tokens)
        command = [args.training_script, *args.training_script_args]
    for dest, flag in _OWN_OPTIONS.items():
        if getattr(args, dest, False):
            refuse(f"{flag}: the ranks run the meshscale command after `--`; give no other program")
    if not command:
        refuse("training_script")
    try:
        nodes = torchrun.parse_min_max_nnodes(args.nnodes)
    except ValueError:
        refuse(f"--nnodes {args.nnodes!r}: give a number of nodes or MIN:MAX")
    _check_sizes(args, nodes, refuse)
    check_command(command)
    args.module, args.no_python, args.run_path = True, False, False
    args.training_script, args.training_script_args = "meshscale", command
    own_log_dir = None
    if not args.log_dir:  # made by the agent when it starts, removed when it ends (or by the next run if killed)
        own_log_dir = args.log_dir = os.path.join(tempfile.gettempdir(),
                                                  f"meshscale-launch-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    rank_env = {**(rank_env or {}), LAUNCHER_REPORTS_ENV: "1"}
    try:
        try:
            if _standalone_on_loopback(args, torchrun, refuse) and "GLOO_SOCKET_IFNAME" not in os.environ:
                rank_env["GLOO_SOCKET_IFNAME"] = loopback_interface()  # Gloo's sockets on loopback too
            _check_endpoint(args)
            with _torch_logs_quiet():
                config, entrypoint, entrypoint_args = torchrun.config_from_args(args)  # makes the log folder
        except (AssertionError, ValueError, TypeError) as exc:
            refuse(str(exc))
        if config.nproc_per_node < 1:
            refuse(f"--nproc-per-node {config.nproc_per_node}: need at least 1")
        if not config.monitor_interval > 0:
            refuse(f"--monitor-interval {config.monitor_interval}: need a positive number of seconds")
    except MeshscaleError:
        _remove(own_log_dir)
        raise
    return LaunchPlan(config, entrypoint, list(entrypoint_args), rank_env, own_log_dir)


def _check_sizes(args: Any, nodes: tuple[int, int], refuse: Callable[[str], None]) -> None:
    """Ranks, nodes and restarts within what this machine and meshscale's limits allow, before anything is made
    (each rank, and each restart of it, gets its own folder of files)."""
    if not (0 < nodes[0] <= nodes[1] <= MAX_NODES):
        refuse(f"--nnodes {args.nnodes}: give 1 to {MAX_NODES:,} nodes (meshscale's limit on a cluster's nodes), MIN "
               "not above MAX")
    ranks = local_ranks(str(args.nproc_per_node), refuse)
    most, why = local_rank_limit()
    if ranks > most:
        refuse(f"--nproc-per-node {args.nproc_per_node}: {ranks:,} ranks on this machine, above its limit of "
               f"{most:,} ({why})")
    args.nproc_per_node = str(ranks)
    if not 0 <= args.max_restarts <= MAX_RESTARTS:
        refuse(f"--max-restarts {args.max_restarts}: give 0 to {MAX_RESTARTS} (each restart leaves every rank's "
               "files; a run that failed that often will not pass)")


def local_ranks(text: str, refuse: Callable[[str], None]) -> int:
    """torchrun's --nproc-per-node as a number: digits, or auto, cpu or gpu as torchrun reads them."""
    if is_digits(text):
        if int(text) < 1:
            refuse(f"--nproc-per-node {text}: need at least 1")
        return int(text)
    if text not in NPROC_WORDS:
        refuse(f"--nproc-per-node {text!r}: give a number of ranks, or {', '.join(NPROC_WORDS)}")
    gpus = _gpu_count()
    if text == "gpu" and not gpus:
        refuse("--nproc-per-node gpu: this machine has no GPU; give a number of ranks or cpu")
    return gpus if text == "gpu" or (text == "auto" and gpus) else (os.cpu_count() or 1)


def _gpu_count() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def local_rank_limit() -> tuple[int, str]:
    """The most ranks one machine starts, and why: one per GPU, or as many CPU workers as `--cpus` allows."""
    gpus, cpu = _gpu_count(), max_cpu_ranks()
    cpu_why = (f"{MAX_CPU_RANKS_PER_CORE} CPU workers per core, {os.cpu_count() or 1} cores, at most "
               f"{MAX_CPU_RANKS}")
    return (gpus, f"one rank per GPU, {gpus} GPUs") if gpus > cpu else (cpu, cpu_why)


def _check_endpoint(args: Any) -> None:
    """The rendezvous endpoint's host resolves (within `RESOLVE_TIMEOUT_S`), so a misspelt name is one line now
    rather than a rendezvous that waits out its timeout."""
    if args.rdzv_backend == LOOPBACK_BACKEND:
        return
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    option = "--rdzv-endpoint" if args.rdzv_endpoint else "--master-addr"
    endpoint = args.rdzv_endpoint or (f"{args.master_addr}:{args.master_port}" if args.rdzv_backend == "static" else "")
    if not endpoint:
        return
    try:
        host, port = parse_rendezvous_endpoint(endpoint, default_port=29400)
    except ValueError as exc:
        raise MeshscaleError(f"launch: {option} {one_line(endpoint)}: {first_line(exc)}; give HOST:PORT") from None
    resolve_host(host, port, RESOLVE_TIMEOUT_S, f"launch: {option} {one_line(endpoint)}")


def _standalone_on_loopback(args: Any, torchrun: Any, refuse: Callable[[str], None]) -> bool:
    """What torchrun's `run` does for --standalone (and one node without an endpoint), with the loopback store;
    True when the run stays on this machine."""
    one_node = (args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None
                and torchrun.parse_min_max_nnodes(args.nnodes)[1] == 1)
    if args.standalone and torchrun.parse_min_max_nnodes(args.nnodes)[0] > 1:
        refuse(f"--standalone --nnodes {args.nnodes}: --standalone runs on this machine alone (its rendezvous "
               "listens on 127.0.0.1), so no other node could join; for several nodes give --rdzv-backend c10d "
               "--rdzv-endpoint HOST:PORT that every node reaches")
    if args.standalone or one_node:
        _register_loopback_backend()
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = LOOPBACK_BACKEND, f"{LOOPBACK}:0", str(uuid.uuid4())
        args.local_addr = getattr(args, "local_addr", None) or LOOPBACK  # the ranks' address of the agent's store
    if args.master_port is None:
        args.master_port = 29500
    return args.rdzv_backend == LOOPBACK_BACKEND


def _register_loopback_backend() -> None:
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    rendezvous_handler_registry.register(LOOPBACK_BACKEND, loopback_rendezvous)  # the same function: idempotent


def loopback_rendezvous(params: Any) -> Any:
    """torch's c10d dynamic rendezvous for one machine, both of its stores listening on 127.0.0.1 only: the
    rendezvous store and the one the agent serves to its ranks (`_create_tcp_store_server`, a method of torch's
    handler since 2.4, checked here)."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, create_handler

    if not callable(getattr(DynamicRendezvousHandler, "_create_tcp_store_server", None)):
        raise MeshscaleError("launch --standalone: this torch's rendezvous has no hook for its ranks' store "
                             "(DynamicRendezvousHandler._create_tcp_store_server); use torch 2.4 or newer")

    class LoopbackBackend(C10dRendezvousBackend):
        name = LOOPBACK_BACKEND  # the registry checks that the handler's backend is the one asked for

    timeout_s = params.get_as_int("read_timeout", 60)
    store = serving_store(LOOPBACK, 0, params.max_nodes, timeout_s)
    handler = create_handler(store, LoopbackBackend(store, params.run_id), params)
    handler._create_tcp_store_server = lambda addr, port: serving_store(addr, port, params.max_nodes, timeout_s)
    return handler


def run_launch(plan: LaunchPlan, host: str) -> list[RankFailure]:
    """Run torchrun's agent; [] when every rank finished, else the failed ranks, the first to fail first.
    A rendezvous that fails or times out, or a signal to this process, is one line (`MeshscaleError`)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (RendezvousClosedError, RendezvousConnectionError,
                                                          RendezvousError, RendezvousTimeoutError)
    from torch.distributed.launcher.api import launch_agent

    config = plan.config
    try:
        with _torch_logs_quiet(), _env(plan.rank_env), _stopped_ranks_continued():
            launch_agent(config, plan.entrypoint, plan.entrypoint_args)
        return []
    except ChildFailedError as exc:
        return rank_failures(exc, host)
    except SignalException as exc:
        if exc.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise Interrupted(f"launch: stopped by {signal_name(exc.sigval)}; every rank was stopped") from None
    except RendezvousError as exc:
        cause = exc.__cause__ or exc  # torch's connection error says "see inner exception"
        if isinstance(exc, RendezvousTimeoutError):
            join_s = config.rdzv_configs.get("join_timeout", 600)  # torch's default
            why = (f"timed out: fewer than {config.min_nodes} nodes joined within {join_s} s "
                   "(--rdzv-conf join_timeout=SECONDS)")
        elif isinstance(exc, RendezvousConnectionError):
            why = (f"was lost or never reached: the launcher serving it ended (its ranks failed: see its node's "
                   f"lines) or cannot be reached ({type(cause).__name__}: {first_line(cause)}); this node's ranks, "
                   "if any, were stopped")
        elif isinstance(exc, RendezvousClosedError):
            why = ("was closed by another node's launcher (its ranks failed: see its node's lines); this node's ranks "
                   "were stopped")
        else:
            why = f"failed ({type(cause).__name__}: {first_line(cause)})"
        raise MeshscaleError(f"launch: rendezvous {config.rdzv_backend} at {config.rdzv_endpoint or 'this host'} "
                             f"(run {config.run_id}) on {host} {why}") from None
    except MeshscaleError:
        raise
    except Exception as exc:  # whatever else torch's agent raises: the environment, said in one line
        raise MeshscaleError(f"launch: torchrun's agent on {host} failed ({type(exc).__name__}: "
                             f"{first_line(exc)})") from None
    finally:
        _remove(plan.own_log_dir)


def rank_failures(exc: Any, host: str) -> list[RankFailure]:
    """One `RankFailure` per rank in torch's `ChildFailedError`, the first to fail first, then by rank."""
    first, _ = exc.get_first_failure()
    failures = []
    for rank, f in exc.failures.items():
        message = _error_file_message(f)
        # the agent stops the others with SIGTERM, and SIGKILL where that does not end them (a stopped rank)
        stopped = rank != first and not message and -f.exitcode in (signal.SIGTERM, signal.SIGKILL)
        failures.append(RankFailure(rank, f.local_rank, host, f.exitcode, message, first if stopped else None))
    return sorted(failures, key=lambda r: (r.rank != first, r.rank))


def _error_file_message(failure: Any) -> str:
    """The rank's own line from its error file: meshscale's (a string) or torch's `@record` (a mapping)."""
    if not os.path.isfile(str(failure.error_file)):
        return ""
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    text = str(message).strip()
    return one_line(text.splitlines()[0][:2000]) if text else ""  # a rank's words, shown escaped


@contextmanager
def _stopped_ranks_continued(period_s: float = 0.5) -> Iterator[None]:
    """While the block runs, a rank stopped (SIGSTOP, SIGTSTP) with a SIGTERM pending is continued so that it
    takes the SIGTERM: the agent stops the ranks that way once one fails, and would otherwise wait a fixed 30 s
    before its SIGKILL. A rank stopped while the run goes on is left stopped."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(period_s):
            for pid in _children():
                if proc_state(pid) == "T" and _sigterm_pending(pid):
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except OSError:
                        pass

    thread = threading.Thread(target=watch, daemon=True, name="meshscale-continue-stopped")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _children() -> list[int]:
    """The process ids of this process's children (those of every thread), from /proc."""
    pids: list[int] = []
    for task in Path("/proc/self/task").glob("*"):
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return pids


def _sigterm_pending(pid: int) -> bool:
    """True when SIGTERM waits to be delivered to ``pid`` (/proc/PID/status: SigPnd, ShdPnd)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    bit = 1 << (signal.SIGTERM - 1)
    return any(line.split(":")[0] in ("SigPnd", "ShdPnd") and int(line.split()[1], 16) & bit
               for line in text.splitlines())


@contextmanager
def _torch_logs_quiet() -> Iterator[None]:
    """torchrun's log records off within the block (unless LOGLEVEL asks for them)."""
    if os.environ.get("LOGLEVEL"):
        yield
        return
    # torch's elastic modules each set their logger's own level (get_logger): every one is turned off
    names = [n for n in logging.root.manager.loggerDict if n.startswith(_TORCH_LOGGERS)]
    loggers = [logging.getLogger(name) for name in {*_TORCH_LOGGERS, *names}]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


@contextmanager
def _env(variables: dict[str, str]) -> Iterator[None]:
    """``variables`` in this process's environment (the agent copies it to the ranks) within the block."""
    previous = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _remove(folder: str | None) -> None:
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
