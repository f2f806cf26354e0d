"""The `summaryd` parser, built from one table of commands, and the dispatch to the command given."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence

from summaryd.cli._commands import Command, Parser
from summaryd.cli._query import HEALTH, STATUS
from summaryd.cli._replay import REPLAY
from summaryd.cli._run import RUN
from summaryd.cli._serve import SERVE
from summaryd.cli._ship import SHIP
from summaryd.cli._watch import WATCH
from summaryd.v1.search_path import unshadow
from summaryd.v1.wire import VERSION

# In the order `summaryd --help` lists them.
COMMANDS: tuple[Command, ...] = (SERVE, STATUS, HEALTH, WATCH, REPLAY, RUN, SHIP)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each command's."""
    parser = Parser(
        prog="summaryd",
        description="summaryd: one daemon writes the TensorBoard event files of many training processes.",
    )
    parser.add_argument("--version", action="version", version=f"summaryd {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    return parser, {command.name: command.add_parser(commands) for command in COMMANDS}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `summaryd` console script."""
    unshadow()  # before a command imports the client: the working directory may be on sys.path
    parser, subs = build_parser()
    args, unknown = parser.parse_known_args(argv)
    sub = subs[args.command]
    if unknown:
        # Told by the command's parser, not the top-level one: its help is where the right flag is.
        known = [option for action in sub._actions for option in action.option_strings]
        hints = [_hint(flag.split("=")[0], known) for flag in unknown if flag.startswith("-")]
        hints = list(dict.fromkeys(hint for hint in hints if hint))
        sub.error(
            f"unrecognized arguments: {' '.join(unknown)}" + (f"; did you mean {', '.join(hints)}?" if hints else "")
        )
    (command,) = (c for c in COMMANDS if c.name == args.command)
    return command.run(args, sub)


# TensorBoard's and uvicorn's flags for where to listen, and what says it here.
_ADDRESS_FLAGS = ("--port", "--host", "--bind_all", "--bind-all")


def _hint(flag: str, known: list[str]) -> str:
    """The flag of this command a mistyped or foreign `flag` most likely meant ("" when none is close)."""
    if flag in _ADDRESS_FLAGS:
        for where in ("--listen", "--address"):
            if where in known:
                return f"{where} HOST:PORT"
    close = difflib.get_close_matches(flag, known, 1)
    return close[0] if close else ""
