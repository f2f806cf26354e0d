"""`summaryd ship`: stream the event files anything writes under a directory to the daemon, exactly once."""

from __future__ import annotations

import argparse
import logging
import sys

from summaryd.cli._commands import ADDRESS_HELP, Command, Subcommands, add_redirect_flag, rpc_failure


def _add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    ship: argparse.ArgumentParser = commands.add_parser(
        "ship",
        help="stream the event files written under DIR to the daemon, exactly once",
        description="Tail the TensorBoard event files anything writes under DIR (tf.summary, flax/clu, any native "
        "writer) and stream their records to the daemon exactly once: each directory holding tfevents files is a "
        "run below --run; records pass through byte for byte (the daemon writes its own file_version record); a "
        "record not yet whole at a file's end waits; new files (rotation) are followed. Offsets and session ids "
        "are checkpointed durably in --state, so restarting the shipper or the daemon neither loses nor doubles "
        "a record. --once ships what is there and exits; otherwise it follows until SIGTERM or SIGINT, then "
        "drains. Token and TLS come from SUMMARYD_TOKEN and SUMMARYD_TLS_*.",
    )
    ship.add_argument("directory", metavar="DIR", help="the directory the event files are written under")
    ship.add_argument("--run", required=True, help="run path DIR maps to under the daemon's logdir")
    ship.add_argument("--once", action="store_true", help="ship what is there now, then exit")
    ship.add_argument("--address", default=None, help=f"{ADDRESS_HELP}; several comma-separated are tried in turn")
    add_redirect_flag(ship)
    ship.add_argument("--state", default=None, metavar="FILE", help="checkpoint file (default DIR/.summaryd-ship.json)")
    ship.add_argument("--poll", type=float, default=0.5, metavar="SECS", help="seconds between looks at DIR")
    ship.add_argument("--timeout", type=float, default=10.0, help="seconds each call to the daemon may take")
    return ship


def ship(args: argparse.Namespace, sub: argparse.ArgumentParser) -> int:
    """Ship, saying on stderr what the shipper finds on the way (a file replaced, a corrupt record), a line each."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("summaryd ship: %(message)s"))
    ship_log = logging.getLogger("summaryd.ship")
    ship_log.addHandler(handler)
    try:
        return _ship(args, sub)
    finally:
        ship_log.removeHandler(handler)


def _ship(args: argparse.Namespace, sub: argparse.ArgumentParser) -> int:
    import signal
    import threading
    from pathlib import Path

    import grpc

    from summaryd.client.commands import RedirectRefusedError, ShipError, Shipper

    directory = Path(args.directory)
    if not directory.is_dir():
        sub.error(f"{directory} is not a directory")

    def progress(records: int, nbytes: int) -> None:
        print(f"\rsummaryd ship: {records} records, {nbytes} bytes", end="", file=sys.stderr, flush=True)

    try:
        shipper = Shipper(
            directory,
            args.run,
            address=args.address,
            redirect_allow=args.redirect_allow,
            state_path=Path(args.state) if args.state else None,
            rpc_timeout=args.timeout,
            progress=progress if args.once and sys.stderr.isatty() else None,
        )
    except ValueError as exc:
        sub.error(str(exc))
    mode = "once" if args.once else "following until SIGTERM"
    print(
        f"summaryd ship: daemon {shipper.address}, run root {shipper.run}, {directory} ({mode})",
        file=sys.stderr,
        flush=True,
    )
    try:
        if args.once:
            totals = shipper.ship_once()
            if sys.stderr.isatty():
                print(file=sys.stderr)
        else:
            stop = threading.Event()
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: stop.set())
            totals = shipper.follow(stop, args.poll)
    except grpc.RpcError as exc:
        shipper.totals.stopped_by(rpc_failure(exc))
        totals = shipper.totals
    except (ShipError, RedirectRefusedError) as exc:
        shipper.totals.stopped_by(str(exc))
        totals = shipper.totals
    print(f"summaryd ship: {totals.describe()}", file=sys.stderr)
    return 1 if totals.error else 0


SHIP = Command("ship", _add_parser, ship)
