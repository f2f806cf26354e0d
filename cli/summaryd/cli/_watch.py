"""`summaryd watch`: follow the findings of a daemon's watch (hung workers, NaNs, divergence, stragglers)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import TYPE_CHECKING

from summaryd.cli._commands import Command, Subcommands
from summaryd.cli._query import ask, message_json, parser

if TYPE_CHECKING:
    from summaryd.client.commands import ChannelSettings
    from summaryd.v1 import summaryd_pb2 as pb


def _add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    sub = parser(
        commands,
        "watch",
        "follow the findings of a daemon's watch (hung workers, NaNs, divergence, stragglers), a line each",
    )
    sub.add_argument("--json", action="store_true", help="print JSON (schema in README)")
    sub.add_argument("--once", action="store_true", help="print the findings firing now and exit")
    sub.add_argument("--interval", type=float, default=0.5, metavar="SECS", help="seconds between looks")
    return sub


def watch(args: argparse.Namespace, sub: argparse.ArgumentParser) -> int:
    return ask(
        args,
        sub,
        lambda address, settings: _watch(address, settings, args.timeout, args.json, args.once, args.interval),
    )


def _finding_line(finding: pb.WatchFinding) -> str:
    when = finding.resolved_unix or finding.fired_unix
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
    rank = f" rank={finding.rank}" if finding.rank else ""
    return f"{stamp} {finding.state} {finding.rule} run={finding.run}{rank} step={finding.step}: {finding.summary}"


def _watch(address: str, settings: ChannelSettings, timeout: float, as_json: bool, once: bool, interval: float) -> int:
    """Print the findings firing, then (unless `once`) each change as it comes, until interrupted."""
    import grpc

    from summaryd.client.commands import open_channel
    from summaryd.v1 import summaryd_pb2 as pb
    from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

    def show(finding: pb.WatchFinding) -> None:
        print(json.dumps(message_json(finding)) if as_json else _finding_line(finding), flush=True)

    through, away = 0, False
    with contextlib.suppress(KeyboardInterrupt), open_channel(address, settings) as channel:
        stub = pb_grpc.SummariesStub(channel)
        status = stub.GetStatus(pb.GetStatusRequest(), timeout=timeout)
        if not status.watching:
            print(f"summaryd at {address}: the watch is off (--no-watch)", file=sys.stderr)
            return 1
        for finding in status.findings:
            show(finding)
        through = status.changes_through
        while not once:
            time.sleep(interval)
            try:
                status = stub.GetStatus(pb.GetStatusRequest(changes_after=through), timeout=timeout)
            except grpc.RpcError as exc:
                if not away:  # a daemon restarting: said once, followed again when it answers
                    code = exc.code().name if isinstance(exc, grpc.Call) else "ERROR"
                    print(f"summaryd at {address}: {code}; waiting for it", file=sys.stderr, flush=True)
                away = True
                continue
            away = False
            for finding in status.changes:
                show(finding)
            # A daemon whose state was lost numbers its changes from 1 again.
            through = (
                status.changes_through
                if status.changes_through < through
                else max(through, *(c.sequence for c in status.changes), 0)
            )
    return 0


WATCH = Command("watch", _add_parser, watch)
