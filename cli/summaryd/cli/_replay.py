"""`summaryd replay`: deliver what a client spooled while the daemon was away, exactly once."""

from __future__ import annotations

import argparse
import json
import sys

from summaryd.cli._commands import ENV_PREFIX, Command, Subcommands, add_redirect_flag


def _add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    replay: argparse.ArgumentParser = commands.add_parser(
        "replay",
        help="deliver spooled events (and projector files) a client left behind",
        description="Deliver the events a client spooled while the daemon was away, exactly once: what the "
        "daemon holds already is skipped, so replaying twice writes nothing twice. The projector files kept "
        "beside them (SESSION.files) are uploaded in the same session. A spool the daemon confirmed whole is "
        "removed (unless --keep). PATH is one spool (a directory with manifest.json) or a spool root holding several "
        "(SUMMARYD_SPOOL_DIR, by default ~/.cache/summaryd/spool). Token and TLS as for the client "
        "(SUMMARYD_TOKEN, SUMMARYD_TLS_*).",
    )
    replay.add_argument("path", metavar="PATH", help="a spool directory, or a directory of spools")
    replay.add_argument(
        "--address",
        default=None,
        help=f"daemon HOST:PORT, or several comma-separated, tried in turn (default {ENV_PREFIX}ADDRESS, else the "
        "address the client was logging to)",
    )
    add_redirect_flag(replay)
    replay.add_argument("--timeout", type=float, default=30.0, help="seconds each call may take")
    replay.add_argument("--json", action="store_true", help="print one JSON object per spool")
    replay.add_argument("--keep", action="store_true", help="keep a delivered spool (replaying it again sends nothing)")
    return replay


def replay(args: argparse.Namespace, sub: argparse.ArgumentParser) -> int:
    from pathlib import Path

    from summaryd.client import commands

    try:
        results = commands.replay(
            Path(args.path), args.address, args.timeout, keep=args.keep, redirect_allow=args.redirect_allow
        )
    except ValueError as exc:
        sub.error(str(exc))
    if not results:
        print(f"{args.path}: no spool here (a spool is a directory holding manifest.json)", file=sys.stderr)
        return 1
    for result in results:
        print(json.dumps(result.to_json()) if args.json else result.describe())
    return 0 if all(r.ok for r in results) else 1


REPLAY = Command("replay", _add_parser, replay)
