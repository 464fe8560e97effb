"""`meshscale topo` and `meshscale systems`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from meshscale.cli.output import print_tables
from meshscale.cli.checks import checked, output_file
from meshscale.errors import MeshscaleError, check_choice
from meshscale.topology import dumps, load_catalog
from meshscale.topology.cluster import NETWORKS, cluster_spec, describe, plan_cluster, system_or_cluster
from meshscale.topology.discover import discover
from meshscale.topology.text import per_gpu_bandwidth, relation_matrix, summary
from meshscale.units import gbps
from meshscale.safe_io import atomic_write
from meshscale.validation import Range

FORMATS = ("matrix", "json", "svg", "png")


# one option object per cluster field, shared by every command that takes a cluster of a --system (plan, sim, topo;
# --network and --oversubscription also predict and cluster)
NODES_OPTION = typer.Option(None, "--nodes", help="a cluster of this many --system nodes (NCCL's model across nodes)",
                            callback=checked(Range(1, 1_000_000, integer=True)))
LINK_OPTION = typer.Option(None, "--link", help="cluster network: edr, hdr, ndr, 10gbe, 25gbe, 100gbe, 400gbe, or a "
                           "stated rate such as 25GB/s,5us")
NICS_OPTION = typer.Option(None, "--nics", help="network ports per node (default 4; 2 for Ethernet)",
                           callback=checked(Range(1, 64, integer=True)))
GPUDIRECT_OPTION = typer.Option(None, "--gpudirect/--no-gpudirect", help="GPUDirect RDMA between NICs and GPUs "
                                "(default on; NCCL uses it only through PCIe switches)")
NETWORK_OPTION = typer.Option(None, "--network", help=f"cluster network: {' or '.join(NETWORKS)} (default fat-tree; "
                              "rail: NIC k of every node on rail k's leaf switch)")
OVERSUBSCRIPTION_OPTION = typer.Option(None, "--oversubscription", callback=checked(Range(1, 1024)),
                                       help="leaf down-links per up-link, k for k:1 (default 1, non-blocking)")


def cluster_options(nodes: Optional[int] = None, link: Optional[str] = None, nics: Optional[int] = None,
                    gpudirect: Optional[bool] = None, network: Optional[str] = None,
                    oversubscription: Optional[float] = None) -> dict:
    """The cluster options of a command line, by `cluster_spec`'s names (None: not given)."""
    return {"nodes": nodes, "link": link, "nics": nics, "gpudirect": gpudirect, "network": network,
            "oversubscription": oversubscription}


def resolve_system(system: Optional[str], workers: Optional[int] = None, **cluster):
    """The topology a command works on: ``--system NAME|FILE`` (a cluster file, or a cluster of it with the
    `cluster_options`: ``--nodes``, ``--link``, ``--nics``, ``--gpudirect``, ``--network``, ``--oversubscription``),
    or this machine (with a notice if no GPU)."""
    if system:
        return system_or_cluster(system, **cluster), ""
    given = [f"--{k}" for k, v in cluster.items() if v is not None]
    if given:
        raise MeshscaleError(f"{', '.join(given)} describe a cluster of a node system; add --system NAME|FILE")
    found = discover(workers)
    return found.topology, found.notice


def topo(system: Optional[str] = typer.Option(None, "--system", "-s", help="catalog name or system file; default: this machine"),
         fmt: str = typer.Option("matrix", "--format", help="matrix, json, svg or png"),
         output: Optional[Path] = typer.Option(None, "--output", help="file to write (svg/png default: <name>.<format>)", callback=checked(output_file())),
         nodes: Optional[int] = NODES_OPTION,
         link: Optional[str] = LINK_OPTION,
         nics: Optional[int] = NICS_OPTION,
         gpudirect: Optional[bool] = GPUDIRECT_OPTION,
         network: Optional[str] = NETWORK_OPTION,
         oversubscription: Optional[float] = OVERSUBSCRIPTION_OPTION) -> None:
    """Show a system's topology: the nvidia-smi style matrix, JSON (loadable again), or a diagram. A cluster
    (a cluster file, or --nodes N): its summary, then one node's matrix."""
    check_choice(fmt, FORMATS, "format")
    cluster = cluster_options(nodes, link, nics, gpudirect, network, oversubscription)
    topology, notice = resolve_system(system, None, **cluster)
    if notice:
        typer.echo(notice, err=True)
    spec = cluster_spec(system, **cluster) if system else None
    if fmt == "matrix" and spec is not None:
        plan = plan_cluster(spec)
        node = plan.node_topology
        text = f"{describe(plan)}\n\none node:\n{summary(node)}\n\n{relation_matrix(node)}"
    elif fmt == "matrix":
        text = f"{summary(topology)}\n\n{relation_matrix(topology)}"
    elif fmt == "json":
        text = dumps(topology)
    else:
        from meshscale.topology.draw import default_output, draw
        path = output or default_output(topology, fmt)
        draw(topology, path)
        typer.echo(f"wrote {path}")
        return
    if output:
        atomic_write(output, text + "\n")
        typer.echo(f"wrote {output}")
    else:
        typer.echo(text)


def systems() -> None:
    """List the reference systems of the catalog."""
    table = Table(title="meshscale catalog (bandwidth per GPU, per direction)")
    for col in ("name", "GPUs", "GPU model", "NVLink GB/s", "PCIe GB/s", "description"):
        table.add_column(col, justify="right" if "GB/s" in col or col == "GPUs" else "left")
    for t in load_catalog():
        nvlink, pcie = per_gpu_bandwidth(t)
        table.add_row(t.name, str(len(t.gpus())), t.gpu_model, f"{gbps(nvlink):.0f}", f"{gbps(pcie):.1f}", t.title)
    print_tables(table)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the meshscale app."""
    app.command()(topo)
    app.command()(systems)
