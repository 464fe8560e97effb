"""`meshscale launch`: torchrun, run inside meshscale, so that a failed run ends with one line per failed rank."""
from __future__ import annotations

import os
import sys

import typer

from meshscale.errors import MeshscaleError, one_line

EPILOG = ("torchrun's options: `python -m torch.distributed.run --help`. Exit status: 0 when every rank finished; 2 "
          "when a rank failed (one line each, the first to fail first), the rendezvous failed or timed out, or the "
          "launcher was stopped (SIGTERM); 130 on Ctrl-C.")


def launch(ctx: typer.Context) -> None:
    """Run a meshscale command on every rank with torchrun's own agent: `meshscale launch TORCHRUN-OPTIONS --
    COMMAND ARGS`, e.g. `meshscale launch --standalone --nproc-per-node 2 -- train --steps 10`. Options,
    rendezvous and restarts are torchrun's; a rank that dies, stops or times out ends the run with one line per
    failed rank of this node (rank, host, exit code or signal, the rank's own error) instead of torchrun's error
    block; the stores of --standalone listen on 127.0.0.1 only. On each of 2 nodes: `meshscale launch --nnodes 2
    --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id JOB -- bench collective
    all_reduce`. The ranks' command is parsed here first, so a bad option is one error before any rank starts.
    LOGLEVEL=INFO shows torchrun's own log."""
    if ctx.args and ctx.args[0] in ("-h", "--help"):
        typer.echo(ctx.get_help())
        raise typer.Exit()
    if not ctx.args:
        raise MeshscaleError("launch: give torchrun's options and the command the ranks run, e.g. meshscale launch "
                             "--standalone --nproc-per-node 2 -- train --steps 10")
    # The agent's own C++ errors (a store it cannot reach, each with a C++ stack) would come before its one line:
    # off in this process (read when torch loads); the ranks keep the level they had.
    rank_env = {"TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}
    if "torch" not in sys.modules:
        os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    from meshscale.execute.elastic import failure_lines, plan_launch, run_launch
    from meshscale.topology.multinode import hostname

    plan = plan_launch(list(ctx.args), lambda command: _check_command(ctx, command), rank_env)
    failures = run_launch(plan, hostname())
    for line in failure_lines(failures):
        print(f"meshscale: error: {one_line(line)}", file=sys.stderr)
    if failures:
        raise typer.Exit(2)


def _check_command(ctx: typer.Context, command: list[str]) -> None:
    """The ranks' command parsed here first, as each rank will parse it (and train's and scale's configuration
    checked as each rank will check it): a bad option is one error before any rank starts, not one per rank."""
    group = ctx.parent.command if ctx.parent else None
    sub = group.get_command(ctx.parent, command[0]) if group is not None and command[0] != "launch" else None
    if sub is None:
        raise MeshscaleError(f"launch: {command[0]!r} is not a meshscale command; e.g. meshscale launch "
                             "--standalone --nproc-per-node 2 -- train --steps 10")
    from meshscale.cli.train import CHECKS_BEFORE_RANKS

    with sub.make_context(command[0], list(command[1:]), parent=ctx.parent) as parsed:
        check = CHECKS_BEFORE_RANKS.get(command[0])
        if check is not None:  # beyond the options' own checks: the model, the data, the values together
            check(command[0], dict(parsed.params))


def register(app: typer.Typer) -> None:
    app.command(short_help="Run a meshscale command on every rank under torchrun's agent",
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                  "allow_interspersed_args": False}, epilog=EPILOG,
                options_metavar="[TORCHRUN OPTIONS] -- COMMAND [ARGS]")(launch)
