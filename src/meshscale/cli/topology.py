"""`meshscale topo` and `meshscale systems`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from meshscale.cli.output import print_tables, progress
from meshscale.cli.checks import checked, output_file
from meshscale.errors import MeshscaleError, check_choice
from meshscale.topology.fabric import PLACEMENT_HELP
from meshscale.topology.limits import CLUSTER_RANGES
from meshscale.units import gbps
from meshscale.safe_io import atomic_write

FORMATS = ("matrix", "json", "svg", "png")
# topology.cluster.NETWORKS, spelled out so that -h does not import the topology layer (a test holds them equal)
NETWORKS = ("fat-tree", "rail")


# one option object per cluster field, shared by every command that takes a cluster of a --system (plan, sim, topo;
# --network and --oversubscription also predict and cluster)
NODES_OPTION = typer.Option(None, "--nodes", help="a cluster of this many --system nodes (NCCL's model across nodes)",
                            callback=checked(CLUSTER_RANGES["nodes"]))
LINK_OPTION = typer.Option(None, "--link", help="cluster network: edr, hdr, ndr, xdr, 10gbe, 25gbe, 100gbe, 400gbe, 800gbe, or a "
                           "stated rate such as 25GB/s,5us")
NICS_OPTION = typer.Option(None, "--nics", help="network ports per node (default: the node's own InfiniBand NICs, else 4; 2 for Ethernet)",
                           callback=checked(CLUSTER_RANGES["nics"]))
GPUDIRECT_OPTION = typer.Option(None, "--gpudirect/--no-gpudirect", help="GPUDirect RDMA between NICs and GPUs "
                                "(default on; NCCL uses it through PCIe switches or a Grace's NVLink-C2C)")
NETWORK_OPTION = typer.Option(None, "--network", help=f"cluster network: {' or '.join(NETWORKS)} (default fat-tree; "
                              "rail: NIC k of every node on rail k's leaf switch)")
PLACEMENT_OPTION = typer.Option(None, "--placement", help=PLACEMENT_HELP)
OVERSUBSCRIPTION_OPTION = typer.Option(None, "--oversubscription", callback=checked(CLUSTER_RANGES["oversubscription"]),
                                       help="leaf down-links per up-link, k for k:1 (default 1, non-blocking)")


def cluster_options(nodes: Optional[int] = None, link: Optional[str] = None, nics: Optional[int] = None,
                    gpudirect: Optional[bool] = None, network: Optional[str] = None,
                    oversubscription: Optional[float] = None, placement: Optional[str] = None) -> dict:
    """The cluster options of a command line, by `cluster_spec`'s names (None: not given)."""
    return {"nodes": nodes, "link": link, "nics": nics, "gpudirect": gpudirect, "network": network,
            "oversubscription": oversubscription, "placement": placement}


def resolve_system(system: Optional[str], workers: Optional[int] = None, **cluster):
    """The topology a command works on and its notice: `resolve_topology` (``--system NAME|FILE`` with the
    `cluster_options`, or this machine)."""
    from meshscale.simulate.fabric import resolve_topology
    return resolve_topology(system, workers, **cluster)


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
    from meshscale.topology import dumps
    from meshscale.topology.cluster import cluster_spec, describe, plan_cluster
    from meshscale.topology.text import relation_matrix, summary
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
        with progress(f"drawing {topology.name} as {fmt}"):
            draw(topology, path)
        typer.echo(f"wrote {path}")
        return
    if output:
        atomic_write(output, text + "\n")
        typer.echo(f"wrote {output}")
    else:
        typer.echo(text)


def systems(schema: bool = typer.Option(False, "--schema", help="print the JSON Schema of a system file and exit"),
            template: Optional[str] = typer.Option(None, "--template", help="print catalog system NAME as an annotated "
                                                   "system file to edit (docs/systems.md)")) -> None:
    """List the reference systems of the catalog; or print the system file format (--schema) or a file to
    start from (--template NAME). --system also reads an NCCL topology dump (.xml) and `nvidia-smi topo -m` text."""
    if schema or template:
        import json
        from meshscale.topology.json_schema import system_schema, template as annotated
        if schema and template:
            raise MeshscaleError("--schema and --template each print a whole file; give one")
        typer.echo(json.dumps(system_schema(), indent=2) if schema else annotated(template), nl=schema)
        return
    from meshscale.topology import load_catalog
    from meshscale.topology.text import per_gpu_bandwidth
    table = Table(title="meshscale catalog (bandwidth per GPU, per direction)")
    for col in ("name", "GPUs", "GPU model", "NVLink GB/s", "PCIe GB/s", "description"):
        table.add_column(col, justify="right" if "GB/s" in col or col == "GPUs" else "left")
    for t in load_catalog():
        nvlink, pcie = per_gpu_bandwidth(t)
        table.add_row(t.name, str(len(t.gpus())), t.gpu_model, f"{gbps(nvlink):.0f}", f"{gbps(pcie):.1f}", t.title)
    print_tables(table)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the meshscale app."""
    app.command(short_help="Show a system's topology: the matrix, JSON or a diagram")(topo)
    app.command(short_help="List the catalog's systems, or a system file to start from")(systems)
