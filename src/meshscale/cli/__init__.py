"""The `meshscale` command. Each layer's commands live in their own module here and stay thin: parse the
options, call one function, print. `MeshscaleError` becomes one line on stderr and exit code 2."""
from __future__ import annotations

import sys

import typer

from meshscale.cli import bench, collectives, predict, report, topology, train
from meshscale.errors import MeshscaleError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Know your GPU interconnect: topology, collectives, benchmarks, scaling and prediction.")
for module in (topology, bench, collectives, train, predict, report):
    module.register(app)


def main() -> None:
    """Entry point of the console script."""
    try:
        code = app(standalone_mode=False)
    except MeshscaleError as exc:
        print(f"meshscale: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("meshscale: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as exc:  # usage errors arrive here in non-standalone mode (click's, or typer's vendored copy)
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int):
            exc.show()
            sys.exit(exc.exit_code)
        if type(exc).__name__ == "Abort":
            sys.exit(130)
        raise
    if isinstance(code, int) and code:  # typer.Exit(n) comes back as the return value here
        sys.exit(code)
