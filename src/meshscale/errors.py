"""The one exception type meant for users: the CLI prints it as one line and exits with code 2."""


class MeshscaleError(Exception):
    """Bad input or an unusable environment, explained in one line (no traceback shown)."""


class TopologyError(MeshscaleError):
    """A system description that is malformed or inconsistent."""


class WorkerError(MeshscaleError):
    """A rank failed, died or timed out; the message names the rank and what it was doing."""


class Interrupted(WorkerError):
    """The run was stopped by Ctrl-C or SIGTERM (not by a failing rank); every rank has been stopped."""


def check_choice(value, choices, what: str) -> None:
    """Raise the one-line 'unknown <what> <value>; use one of ...' error unless ``value`` is in ``choices``."""
    if value not in choices:
        import reprlib
        try:
            shown = reprlib.repr(value)  # a quote of bounded length, whatever the file held
        except ValueError:  # an integer too long to write
            shown = "(a number of thousands of digits)"
        raise MeshscaleError(f"unknown {what} {shown}; use one of {', '.join(map(str, choices))}")


def one_line(text: str) -> str:
    """``text`` with control characters (a newline in a file name, a NUL) shown escaped: one line whatever the
    input it quotes."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)
