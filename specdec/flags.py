"""Command-line flags from a frozen dataclass: the one helper every configuration uses.

A field is a flag: ``--name-with-dashes`` (or ``metadata["flags"]``), its default the
field's, its help ``metadata["help"]``, its type from the annotation (or
``metadata["type"]``), ``metadata["choices"]`` as choices; a bool is a ``--x / --no-x``
pair and a field without a default is required. ``to_argv`` writes a config back as the
command line that parses to it, so a launcher never rebuilds one by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

C = TypeVar("C")


def flag_names(f: dataclasses.Field) -> tuple[str, ...]:
    return tuple(f.metadata.get("flags", ("--" + f.name.replace("_", "-"),)))


def _scalar_type(hint: Any) -> type:
    return next(t for t in (bool, int, float, str) if t in (hint, *typing.get_args(hint)))


def add_flags(
    parser: argparse.ArgumentParser, cls: type, exclude: Iterable[str] = ()
) -> argparse.ArgumentParser:
    """One flag per field of ``cls`` but those in ``exclude``."""
    hints = typing.get_type_hints(cls)
    skip = set(exclude)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        required = f.default is dataclasses.MISSING
        kwargs: dict[str, Any] = {
            "dest": f.name,
            "default": None if required else f.default,
            "help": f.metadata.get("help"),
        }
        kind = f.metadata.get("type") or _scalar_type(hints[f.name])
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs.update(type=kind, required=required, choices=f.metadata.get("choices"))
        parser.add_argument(*flag_names(f), **kwargs)
    return parser


def from_args(cls: type[C], args: argparse.Namespace, **given: Any) -> C:
    """``cls`` from parsed flags (its fields' names), ``given`` taking precedence."""
    values = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)
    }
    return cls(**{**values, **given})


def to_argv(config: Any) -> list[str]:
    """The flags that parse to ``config``: every field that differs from its default (and
    every required one), in field order."""
    argv: list[str] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.default is not dataclasses.MISSING and value == f.default:
            continue
        flag = flag_names(f)[0]
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag.removeprefix("--"))
        elif value is not None:
            argv += [flag, str(value)]
    return argv


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each flag's default."""


def parser_for(cls: type, prog: str, description: str | None = None) -> argparse.ArgumentParser:
    """An argument parser with one flag per field of ``cls``."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=HelpFormatter
    )
    return add_flags(parser, cls)


def parse(cls: type[C], prog: str, argv: Sequence[str] | None = None) -> C:
    """``cls`` from the command line ``argv``; a value the class refuses is a usage error."""
    parser = parser_for(cls, prog, (cls.__doc__ or "").split("\n\n")[0])
    args = parser.parse_args(argv)
    try:
        return from_args(cls, args)
    except ValueError as e:
        parser.error(str(e))
