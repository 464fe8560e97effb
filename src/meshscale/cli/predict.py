"""`meshscale cluster` (size the network of a cluster of a system: a fat tree or rails) and `meshscale predict`
(training scaling). `meshscale validate` is cli/validate.py."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from meshscale.cli.checks import checked, output_file
from meshscale.cli.declared import with_declared
from meshscale.cli.output import print_tables, print_text, progress, write_result_files
from meshscale.cli.topology import NETWORK_OPTION, OVERSUBSCRIPTION_OPTION
from meshscale.errors import MeshscaleError
from meshscale.options import option_fields
from meshscale.predict.question import PredictRequest
from meshscale.results import Result
from meshscale.topology.limits import CLUSTER_RANGES
from meshscale.validation import Range

CLUSTER_NODES = 124  # the DGX-1 whitepaper's cluster, when neither --nodes nor a cluster file says


def cluster(system: Optional[str] = typer.Option(None, "--system", "-s", help="a cluster file, or the catalog system (or file) of one node"),
            node: Optional[str] = typer.Option(None, "--node", help="catalog system (or file) of one node (default dgx1-p100)"),
            nodes: Optional[int] = typer.Option(None, "--nodes", help=f"number of nodes (default {CLUSTER_NODES})", callback=checked(CLUSTER_RANGES["nodes"])),
            nics: Optional[int] = typer.Option(None, "--nics", help="network ports per node (default: the node's own InfiniBand NICs, else 4; 2 for Ethernet)", callback=checked(CLUSTER_RANGES["nics"])),
            link: Optional[str] = typer.Option(None, "--link", help="edr, hdr, ndr, xdr, 10gbe, 25gbe, 100gbe, 400gbe, 800gbe, or a stated rate such as 25GB/s,5us"),
            levels: Optional[int] = typer.Option(None, "--levels", help="force 2 or 3 switch levels", callback=checked(CLUSTER_RANGES["levels"])),
            nodes_per_leaf: Optional[int] = typer.Option(None, "--nodes-per-leaf", callback=checked(CLUSTER_RANGES["nodes_per_leaf"])),
            radix: Optional[int] = typer.Option(None, "--radix", help="ports per switch (EDR default 36)", callback=checked(CLUSTER_RANGES["radix"])),
            oversubscription: Optional[float] = OVERSUBSCRIPTION_OPTION,
            gpudirect: Optional[bool] = typer.Option(None, "--gpudirect/--no-gpudirect", help="GPUDirect RDMA (default on)"),
            network: Optional[str] = NETWORK_OPTION,
            plot: Optional[Path] = typer.Option(None, "--plot", help="draw the network to this PNG", callback=checked(output_file(plot=True))),
            slurm_topology: Optional[str] = typer.Option(None, "--slurm-topology", help="write the network for Slurm's "
                                                         "topology/tree or topology/block plugin: tree or block"),
            slurm_file: Path = typer.Option(Path("topology.conf"), "--slurm-file", help="where --slurm-topology writes: "
                                            "topology.conf syntax, or topology.yaml syntax for a .yaml file",
                                            callback=checked(output_file((".conf", ".yaml", ".yml")))),
            slurm_nodes: str = typer.Option("node", "--slurm-nodes", help="host name prefix of the nodes (node000, node001, ...)"),
            json_out: Optional[Path] = typer.Option(None, "--json", help="save a Result (kind cluster)", callback=checked(output_file()))) -> None:
    """Size the network of a cluster of a system (a fat tree, or rails with --network rail): switches per level,
    hops between nodes, bandwidth, bisection, latency. A cluster file
    (``--system FILE``, as topo, plan, sim and predict take it) gives all of it; options override its fields."""
    from meshscale.topology.cluster import cluster_file_spec, cluster_spec, describe, plan_cluster
    if system and node:
        raise MeshscaleError("give the node system once: --system NAME|FILE or --node NAME")
    system = system or node or "dgx1-p100"
    if nodes is None and cluster_file_spec(system) is None:
        nodes = CLUSTER_NODES
    spec = cluster_spec(system, nodes, link, nics, gpudirect, levels=levels, nodes_per_leaf=nodes_per_leaf,
                        radix=radix, oversubscription=oversubscription, network=network)
    plan = plan_cluster(spec)
    figures = {
        "nodes": spec.nodes, "gpus": plan.world_size, "levels": plan.levels, "nodes_per_leaf": plan.nodes_per_leaf,
        "switch_radix": plan.radix, "switches_per_level": plan.switches, "max_nodes_at_these_levels": plan.max_nodes,
        "node_peak_bits_per_s": plan.node_peak_bits_per_s, "node_bandwidth_bytes_per_s": plan.node_bandwidth_bytes_per_s,
        "bisection_bytes_per_s": plan.bisection_bytes_per_s, "bisection_whitepaper_bytes_per_s": plan.bisection_whitepaper_bytes_per_s,
        "switch_hops": plan.switch_hops, "latency_s": plan.latency_s, "network": spec.network, "rails": plan.rails,
        "groups": plan.groups,
    }
    handoff = None
    if slurm_topology:  # before any output: a network Slurm's plugin cannot express is an error, not half a run
        from meshscale.topology.slurm import slurm_topology as for_slurm
        handoff = for_slurm(plan, slurm_topology, slurm_nodes)
    print_text(describe(plan))
    if handoff:
        from meshscale.topology.slurm import write_topology
        typer.echo(f"wrote {write_topology(handoff, slurm_file)} (Slurm topology/{handoff.kind})")
    if plot:
        from meshscale.topology.draw import draw_fat_tree
        typer.echo(f"wrote {draw_fat_tree(plan, plot)}")
    if json_out:
        Result("cluster", [figures], True, {"node": spec.node, "link": spec.link, "nics": spec.nics,
                                             "gpudirect": spec.gpudirect, "oversubscription": spec.oversubscription,
                                             "network": spec.network}
               ).save(json_out)
        typer.echo(f"wrote {json_out}")


def _print(rows: list[dict], title: str, compare: bool) -> None:
    table = Table(title=f"{title} - PREDICTED")
    cols = (["variant"] if compare else []) + ["GPUs", "nodes", "batch/GPU", "samples/s", "speedup", "efficiency",
                                               "compute ms", "exchange ms", "exposed ms", "comm share", "NCCL ran"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("variant", "NCCL ran") else "right")
    for r in rows:
        cells = [str(r["world_size"]), str(r["nodes"]), str(r["batch_per_rank"]), f"{r['throughput_samples_per_s']:,.1f}",
                 f"{r['speedup']:.2f}", f"{r['efficiency']:.0%}", f"{r['compute_s'] * 1e3:.1f}", f"{r['comm_s'] * 1e3:.1f}",
                 f"{r['comm_exposed_s'] * 1e3:.1f}", f"{r['comm_share']:.0%}", r.get("nccl_algo") or "-"]
        table.add_row(*([r.get("variant", "")] if compare else []) + cells)
    print_tables(table, identity=("variant", "GPUs"))


def _print_beside(rows: list[dict], model: str) -> None:
    table = Table(title=f"{model}: measured vs PREDICTED")
    for c in ("GPUs", "mode", "batch/GPU", "measured/s", "predicted/s", "error"):
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(str(r["world_size"]), str(r["mode"]), str(r["batch_per_rank"]), f"{r['measured_samples_per_s']:,.1f}",
                      f"{r['predicted_samples_per_s']:,.1f}", f"{r['error']:+.1%}")
    print_tables(table)


def _sweep_title(req, info) -> str:
    title = f"{info.model}, " + (f"weak scaling, batch {info.batch} per data-parallel rank" if info.weak
                                 else f"strong scaling, global batch {info.batch}")
    if req.compare != "frameworks":
        title += f", {info.framework}"
    title += f" ({info.network_source})" if info.network_source else ""
    if req.nccl_env:
        title += ", NCCL with " + " ".join(req.nccl_env.settings)
    if req.nccl_algo:
        title += f", NCCL_ALGO={req.nccl_algo}"
    return title


_PREDICT_FIELDS = list(option_fields(PredictRequest))


@with_declared(_PREDICT_FIELDS)
def predict(options: dict,
            top: Optional[int] = typer.Option(None, "--top", help="--search: layouts shown (default 15; the JSON has "
                                              "all)", callback=checked(Range(1, 1 << 20, integer=True, optional=True))),
            plot: Optional[Path] = typer.Option(None, "--plot", help="a sweep: write a PNG chart",
                                                callback=checked(output_file(plot=True))),
            json_out: Optional[Path] = typer.Option(None, "--json", help="save a Result (kind predict)",
                                                    callback=checked(output_file())),
            csv_path: Optional[Path] = typer.Option(None, "--csv", help="write the rows as CSV here",
                                                    callback=checked(output_file()))) -> None:
    """Predict training on a system or cluster (marked PREDICTED), by one step model: one layout on one GPU or
    node count (--dp/--fsdp/--tp/--pp/--cp), a scaling sweep (a list of counts, or none: powers of two up to a
    node), variants compared, --search for the best layout, or --from beside a measured `scale` run."""
    from meshscale.predict.answer import answer, shape_of

    req = PredictRequest(**{path[0]: value for path, value in options.items()})
    kind = shape_of(req)
    if top is not None and kind != "search":
        raise MeshscaleError("--top is for --search")
    if plot is not None and kind != "sweep":
        raise MeshscaleError("--plot draws a sweep (a list of --gpus or --nodes counts)")
    with progress(f"predicting {req.model or 'the measured run'}"):
        found = answer(req)
    for line in found.notices:
        typer.echo(line, err=True)
    if kind in ("layout", "search"):
        _print_layouts(found.predictions, kind == "search", top or 15, json_out, csv_path)
        return
    rows, info = found.rows, found.info
    if info.network_source:  # a measured multi-node all_reduce fitted the network
        typer.echo(info.network_source, err=True)
    if req.partition:
        from meshscale.topology import load_system
        from meshscale.topology.partitions import system_partition
        typer.echo(system_partition(load_system(req.system), req.partition).describe())
    if kind == "beside":
        _print_beside(rows, info.model)
    else:
        title = _sweep_title(req, info)
        _print(rows, title, bool(req.compare))
        if plot:
            from meshscale import plots
            typer.echo(f"wrote {plots.save(plots.rows_scaling_chart(rows, title, predicted=True), plot)}")
    if json_out or csv_path:
        from meshscale.predict.sweep import prediction_result
        write_result_files(prediction_result(rows, info, system=req.system, compare=req.compare), json_out, csv_path)


def _print_layouts(predictions, search: bool, top: int, json_out: Optional[Path], csv_path: Optional[Path]) -> None:
    from meshscale.predict.training.report import LAYOUT_IDENTITY, layout_table, training_result

    table, lines = layout_table(predictions[:top] if search else predictions, search=search,
                                hidden=len(predictions) - top if search else 0)
    print_tables(table, identity=LAYOUT_IDENTITY)
    for line in lines:
        typer.echo(line)
    if json_out or csv_path:
        write_result_files(training_result(predictions, search=search), json_out, csv_path)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the meshscale app."""
    app.command(short_help="Size a cluster's network: switches, hops, bandwidth, latency")(cluster)
    app.command(short_help="Predict training on a system or cluster (PREDICTED)")(predict)
