"""`summaryd serve`: flags and `SUMMARYD_*` variables derived from the options of the daemon's `Config`, which
then runs."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from typing import Any

from summaryd.cli._commands import ENV_PREFIX, Command, Subcommands
from summaryd.server.config import Config, options
from summaryd.server.operations.logs import configure_logging
from summaryd.server.settings import flag


def _env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    serve: argparse.ArgumentParser = commands.add_parser(
        "serve",
        help="run the daemon",
        description="Serve gRPC clients and write their summaries as TensorBoard event files under --logdir. "
        "Every flag can also be set by the environment variable shown.",
    )
    for o in options():
        if o.kind is bool:
            serve.add_argument(
                flag(o.name),
                dest=o.name,
                # A setting on by default is turned off by its --no- form.
                action=argparse.BooleanOptionalAction if o.default else "store_true",
                default=None,
                help=f"{o.help} (env {_env_name(o.name)}=1)",
            )
            continue
        serve.add_argument(
            flag(o.name),
            dest=o.name,
            type=o.kind,
            default=None,
            metavar=o.metavar,
            help=f"{o.help} (env {_env_name(o.name)}, default {o.default!r})",
        )
    return serve


def config_from(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str]) -> Config:
    """Flags win over `SUMMARYD_*` variables, which win over the defaults."""
    values: dict[str, Any] = {}
    for o in options():
        given = getattr(args, o.name, None)
        if given is not None:
            values[o.name] = given
            continue
        env = environ.get(_env_name(o.name))
        if env is not None and o.kind is bool:
            if env.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
                raise ValueError(f"{_env_name(o.name)}={env!r}: use 1/true/yes/on or 0/false/no/off")
            values[o.name] = env.lower() in ("1", "true", "yes", "on")
        elif env is not None:
            try:
                values[o.name] = o.kind(env)
            except ValueError:
                raise ValueError(f"{_env_name(o.name)}={env!r} is not a valid {o.kind.__name__}") from None
    return Config.from_options(**values)


def serve(args: argparse.Namespace, sub: argparse.ArgumentParser) -> int:
    try:
        config = config_from(args, os.environ)
    except ValueError as exc:
        sub.error(str(exc))
    configure_logging(config.log_level, config.log_format)
    from summaryd.server.server import StartupError, run
    from summaryd.server.storage.state import StateError

    log = logging.getLogger("summaryd")
    log.debug("config %s", dataclasses.asdict(config))
    try:
        run(config)
    except (StartupError, StateError) as exc:
        log.error("%s", exc)
        return 1
    return 0


SERVE = Command("serve", _add_parser, serve)
