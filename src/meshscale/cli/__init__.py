"""The `meshscale` command. Each layer's commands live in their own module here and stay thin: parse the
options, call one function, print. `MeshscaleError` becomes one line on stderr and exit code 2.
"""
from __future__ import annotations

import errno
import os
import sys

# torch's C++ warnings (a store connection lost, with its C++ stack) arrive before meshscale's one line says what
# happened; errors still show. Read when torch loads, so set before anything imports it; the user's value wins.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import typer  # noqa: E402

from meshscale.cli import bench, collectives, fleet, launch, predict, report, topology, train, validate  # noqa: E402
from meshscale.cli.checks import strict_numbers  # noqa: E402
from meshscale.errors import MeshscaleError, WorkerError, one_line  # noqa: E402
from meshscale.execute.world import tell_launcher  # noqa: E402
from meshscale.safe_io import new_outputs_removed_on  # noqa: E402

MAX_ERROR_CHARS = 2000  # the one line of an error: a value quoted from a file is cut, never the line split

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Know your GPU interconnect: topology, collectives, benchmarks, scaling and prediction.")


def version_text() -> str:
    """`meshscale X.Y.Z`, from the installed package's metadata (a source checkout says so)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return f"meshscale {version('meshscale')}"
    except PackageNotFoundError:
        return "meshscale (not installed: run from a source checkout)"


def _print_version(value: bool) -> None:
    if value:
        print(version_text())
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                          help="Print meshscale's version and exit.")) -> None:
    """Know your GPU interconnect: topology, collectives, benchmarks, scaling and prediction."""


for module in (topology, bench, collectives, train, predict, validate, report, fleet, launch):
    module.register(app)


def main() -> None:
    """Entry point of the console script."""
    try:
        # bad input found late: none of the files it began; a failed run keeps the finished part it saved
        with new_outputs_removed_on(MeshscaleError, unless=WorkerError):
            code = strict_numbers(typer.main.get_command(app))(standalone_mode=False)
        sys.stdout.flush()  # a full disk or a closed pipe behind stdout shows here, not at exit
    except MeshscaleError as exc:
        line = one_line(str(exc))
        line = line if len(line) <= MAX_ERROR_CHARS else line[:MAX_ERROR_CHARS - 3] + "..."
        if not tell_launcher(line):  # under `meshscale launch` the launcher prints it, with the rank's host
            print(f"meshscale: error: {line}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("meshscale: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        raise
    except OSError as exc:  # the environment refused (stdout on a full disk, no file descriptors left...)
        _stop_writing_stdout()
        if exc.errno == errno.EPIPE:  # `meshscale ... | head`: the reader has what it wanted
            sys.exit(141)
        where = f" ({exc.filename})" if exc.filename else ""
        hint = {errno.EMFILE: "; raise the limit of open files (ulimit -n 1024 or more)",
                errno.ENOSPC: "; free space where meshscale writes (stdout, the output files, the temporary folder)"}
        print(f"meshscale: error: {exc.strerror or exc}{where}{hint.get(exc.errno, '')}", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:  # usage errors arrive here in non-standalone mode (click's, or typer's vendored copy)
        if callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int):
            if type(exc).__name__ == "NoArgsIsHelpError":  # a bare `meshscale` or group: its help, as -h shows it
                exc.show()
                sys.exit(exc.exit_code)
            print(f"meshscale: error: {one_line(usage_error_line(exc))}", file=sys.stderr)
            sys.exit(2)
        if type(exc).__name__ == "Abort":
            sys.exit(130)
        raise
    if isinstance(code, int) and code:  # typer.Exit(n) comes back as the return value here
        sys.exit(code)


def usage_error_line(exc: Exception) -> str:
    """The parser's complaint (an unknown command or option, a missing or extra argument, a bad value) as
    meshscale's one line: the command it was in, the complaint, and where the command's options are listed,
    in place of click's usage block."""
    ctx = getattr(exc, "ctx", None)
    if ctx is None:  # the option parser's own complaints (an option without its value) come without a command
        return exc.format_message()
    words = []
    while ctx.parent is not None:  # the root's name is argv[0]; the user typed `meshscale`
        words.insert(0, ctx.info_name)
        ctx = ctx.parent
    where = f"{' '.join(words)}: " if words else ""
    return f"{where}{exc.format_message()} ('{' '.join(['meshscale', *words])} -h' lists what it takes)"


def _stop_writing_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit does not fail a second time."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass
