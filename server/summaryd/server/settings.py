"""How a setting of `summaryd serve` is declared: once, as a field of the settings dataclass of the part it
configures (`Limits`, `SealPolicy`, `AggregationSettings`, ...), with its default, its help and its option name.
`Config` nests those dataclasses; `options` lists every setting in `--help` order, from which the command line
derives each flag `--option-name` and variable `SUMMARYD_OPTION_NAME`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


def option(default: Any, help: str, metavar: str | None = None, *, name: str | None = None) -> Any:
    """A settings field that is an option: `name` (default: the field's own) is its flag without the dashes."""
    return field(default=default, metadata={"help": help, "metavar": metavar, "option": name})


def flag(name: str) -> str:
    """The command-line flag of the option `name`."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class Option:
    """One option: its name (the flag without dashes), type, default and help."""

    name: str
    kind: type
    default: Any
    help: str
    metavar: str | None


def options(settings: type) -> list[Option]:
    """Every option of the settings dataclass `settings` and of those it nests, in declaration order."""
    found: list[Option] = []
    _collect(settings, found)
    return found


def _nests(kind: Any) -> bool:
    """Whether a field of this type is settings of their own (a dataclass), not an option."""
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def _collect(settings: Any, found: list[Option]) -> None:
    hints = typing.get_type_hints(settings)
    for f in dataclasses.fields(settings):
        kind = hints[f.name]
        if _nests(kind):
            _collect(kind, found)
        elif "help" in f.metadata:
            name = f.metadata["option"] or f.name
            found.append(Option(name, kind, f.default, f.metadata["help"], f.metadata["metavar"]))


def build(settings: type[T], values: dict[str, Any]) -> T:
    """`settings` made from option values by option name, each nested settings dataclass from its own; what
    `values` does not name keeps its default.

    Raises:
        TypeError: `values` names no option of `settings`.
    """
    unknown = set(values) - {o.name for o in options(settings)}
    if unknown:
        raise TypeError(f"no such option: {', '.join(sorted(unknown))}")
    built: T = _build(settings, values)
    return built


def _build(settings: Any, values: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(settings)
    arguments: dict[str, Any] = {}
    for f in dataclasses.fields(settings):
        kind = hints[f.name]
        if _nests(kind):
            arguments[f.name] = _build(kind, values)
        elif "help" in f.metadata and (f.metadata["option"] or f.name) in values:
            arguments[f.name] = values[f.metadata["option"] or f.name]
    return settings(**arguments)
