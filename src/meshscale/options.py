"""Command-line options declared once, beside the field they fill: `option` makes a dataclass field that is also
an option (its flags, help, the range the CLI enforces before anything starts, and how its text is parsed), and
`option_fields` lists a dataclass's options, nested groups included. `meshscale train`, `scale` (TrainConfig) and
`predict` (PredictRequest) are built from these declarations (`cli.declared`)."""
from __future__ import annotations

import sys
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable, Iterator

from meshscale.validation import Check


def option(default: Any, *flags: str, help: str = "", train_only: bool = False, check: Check | None = None,
           parse: Callable[[Any], Any] | None = None, cli_type: Any = None) -> Any:
    """A dataclass field that is also the command-line option ``flags`` (``train_only``: not offered by scale;
    ``check(value, flag)``: the range the CLI enforces before anything starts; ``parse``: the field's value from
    the option's (``cli_type``, the type the command line gives, when it differs from the field's))."""
    return field(default=default, metadata={"flags": flags, "help": help, "train_only": train_only, "check": check,
                                            "parse": parse, "cli_type": cli_type})


@dataclass(frozen=True)
class OptionField:
    """One command-line option of a dataclass: where its value goes (``path``), its type and declaration."""

    path: tuple[str, ...]            # e.g. ("ddp", "bucket_cap_mb")
    type: Any
    default: Any
    flags: tuple[str, ...]
    help: str
    train_only: bool
    check: Check | None = None
    parse: Callable[[Any], Any] | None = None

    @property
    def name(self) -> str:
        return "_".join(self.path)


def _hint(cls: type, name: str, annotation: Any) -> Any:
    """A field's annotation evaluated in its class's module; None where it names what the module imports only
    for type checking (a field that is no option, whose type the command line never needs)."""
    if not isinstance(annotation, str):
        return annotation
    module = sys.modules[cls.__module__].__dict__
    try:
        return eval(annotation, {**vars(typing), **module})  # noqa: S307 - the class's own annotation text
    except NameError:
        return None


def option_fields(cls: type, prefix: tuple[str, ...] = ()) -> Iterator[OptionField]:
    """Every field of ``cls`` declared with `option`, nested groups included, in declaration order."""
    for f in fields(cls):
        hint = f.metadata.get("cli_type") or _hint(cls, f.name, f.type)
        if hint is not None and is_dataclass(hint):
            yield from option_fields(hint, prefix + (f.name,))
        elif "flags" in f.metadata:
            yield OptionField(prefix + (f.name,), hint, f.default, f.metadata["flags"], f.metadata["help"],
                              f.metadata["train_only"], f.metadata.get("check"), f.metadata.get("parse"))
