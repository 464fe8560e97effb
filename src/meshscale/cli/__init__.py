"""The `meshscale` command. Each layer's commands live in their own module here and stay thin: parse the
options, call one function, print. `MeshscaleError` becomes one line on stderr and exit code 2.

Renamed and removed spellings live in one table, `RENAMED`, checked before typer parses the command line, so an
old spelling gets a one-line hint (exit 2) instead of typer's usage error or, worse, a new meaning.
"""
from __future__ import annotations

import errno
import fnmatch
import os
import sys

# torch's C++ warnings (a store connection lost, with its C++ stack) arrive before meshscale's one line says what
# happened; errors still show. Read when torch loads, so set before anything imports it; the user's value wins.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import typer  # noqa: E402

from meshscale.cli import bench, collectives, fleet, launch, predict, report, topology, train, validate  # noqa: E402
from meshscale.errors import MeshscaleError, WorkerError  # noqa: E402
from meshscale.execute.world import tell_launcher  # noqa: E402
from meshscale.safe_io import new_outputs_removed_on  # noqa: E402

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

# (command words..., spelling) -> the new spelling, or "removed: <reason>". A spelling is an option, optionally
# followed by a pattern its value must match (fnmatch; "!N" = missing or not a whole number), optionally followed
# by "with OPTION" (that option must be given too). "{value}" in the new spelling stands for the value given.
_OUTPUT = "--output (-o is bench's reduction op)"
_JSON = "--json (as in every command that writes a result)"
RENAMED: dict[tuple[str, ...], str] = {
    **{(command, "-g"): "--devices (device indices) or --gpus N (the first N devices)" for command in ("plan", "sim")},
    **{(command, "--gpus *,*"): "--devices {value} (--gpus N counts: the first N devices)" for command in ("plan", "sim")},
    **{(command, "-a"): "--algo (-a is bench's --average)" for command in ("plan", "sim")},
    ("plan", "-b"): "--bytes (-b is bench's --min-bytes)",
    ("bench", "p2p", "-s"): "--size (-s is a system elsewhere)",
    ("bench", "collective", "--cuda-graph !N"): "--cuda-graph N or -G N (nccl-tests: 0 off, N > 0 on)",
    **{(*command, "--timeout"): "--timeout-s" for command in (("bench", "collective"), ("bench", "p2p"), ("tour",))},
    ("topo", "-f"): "--format (-f is bench's size factor)",
    ("topo", "-o"): _OUTPUT, ("report", "-o"): _OUTPUT, ("tour", "-o"): _OUTPUT,
    ("doctor", "-o"): _JSON, ("doctor", "--output"): _JSON,
    ("predict", "--algorithm ps"): "--mode ps-sync",
    ("predict", "--algorithm"): "--algo (ring or hierarchical)",
    ("predict", "--mode sync"): "--framework cntk-2016 (the whole exchange after backward)",
    ("predict", "--no-overlap"): "--framework cntk-2016 (the framework says whether the exchange overlaps backward)",
    ("predict", "--overlap"): "--framework ddp or horovod (the framework says whether the exchange overlaps backward)",
    ("predict", "--comm-scale"): "removed: a free multiplier of exchange times is a fit; calibrate the links with "
                                 "--p2p or --bench",
    ("predict", "--batch with --strong"): "--global-batch (--batch is per GPU, for --weak)",
}
RENAMED.update(getattr(train, "RENAMED_TRAIN", {}))


def _parse_spelling(spelling: str) -> tuple[str, str | None, str | None]:
    """(option, value pattern or None, option that must also be given or None)."""
    words = spelling.split()
    also = None
    if len(words) >= 2 and words[-2] == "with":
        also, words = words[-1], words[:-2]
    return words[0], (words[1] if len(words) > 1 else None), also


def _occurrences(tokens: list[str], option: str):
    """Yield the value (or None) of every use of ``option`` in ``tokens``: `--opt v`, `--opt=v`, `-ov`."""
    for i, token in enumerate(tokens):
        if token == "--":
            return
        if token == option:
            following = tokens[i + 1] if i + 1 < len(tokens) else None
            yield None if following is None or following.startswith("-") and not following[1:2].isdigit() else following
        elif option.startswith("--") and token.startswith(option + "="):
            yield token[len(option) + 1:]
        elif len(option) == 2 and option[0] == "-" and token.startswith(option) and not token.startswith("--"):
            yield token[2:]


def _value_matches(pattern: str | None, value: str | None) -> bool:
    if pattern is None:
        return True
    if pattern == "!N":
        return value is None or not value.isdigit()
    return value is not None and fnmatch.fnmatchcase(value, pattern)


def renamed_hint(argv: list[str], table: dict[tuple[str, ...], str] | None = None) -> str | None:
    """The one-line hint for the first old spelling in ``argv`` (the words after `meshscale`), or None."""
    table = RENAMED if table is None else table
    # the most specific spellings first: `--algorithm ps` before `--algorithm`
    for key in sorted(table, key=lambda k: (-len(k), -len(k[-1]))):
        *command, spelling = key
        if argv[:len(command)] != command:
            continue
        option, pattern, also = _parse_spelling(spelling)
        rest = argv[len(command):]
        if also and not any(True for _ in _occurrences(rest, also)):
            continue
        for value in _occurrences(rest, option):
            if _value_matches(pattern, value):
                old = option + (f" {value}" if pattern and value is not None else "") + (f" with {also}" if also else "")
                new = table[key].replace("{value}", value or "")
                said = new if new.startswith("removed") else f"is now {new}"
                return f"meshscale {' '.join(command)}: {old} {said}"
    return None


def main() -> None:
    """Entry point of the console script."""
    hint = renamed_hint(sys.argv[1:])
    if hint:
        print(hint, file=sys.stderr)
        sys.exit(2)
    try:
        # bad input found late: none of the files it began; a failed run keeps the finished part it saved
        with new_outputs_removed_on(MeshscaleError, unless=WorkerError):
            code = app(standalone_mode=False)
        sys.stdout.flush()  # a full disk or a closed pipe behind stdout shows here, not at exit
    except MeshscaleError as exc:
        line = one_line(str(exc))
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
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int):
            exc.show()
            sys.exit(exc.exit_code)
        if type(exc).__name__ == "Abort":
            sys.exit(130)
        raise
    if isinstance(code, int) and code:  # typer.Exit(n) comes back as the return value here
        sys.exit(code)


def one_line(text: str) -> str:
    """``text`` with control characters (a newline in a file name, a NUL) shown escaped: one line whatever the
    input it quotes."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def _stop_writing_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit does not fail a second time."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass
