"""`meshscale plan` (choose and explain the schedule of one collective) and `meshscale sim` (a predicted sweep
with `bench collective`'s columns)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from rich.table import Table

from meshscale.cli.output import print_tables, print_text, write_result_files
from meshscale.cli.checks import (FACTOR, MAX_GPU_RANKS, NCCL_ENV_OPTION, ROOT, checked, counts, output_file,
                                  size_bytes)
from meshscale.safe_io import atomic_write
from meshscale.validation import Range, word
from meshscale.cli.topology import (GPUDIRECT_OPTION, LINK_OPTION, NETWORK_OPTION, NICS_OPTION, NODES_OPTION,
                                    OVERSUBSCRIPTION_OPTION, PLACEMENT_OPTION, cluster_options)
from meshscale.collectives.kinds import SCHEDULABLE, schedulable
from meshscale.errors import MeshscaleError
from meshscale.units import gbps, parse_bytes, parse_ints

if TYPE_CHECKING:  # the simulator is imported when a command runs: `meshscale --help` stays quick
    from meshscale.simulate.fabric import Fabric
    from meshscale.simulate.nccl_env import NcclSettings


@dataclass(frozen=True)
class Scenario:
    """What a command predicts on: the fabric (`simulate.fabric.Fabric`) and the ranks of the call."""

    fabric: Fabric
    ranks: list[int]


def resolve_scenario(system: Optional[str], devices: Optional[str] = None, gpus: Optional[int] = None,
                     p2p: Optional[Path] = None, bench: Optional[Path] = None, cluster: Optional[dict] = None,
                     nccl: Optional[NcclSettings] = None, algo: str = "nccl") -> Scenario:
    """The `Scenario` of sim, plan and place: the fabric of the common options (`resolve_fabric`: the system or
    cluster, ``p2p`` and ``bench``'s calibration, NCCL's settings, the model ``algo``), its notices printed, then
    the ranks (``--devices``, or the first ``--gpus`` N, or all)."""
    from meshscale.collectives.algorithms.base import check_ranks
    from meshscale.simulate import fabric as fabrics  # looked up when called: tests watch the one resolution

    fabric = fabrics.resolve_fabric(system, cluster, p2p, bench, nccl, algo)
    topology = fabric.topology
    for notice in fabric.notices:
        typer.echo(notice, err=True)
    if devices and gpus is not None:
        raise MeshscaleError("give --devices (which devices) or --gpus (how many), not both")
    every = topology.device_indices()
    if devices:
        ranks = parse_ints(devices, "--devices (device indices)", minimum=0)
    elif gpus is not None:
        if not 2 <= gpus <= len(every):
            raise MeshscaleError(f"--gpus {gpus}: {topology.name} has {len(every)} GPUs; pick 2 to {len(every)}, "
                                 "or list devices with --devices")
        ranks = every[:gpus]
    else:
        ranks = every
    ranks = check_ranks(ranks, topology)
    if len(ranks) < 2:
        raise MeshscaleError(f"a collective needs at least 2 devices, got {ranks}; list more with --devices")
    return Scenario(fabric, ranks)


ALGO_HELP = ("nccl: NCCL's cost model and its pick per size; auto: meshscale's fastest schedule by flow simulation; "
             "or a meshscale schedule name")
NCCL_ALGO_HELP = "force NCCL's algorithm as NCCL_ALGO does: ring, tree, nvls, nvls_tree, collnet_direct, collnet_chain, pat"
NCCL_PROTO_HELP = "force NCCL's protocol as NCCL_PROTO does: LL, LL128, Simple"
NCCL_VERSION_HELP = "NCCL version whose cost model to use (default 2.28; 2.20, 2.18, 2.7, 1.6 families)"
NVLS_HELP = "NVLink SHARP on or off (NCCL_NVLS_ENABLE); default: on where the NVSwitches multicast"


def plan(collective: str = typer.Argument(..., help=", ".join(SCHEDULABLE)),
         system: Optional[str] = typer.Option(None, "--system", "-s", help="catalog name or system file; default: this machine"),
         devices: Optional[str] = typer.Option(None, "--devices", help="device indices, e.g. 0,1,2,3,7 (default: all)", callback=checked(counts(0))),
         gpus: Optional[int] = typer.Option(None, "--gpus", help="GPU count: the first N devices", callback=checked(Range(1, MAX_GPU_RANKS, integer=True))),
         nbytes: str = typer.Option("256M", "--bytes", help="size as nccl-tests counts it (8, 1K, 256M...)", callback=checked(size_bytes)),
         algo: str = typer.Option("auto", "--algo", help="auto (meshscale's fastest schedule by flow simulation) or a "
                                  "meshscale schedule name; NCCL's pick is shown beside it (force it with --nccl-algo)"),
         root: int = typer.Option(0, "--root", "-r", help="root rank (position among the devices) of rooted collectives", callback=checked(ROOT)),
         p2p: Optional[Path] = typer.Option(None, "--p2p", help="calibrate from a `bench p2p --json` file"),
         bench: Optional[Path] = typer.Option(None, "--bench", help="also fit to a measured all_reduce (`bench collective --json` file)"),
         nccl_algo: Optional[str] = typer.Option(None, "--nccl-algo", help=NCCL_ALGO_HELP),
         proto: Optional[str] = typer.Option(None, "--proto", help=NCCL_PROTO_HELP),
         nccl_version: Optional[str] = typer.Option(None, "--nccl-version", help=NCCL_VERSION_HELP),
         nvls: Optional[bool] = typer.Option(None, "--nvls/--no-nvls", help=NVLS_HELP),
         nccl_env: Optional[List[str]] = NCCL_ENV_OPTION,
         svg: Optional[Path] = typer.Option(None, "--svg", help="draw the schedule's channels on the topology (.svg/.png)", callback=checked(output_file((".svg", ".png")))),
         schedule_json: Optional[Path] = typer.Option(None, "--schedule", help="write the chosen schedule (JSON) here", callback=checked(output_file())),
         nodes: Optional[int] = NODES_OPTION,
         link: Optional[str] = LINK_OPTION,
         nics: Optional[int] = NICS_OPTION,
         gpudirect: Optional[bool] = GPUDIRECT_OPTION,
         network: Optional[str] = NETWORK_OPTION,
         oversubscription: Optional[float] = OVERSUBSCRIPTION_OPTION,
         placement: Optional[str] = PLACEMENT_OPTION,
         json_path: Optional[Path] = typer.Option(None, "--json", help="write the plan as a meshscale Result (kind plan)", callback=checked(output_file()))) -> None:
    """Choose meshscale's schedule for one collective and explain it (channels, predicted time and busbw,
    bottleneck, bound), beside what NCCL would pick and take."""
    from meshscale.simulate.models import ALGOS, check_algo
    from meshscale.simulate.nccl_env import nccl_settings
    from meshscale.simulate.plan import format_plan, plan as make_plan, plan_result

    collective = schedulable(collective).name
    check_algo(algo, ALGOS[1:])  # plan always shows NCCL's pick beside meshscale's: --algo names the schedule
    s = resolve_scenario(system, devices, gpus, p2p, bench, cluster_options(nodes, link, nics, gpudirect, network,
                         oversubscription, placement), nccl_settings(nccl_algo, proto, nccl_version, nvls, nccl_env), algo)
    p = make_plan(s.fabric, collective, s.ranks, parse_bytes(nbytes), root)
    print_text(format_plan(p))
    if schedule_json:
        from meshscale.collectives.schedule import dumps
        atomic_write(schedule_json, dumps(p.schedule) + "\n")
        typer.echo(f"wrote {schedule_json}")
    if json_path:
        typer.echo(f"wrote {plan_result(p).save(json_path)}")
    if svg:
        from meshscale.simulate.draw_plan import draw_plan
        typer.echo(f"wrote {draw_plan(p, svg)}")


def sim(collective: str = typer.Argument(..., help=", ".join(SCHEDULABLE)),
        system: Optional[str] = typer.Option(None, "--system", "-s", help="catalog name or system file; default: this machine"),
        devices: Optional[str] = typer.Option(None, "--devices", help="device indices, e.g. 0,1,2,3 (default: all)", callback=checked(counts(0))),
        gpus: Optional[int] = typer.Option(None, "--gpus", help="GPU count: the first N devices", callback=checked(Range(1, MAX_GPU_RANKS, integer=True))),
        min_bytes: str = typer.Option("1K", "--min-bytes", "-b", help="smallest size", callback=checked(size_bytes)),
        max_bytes: str = typer.Option("1G", "--max-bytes", "-e", help="largest size", callback=checked(size_bytes)),
        factor: int = typer.Option(2, "--factor", "-f", help="size multiplier between steps", callback=checked(FACTOR)),
        algo: str = typer.Option("nccl", "--algo", help=ALGO_HELP),
        nccl_algo: Optional[str] = typer.Option(None, "--nccl-algo", help=NCCL_ALGO_HELP),
        proto: Optional[str] = typer.Option(None, "--proto", help=NCCL_PROTO_HELP),
        nccl_version: Optional[str] = typer.Option(None, "--nccl-version", help=NCCL_VERSION_HELP),
        nvls: Optional[bool] = typer.Option(None, "--nvls/--no-nvls", help=NVLS_HELP),
        nccl_env: Optional[List[str]] = NCCL_ENV_OPTION,
        root: int = typer.Option(0, "--root", "-r", help="root rank of rooted collectives", callback=checked(ROOT)),
        p2p: Optional[Path] = typer.Option(None, "--p2p", help="calibrate from a `bench p2p --json` file"),
        bench: Optional[Path] = typer.Option(None, "--bench", help="also fit to a measured all_reduce (`bench collective --json` file)"),
        nodes: Optional[int] = NODES_OPTION,
        link: Optional[str] = LINK_OPTION,
        nics: Optional[int] = NICS_OPTION,
        gpudirect: Optional[bool] = GPUDIRECT_OPTION,
        network: Optional[str] = NETWORK_OPTION,
        oversubscription: Optional[float] = OVERSUBSCRIPTION_OPTION,
        placement: Optional[str] = PLACEMENT_OPTION,
        json_path: Optional[Path] = typer.Option(None, "--json", help="write the sweep (meshscale Result, kind sim)", callback=checked(output_file())),
        csv_path: Optional[Path] = typer.Option(None, "--csv", help="write the rows as CSV here", callback=checked(output_file()))) -> None:
    """Predicted sweep of one collective over sizes: the columns of `bench collective`, plus the algorithm chosen
    (by default NCCL's pick: algorithm/protocol and channels)."""
    from meshscale.simulate.models import check_algo
    from meshscale.simulate.nccl_env import nccl_settings
    from meshscale.simulate.params import SimParams
    from meshscale.simulate.plan import sim_sweep
    from meshscale.units import sweep_sizes

    collective = schedulable(collective).name
    check_algo(algo)
    s = resolve_scenario(system, devices, gpus, p2p, bench, cluster_options(nodes, link, nics, gpudirect, network,
                         oversubscription, placement), nccl_settings(nccl_algo, proto, nccl_version, nvls, nccl_env), algo)
    fabric, ranks = s.fabric, s.ranks
    topology, params = fabric.topology, fabric.params or SimParams()
    result = sim_sweep(fabric, collective, ranks, sweep_sizes(parse_bytes(min_bytes), parse_bytes(max_bytes), factor),
                       root)
    how = "NCCL's cost model" if algo == "nccl" else "schedule simulation"
    if "nccl_env" in fabric.nccl.given():
        how += " with " + fabric.nccl.env.describe()
    which = f"devices {ranks}" if len(ranks) <= 16 else f"{len(ranks)} devices ({ranks[0]}..{ranks[-1]})"
    table = Table(title=f"{collective} predicted on {topology.name}, {which} ({how}; {params.source})")
    for col in ("size(B)", "count", "type", "redop", "root", "time(us)", "algbw GB/s", "busbw GB/s", "bound GB/s", "algorithm"):
        table.add_column(col, justify="left" if col == "algorithm" else "right")
    for r in result.rows:
        bound = r["bound_busbw_bytes_per_s"]
        table.add_row(str(r["size_bytes"]), str(r["count"]), r["dtype"], r["redop"], str(r["root"]),
                      f"{r['time_s'] * 1e6:.2f}", f"{gbps(r['algbw_bytes_per_s']):.2f}", f"{gbps(r['busbw_bytes_per_s']):.2f}",
                      f"{gbps(bound):.1f}" if bound else "-", r["algorithm"])
    if topology.cluster is not None:
        table.caption = "bound: not computed across a cluster's nodes (its max-flow routes every pair of GPUs)"
    print_tables(table)
    write_result_files(result, json_path, csv_path)


def place(gpus: int = typer.Option(..., "--gpus", help="GPU count: how many GPUs the job needs (K)", callback=checked(Range(1, MAX_GPU_RANKS, integer=True))),
          free: Optional[str] = typer.Option(None, "--free", help="free device indices, e.g. 0,1,3,5 (default: all)"),
          system: Optional[str] = typer.Option(None, "--system", "-s", help="catalog name or system file; default: this machine"),
          nbytes: str = typer.Option("64M", "--bytes", help="all_reduce size to rank by (a gradient bucket)", callback=checked(size_bytes)),
          partition: Optional[str] = typer.Option(None, "--partition", help="place on slices of the GPUs: a MIG profile (3g.40gb) or a time-sliced share (1/4); --free and --gpus then count slices (slice k of GPU g is g x slices-per-GPU + k)", callback=checked(word)),
          slurm: bool = typer.Option(False, "--slurm", help="also print the chosen GPUs' gres.conf lines (cores, NVLinks) and srun binding options"),
          nccl_env: Optional[List[str]] = NCCL_ENV_OPTION,
          nodes: Optional[int] = NODES_OPTION,
          link: Optional[str] = LINK_OPTION,
          nics: Optional[int] = NICS_OPTION,
          network: Optional[str] = NETWORK_OPTION,
          json_path: Optional[Path] = typer.Option(None, "--json", help="write the ranking (meshscale Result, kind place)", callback=checked(output_file()))) -> None:
    """Name the best K-GPU subset of the free GPUs for a data-parallel job, by the all_reduce busbw NCCL's cost
    model predicts, with the runner-up and why; ends with a CUDA_VISIBLE_DEVICES= line for a scheduler prolog (one
    per host where the GPUs span several: a cluster's nodes, an NVL72 rack's compute trays)."""
    from meshscale.simulate.nccl_env import nccl_settings
    from meshscale.simulate.placement import placement_result, rank_placements, visible_devices, why

    s = resolve_scenario(system, nccl=nccl_settings(nccl_env=nccl_env),
                         cluster=cluster_options(nodes, link, nics, network=network))
    fabric = s.fabric
    topology, env = fabric.topology, fabric.nccl.given().get("nccl_env")
    if partition:
        from meshscale.topology.partitions import split_system
        topology, split = split_system(topology, partition)
        typer.echo(split.describe())
        typer.echo(f"slice k of GPU g is device g x {split.per_gpu} + k; CUDA_VISIBLE_DEVICES takes a MIG instance by "
                   "its UUID (nvidia-smi -L)" if split.kind == "mig" else f"slice k of GPU g is device g x {split.per_gpu} + k")
    size = parse_bytes(nbytes)
    listed = parse_ints(free, "--free (device indices)", minimum=0) if free is not None else None
    ranked = rank_placements(replace(fabric, topology=topology), gpus, listed, size)
    best = ranked[0]
    typer.echo(f"{gpus} of {topology.name}'s free GPUs: {len(ranked)} subsets ranked by predicted all_reduce busbw "
               f"at {nbytes} (NCCL's cost model{' with ' + env.describe() if env else ''})")
    for label, p in (("best", best), ("runner-up", ranked[1] if len(ranked) > 1 else None)):
        if p is not None:
            typer.echo(f"  {label + ':':<11} {','.join(map(str, p.devices)):<16} busbw {gbps(p.busbw_bytes_per_s):7.2f} GB/s  "
                       f"{p.rings}")
    for line in why(best, ranked[1] if len(ranked) > 1 else None):
        typer.echo(f"  why: {line}")
    if json_path:
        typer.echo(f"wrote {placement_result(topology, ranked, gpus, listed or [], size).save(json_path)}")
    if slurm:
        from meshscale.topology.slurm import gres_binding
        binding = gres_binding(topology, best.devices)
        typer.echo("gres.conf (Slurm) for the chosen GPUs:")
        for line in binding.gres_lines:
            typer.echo(f"  {line}")
        for note in binding.notes:
            typer.echo(f"  note: {note}")
        typer.echo("srun " + " ".join(binding.srun_options))
    for line in visible_devices(topology, best.devices):
        typer.echo(line)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the meshscale app."""
    app.command(short_help="Choose one collective's schedule beside NCCL's, and explain it")(plan)
    app.command(short_help="Predict a collective's sweep over sizes (bench's columns)")(sim)
    app.command(short_help="Name the best K GPUs for a data-parallel job")(place)
