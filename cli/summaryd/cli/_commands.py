"""What every command is made of, and the flags several of them share.

A command is a `Command`: its name, a function that adds its parser to the `summaryd` subcommands, and the one
function that runs it. A new command is a module with one of these and a line in `_main.COMMANDS`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from summaryd.v1.wire import DEFAULT_ADDRESS

ENV_PREFIX = "SUMMARYD_"
ADDRESS_HELP = f"daemon HOST:PORT (env {ENV_PREFIX}ADDRESS, default {DEFAULT_ADDRESS})"

# `argparse`'s subparsers action; its class is private to argparse.
Subcommands = Any


@dataclass(frozen=True)
class Command:
    """One `summaryd` command."""

    name: str
    add_parser: Callable[[Subcommands], argparse.ArgumentParser]
    # Runs the command with its parsed arguments and its own parser (for usage errors); the exit code.
    run: Callable[[argparse.Namespace, argparse.ArgumentParser], int]


class Parser(argparse.ArgumentParser):
    """Usage errors are one line that names the command and where its help is, not a screen of usage. A flag is
    taken only by its whole name: argparse's abbreviations took TensorBoard's `--port 6006` for `--port-file 6006`,
    and the daemon served on its default port with a file named `6006` beside it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def add_redirect_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redirect-allow",
        default=None,
        metavar="A,B",
        help=f"daemons beyond --address that a daemon may send this client to (a bucket logdir's run owner), "
        f"comma-separated (env {ENV_PREFIX}REDIRECT_ALLOW); a redirect to any other address is not followed",
    )


def add_channel_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token", default=None, help="bearer token (env SUMMARYD_TOKEN)")
    parser.add_argument(
        "--tls-ca", default=None, metavar="FILE", help="PEM CA bundle of the daemon (env SUMMARYD_TLS_CA)"
    )
    parser.add_argument(
        "--tls-cert", default=None, metavar="FILE", help="PEM client certificate (env SUMMARYD_TLS_CERT)"
    )
    parser.add_argument("--tls-key", default=None, metavar="FILE", help="PEM key of --tls-cert (env SUMMARYD_TLS_KEY)")


def rpc_failure(exc: Exception) -> str:
    """A failed call as one line: its status code's name (ERROR without one) and its details."""
    import grpc

    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    return f"{code.name if code else 'ERROR'}: {details}"
