"""`meshscale cluster` (size the network of a cluster of a system: a fat tree or rails) and `meshscale predict`
(training scaling). `meshscale validate` is cli/validate.py."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from meshscale.cli.output import print_tables, print_text, progress, write_result_files
from meshscale.cli.checks import BATCH, GLOBAL_BATCH, NCCL_ENV_OPTION, checked, counts, output_file
from meshscale.validation import Range as _Range
from meshscale.cli.topology import NETWORK_OPTION, OVERSUBSCRIPTION_OPTION
from meshscale.validation import Range
from meshscale.errors import MeshscaleError
from meshscale.results import Result
from meshscale.topology.limits import CLUSTER_RANGES
from meshscale.units import parse_ints


DEGREE = _Range(1, 1 << 20, integer=True)
CLUSTER_NODES = 124  # the DGX-1 whitepaper's cluster, when neither --nodes nor a cluster file says


def cluster(system: Optional[str] = typer.Option(None, "--system", "-s", help="a cluster file, or the catalog system (or file) of one node"),
            node: Optional[str] = typer.Option(None, "--node", help="catalog system (or file) of one node (default dgx1-p100)"),
            nodes: Optional[int] = typer.Option(None, "--nodes", help=f"number of nodes (default {CLUSTER_NODES})", callback=checked(CLUSTER_RANGES["nodes"])),
            nics: Optional[int] = typer.Option(None, "--nics", help="network ports per node (default 4; 2 for Ethernet)", callback=checked(CLUSTER_RANGES["nics"])),
            link: Optional[str] = typer.Option(None, "--link", help="edr, hdr, ndr, 10gbe, 25gbe, 100gbe, 400gbe, or a stated rate such as 25GB/s,5us"),
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
    print_tables(table)


def predict(model: Optional[str] = typer.Option(None, "--model", "-m", help="model name (meshscale.train registry)"),
            system: str = typer.Option("dgx1-p100", "--system", "-s", help="catalog system or file (a node for --nodes)"),
            gpus: Optional[str] = typer.Option(None, "--gpus", help="GPU counts on one system (default 1,2,4,8); with a layout, the one GPU count it runs on", callback=checked(counts(1, 1 << 20))),
            nodes: Optional[str] = typer.Option(None, "--nodes", help="node counts of a cluster (e.g. 1,2,4,...,124)", callback=checked(counts(1, 1_000_000))),
            link: Optional[str] = typer.Option(None, "--link", help="cluster network: edr, hdr, ndr, 10gbe, ... or a stated rate such as 25GB/s,5us (default edr; ndr for training layouts)"),
            nics: Optional[int] = typer.Option(None, "--nics", help="ports per node (default 4, 2 for Ethernet)", callback=checked(CLUSTER_RANGES["nics"])),
            gpudirect: bool = typer.Option(True, "--gpudirect/--no-gpudirect"),
            network: Optional[str] = NETWORK_OPTION,
            oversubscription: Optional[float] = OVERSUBSCRIPTION_OPTION,
            weak: bool = typer.Option(True, "--weak/--strong", help="fixed --batch per GPU, or a fixed --global-batch"),
            batch: Optional[int] = typer.Option(None, "--batch", help="batch per GPU (--weak, default 64); with a layout, per data-parallel rank (default 1)", callback=checked(BATCH)),
            global_batch: Optional[int] = typer.Option(None, "--global-batch", help="batch over all GPUs (--strong)", callback=checked(GLOBAL_BATCH)),
            mode: Optional[str] = typer.Option(None, "--mode", help="the train mode predicted: ddp (default), allreduce "
                                               "(its exchange: --framework horovod), ps-sync (modelled as one parameter "
                                               "server in host memory, after backward); ps-async is not modelled"),
            framework: Optional[str] = typer.Option(None, "--framework", help="how gradients are exchanged: ddp (25 MiB "
                                                    "buckets overlapped with backward), horovod (64 MiB fusion, overlapped), "
                                                    "cntk-2016 (one all-reduce per gradient after backward, NCCL 1.6); "
                                                    "default: the --mode's"),
            wire: Optional[str] = typer.Option(None, "--wire", help="gradients on the wire: fp32, bf16 or fp16 (default: the framework's)"),
            algo: str = typer.Option("nccl", "--algo", help="all-reduce algorithm: nccl (NCCL's pick per size: "
                                    "Ring, Tree, NVLS-Tree...), ring (NCCL_ALGO=Ring) or hierarchical (NCCL_ALGO=Tree)"),
            profile: Optional[Path] = typer.Option(None, "--profile", help="single-GPU profile (meshscale train --profile-batches --json); "
                                                   "default: a documented one for the model and GPU, else FLOPs"),
            efficiency: float = typer.Option(0.4, "--compute-efficiency", help="share of peak FLOPs without a profile", callback=checked(Range(0, 1, lo_open=True))),
            p2p: Optional[Path] = typer.Option(None, "--p2p", help="calibrate the link model from a `bench p2p --json` result"),
            bench: Optional[Path] = typer.Option(None, "--bench", help="also fit it to a measured all_reduce (`bench collective --json`)"),
            nccl_env: Optional[List[str]] = NCCL_ENV_OPTION,
            compare: Optional[str] = typer.Option(None, "--compare", help="algorithms | modes | frameworks | links | nvlink-pcie | SYS1,SYS2,..."),
            from_result: Optional[Path] = typer.Option(None, "--from", help="a measured `scale` result to predict beside"),
            partition: Optional[str] = typer.Option(None, "--partition", help="train on slices of the GPUs: a MIG profile "
                                                    "(3g.40gb) or a time-sliced vGPU share (1/4); --gpus counts slices"),
            plot: Optional[Path] = typer.Option(None, "--plot", help="write a PNG chart", callback=checked(output_file(plot=True))),
            json_out: Optional[Path] = typer.Option(None, "--json", help="save a Result (kind predict)", callback=checked(output_file())),
            csv_path: Optional[Path] = typer.Option(None, "--csv", help="write the rows as CSV here", callback=checked(output_file())),
            precision: Optional[str] = typer.Option(None, "--precision", help="fp32, bf16 or fp16 (as train's): the step model from the datasheet for this precision"),
            seq_len: Optional[int] = typer.Option(None, "--seq-len", help="tokens per sequence (default: the model's, at most 2048)", callback=checked(Range(1, 1 << 24, integer=True))),
            checkpointing: Optional[str] = typer.Option(None, "--activation-checkpointing", help="none, selective or full"),
            channels_last: bool = typer.Option(False, "--channels-last", help="channels-last memory format (images), as train's"),
            cuda_graph: bool = typer.Option(False, "--cuda-graph", help="the step replayed as one CUDA graph, as train's: no host cost per op"),
            attention: Optional[str] = typer.Option(None, "--attention", help="the attention kernel: sdpa (default: what PyTorch's SDPA picks, cuDNN's on Hopper and later, else FlashAttention-2), flash, cudnn, or triton (the 2022 FlashAttention in Triton, as llm-foundry's MPT)"),
            dp: Optional[int] = typer.Option(None, "--dp", help="replicated data-parallel degree", callback=checked(DEGREE)),
            fsdp: Optional[int] = typer.Option(None, "--fsdp", help="sharded data-parallel (FSDP2) degree (default: what the others leave)", callback=checked(DEGREE)),
            tp: Optional[int] = typer.Option(None, "--tp", help="tensor-parallel degree", callback=checked(DEGREE)),
            pp: Optional[int] = typer.Option(None, "--pp", help="pipeline stages", callback=checked(DEGREE)),
            pp_schedule: str = typer.Option("1f1b", "--pp-schedule", help="gpipe, 1f1b or interleaved-1f1b"),
            cp: Optional[int] = typer.Option(None, "--cp", help="context-parallel degree", callback=checked(DEGREE)),
            micro_batches: Optional[int] = typer.Option(None, "--micro-batches", help="micro-batches per step (default: the pipeline's stages)", callback=checked(DEGREE)),
            search: bool = typer.Option(False, "--search", help="rank every layout of the model on --gpus at --global-batch"),
            top: int = typer.Option(15, "--top", help="--search: layouts shown (the JSON has all)", callback=checked(Range(1, 1 << 20, integer=True)))) -> None:
    """Predict training throughput on a system or cluster (marked PREDICTED): data-parallel scaling sweeps, or
    with a layout (--precision, --dp/--fsdp/--tp/--pp/--cp, --seq-len, a transformer model) the per-layer step
    model, or --search for the best layout."""
    training = {"--precision": precision, "--seq-len": seq_len, "--activation-checkpointing": checkpointing,
                "--dp": dp, "--fsdp": fsdp, "--tp": tp, "--pp": pp, "--cp": cp, "--micro-batches": micro_batches,
                "--search": search or None, "--cuda-graph": cuda_graph or None, "--attention": attention}
    from meshscale.predict.training.request import is_training_model
    if model and (any(v is not None for v in training.values()) or not _in_train_registry(model)) \
            and is_training_model(model):
        _predict_layout(model, system, gpus, nodes, link, nics, batch, global_batch, seq_len, precision or "bf16",
                        checkpointing or "none", channels_last, {"dp": dp, "fsdp": fsdp, "tp": tp, "pp": pp, "cp": cp},
                        pp_schedule, micro_batches, search, top, profile, json_out, csv_path, cuda_graph,
                        attention or "sdpa")
        return
    given = [k for k, v in training.items() if v is not None]
    if given:
        raise MeshscaleError(f"{given[0]} is for the training step model: name a transformer (a preset or a "
                             "config.json), gpt-small/gpt-medium or a ResNet with --model")
    gpus = gpus or "1,2,4,8"
    batch = 64 if batch is None else batch
    from meshscale.predict.request import PredictRequest, predict_rows
    from meshscale.simulate.nccl_env import parse_nccl_env
    from meshscale.predict.scaling import prediction_result
    from meshscale.topology.cluster import cluster_file_spec, cluster_spec

    shape = {"network": network, "oversubscription": oversubscription}
    if cluster_file_spec(system) is not None:
        # a cluster file: its node, network and size (a sweep up to it unless --nodes says), its fields overridden by
        # the options given, as sim and plan take it
        spec = cluster_spec(system, None, link, nics, None if gpudirect else False, **shape)
        system, link, nics, gpudirect = spec.node, spec.link, spec.nics, spec.gpudirect
        nodes = nodes or ",".join(str(n) for n in sorted({*(2 ** k for k in range(spec.nodes.bit_length())), spec.nodes}))
        shape = {k: getattr(spec, k) for k in ("levels", "nodes_per_leaf", "radix", "oversubscription", "network")}
    elif not nodes and any(v is not None for v in shape.values()):
        raise MeshscaleError("--network and --oversubscription describe a cluster; add --nodes (e.g. 1,2,4,8) or "
                             "pass a cluster file")
    if partition and nodes:
        raise MeshscaleError("--partition splits the GPUs of one system; drop --nodes (slices of several nodes talk "
                             "over the network like whole GPUs)")
    link = link or "edr"
    if weak and global_batch is not None:
        raise MeshscaleError("--global-batch is for --strong scaling; --weak takes --batch (per GPU)")
    if not weak and global_batch is None:
        raise MeshscaleError("--strong needs --global-batch N (the batch over all GPUs)")
    with progress(f"predicting {model}" + (f" for each of --compare {compare}" if compare else "")):
        rows, job, measured = predict_rows(PredictRequest(
            model=model, system=system, gpus=tuple(parse_ints(gpus, "--gpus", minimum=1)),
            nodes=tuple(parse_ints(nodes, "--nodes", minimum=1)) if nodes else None, link=link, nics=nics,
            gpudirect=gpudirect, cluster_shape=shape, batch_per_gpu=batch, global_batch=global_batch, mode=mode,
            framework=framework, wire=wire, algo=algo, profile=profile, compute_efficiency=efficiency, p2p=p2p,
            bench=bench, compare=compare, measured=from_result, partition=partition,
            nccl_env=parse_nccl_env(nccl_env) if nccl_env else None))
    model = job.model
    if job.network_source:  # a measured multi-node all_reduce fitted the network
        typer.echo(job.network_source, err=True)
    if partition:
        from meshscale.topology import load_system
        from meshscale.topology.partitions import system_partition
        typer.echo(system_partition(load_system(system), partition).describe())
    title = f"{model}, " + (f"weak scaling, batch {batch} per GPU" if weak else f"strong scaling, global batch {global_batch}")
    if compare != "frameworks":
        title += f", {job.framework.name if job.framework else 'parameter server'}"
    title += f" ({job.network_source})" if job.network_source else ""
    if nccl_env:
        title += ", NCCL with " + " ".join(nccl_env)
    if measured:
        table = Table(title=f"{model}: measured vs PREDICTED")
        for c in ("GPUs", "mode", "batch/GPU", "measured/s", "predicted/s", "error"):
            table.add_column(c, justify="right")
        for r in rows:
            table.add_row(str(r["world_size"]), str(r["mode"]), str(r["batch_per_rank"]), f"{r['measured_samples_per_s']:,.1f}",
                          f"{r['predicted_samples_per_s']:,.1f}", f"{r['error']:+.1%}")
        print_tables(table)
    else:
        _print(rows, title, bool(compare))
        if plot:
            from meshscale import plots
            typer.echo(f"wrote {plots.save(plots.rows_scaling_chart(rows, title, predicted=True), plot)}")
    if json_out or csv_path:
        link = next((r["link"] for r in rows if r.get("link")), link)  # the fitted network's, where one was fitted
        write_result_files(prediction_result(rows, job, system=system, compare=compare, nodes=nodes, link=link,
                                             **({k: v for k, v in shape.items() if v is not None} if nodes else {})),
                           json_out, csv_path)


def _in_train_registry(model: str) -> bool:
    """Whether `meshscale train` knows ``model`` by name (its data-parallel sweep predicts those by default)."""
    from meshscale.predict.training.request import RESNETS, TRAIN_MODELS
    return model in RESNETS or model in TRAIN_MODELS or model == "small-cnn" or model.startswith("gpt-")


def _predict_layout(model, system, gpus, nodes, link, nics, batch, global_batch, seq_len, precision, checkpointing,
                    channels_last, degrees, pp_schedule, micro_batches, search, top, profile, json_out, csv_path,
                    cuda_graph=False, attention="sdpa") -> None:
    from meshscale.predict.training.report import layout_table, training_result
    from meshscale.predict.training.request import TrainingRequest, predict_training
    from meshscale.units import parse_ints

    counts_given = parse_ints(gpus, "--gpus", minimum=1) if gpus else []
    if len(counts_given) > 1:
        raise MeshscaleError(f"--gpus {gpus}: a training layout runs on one GPU count; give one number")
    node_counts = parse_ints(nodes, "--nodes", minimum=1) if nodes else []
    if len(node_counts) > 1:
        raise MeshscaleError(f"--nodes {nodes}: a training layout runs on one node count; give one number")
    if search and any(v is not None for v in degrees.values()):
        raise MeshscaleError("--search chooses --dp/--fsdp/--tp/--pp/--cp itself; drop them")
    req = TrainingRequest(model=model, system=system, gpus=counts_given[0] if counts_given else None,
                          nodes=node_counts[0] if node_counts else None, link=link, nics=nics,
                          batch=batch or 1, global_batch=global_batch, seq_len=seq_len, precision=precision,
                          checkpointing=checkpointing, channels_last=channels_last, degrees=degrees,
                          pp_schedule=pp_schedule, micro_batches=micro_batches, search=search, profile=profile,
                          cuda_graph=cuda_graph, attention=attention)
    predictions, gpu = predict_training(req)
    table, lines = layout_table(predictions[:top] if search else predictions, search=search,
                                hidden=len(predictions) - top if search else 0)
    print_tables(table)
    for line in lines:
        typer.echo(line)
    if json_out or csv_path:
        write_result_files(training_result(predictions, search=search), json_out, csv_path)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the meshscale app."""
    app.command()(cluster)
    app.command()(predict)
