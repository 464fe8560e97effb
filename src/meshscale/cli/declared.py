"""Commands built from declared options (`meshscale.options.option`): each declared field becomes a typer option
with its flags, help and check, beside the command's own parameters; the command receives the declared values
keyed by their path, parsed as each declaration says."""
from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import typer

from meshscale.cli.checks import checked
from meshscale.options import OptionField


def typer_parameter(f: OptionField, default: Any) -> inspect.Parameter:
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                             default=typer.Option(default, *f.flags, help=f.help,
                                                  callback=checked(f.check) if f.check else None),
                             annotation=Optional[f.type] if default is None else f.type)


def declared_values(fields: list[OptionField], values: dict[str, Any]) -> tuple[dict[tuple[str, ...], Any],
                                                                             dict[str, Any]]:
    """A command's parsed parameters (by name) split into the declared fields' values, keyed by path and parsed as
    each declares, and the command's own parameters."""
    own = dict(values)
    options = {}
    for f in fields:
        value = own.pop(f.name)
        options[f.path] = f.parse(value) if f.parse and value is not None else value
    return options, own


def with_declared(fields: list[OptionField], defaults: dict[tuple[str, ...], Any] | None = None
                  ) -> Callable[[Callable], Callable]:
    """Give ``fn(options, **own)`` every field of ``fields`` as a typer option beside its own parameters; ``fn``
    receives their values as ``options``, keyed by their path, parsed (``defaults``: other defaults than the
    declared ones, by path)."""
    defaults = defaults or {}

    def wrap(fn: Callable) -> Callable:
        own = [p for name, p in inspect.signature(fn, eval_str=True).parameters.items() if name != "options"]

        def run(**values: Any) -> None:
            options, own = declared_values(fields, values)
            fn(options, **own)
        run.__signature__ = inspect.Signature([typer_parameter(f, defaults.get(f.path, f.default)) for f in fields]
                                              + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own])
        run.__name__, run.__doc__ = fn.__name__, fn.__doc__
        return run
    return wrap
