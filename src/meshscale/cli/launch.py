"""`meshscale launch`: torchrun, run inside meshscale, so that a failed run ends with one line per failed rank."""
from __future__ import annotations

import sys

import typer

EPILOG = ("Exit status: 0 when every rank finished; 2 when a rank failed (one line each, the first to fail first), "
          "the rendezvous failed or timed out, or the launcher was stopped (SIGTERM); 130 on Ctrl-C.")


def launch(ctx: typer.Context) -> None:
    """Run a meshscale command on every rank with torchrun's own agent (its options, rendezvous, restarts):
    `meshscale launch \\[torchrun options] -- COMMAND \\[ARGS]`, e.g. `meshscale launch --standalone
    --nproc-per-node 2 -- train --steps 10`, or on each of 2 nodes `meshscale launch --nnodes 2 --nproc-per-node 8
    --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id JOB -- bench collective all_reduce`. A rank that
    dies, stops or times out ends the run with one line per failed rank of this node (rank, host, exit code or
    signal, and the rank's own error), instead of torchrun's error block. --standalone's stores listen on
    127.0.0.1 only. LOGLEVEL=INFO shows torchrun's own log."""
    from meshscale.execute.elastic import plan_launch, run_launch
    from meshscale.topology.multinode import hostname

    if not ctx.args or ctx.args[0] in ("-h", "--help"):
        typer.echo(ctx.get_help())
        raise typer.Exit()
    commands = set(ctx.parent.command.list_commands(ctx.parent)) if ctx.parent else set()
    failures = run_launch(plan_launch(list(ctx.args), commands), hostname())
    for failure in failures:
        print(f"meshscale: error: {failure.line()}", file=sys.stderr)
    if failures:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                  "allow_interspersed_args": False}, epilog=EPILOG,
                options_metavar="[TORCHRUN OPTIONS] -- COMMAND [ARGS]")(launch)
