"""`summaryd status` and `summaryd health`: one call to a running daemon, with the client's token and TLS; what
every command that asks a daemon shares (`parser`, `ask`, `message_json`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from summaryd.cli._commands import ADDRESS_HELP, Command, Subcommands, add_channel_flags, rpc_failure

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from summaryd.client.commands import ChannelSettings
    from summaryd.v1 import summaryd_pb2 as pb


def parser(commands: Subcommands, name: str, text: str) -> argparse.ArgumentParser:
    """A command that asks a running daemon: `--address`, the token and TLS flags, `--timeout`."""
    sub: argparse.ArgumentParser = commands.add_parser(
        name,
        help=text,
        description=f"{text[0].upper()}{text[1:]}. Token and TLS come from the flags, else the variables the "
        "client reads (SUMMARYD_TOKEN, SUMMARYD_TLS_CA, SUMMARYD_TLS_CERT, SUMMARYD_TLS_KEY, SUMMARYD_TLS=1).",
    )
    sub.add_argument("--address", default=None, help=ADDRESS_HELP)
    add_channel_flags(sub)
    sub.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer")
    return sub


def _add_status_parser(commands: Subcommands) -> argparse.ArgumentParser:
    sub = parser(commands, "status", "show the open runs and live sessions of a running daemon")
    sub.add_argument("--json", action="store_true", help="print JSON (schema in README)")
    return sub


def _add_health_parser(commands: Subcommands) -> argparse.ArgumentParser:
    return parser(commands, "health", "check a daemon")


def status(args: argparse.Namespace, sub: argparse.ArgumentParser) -> int:
    return ask(args, sub, lambda address, settings: _status(address, settings, args.timeout, args.json))


def health(args: argparse.Namespace, sub: argparse.ArgumentParser) -> int:
    return ask(args, sub, lambda address, settings: _health(address, settings, args.timeout))


def ask(args: argparse.Namespace, sub: argparse.ArgumentParser, call: Callable[[str, ChannelSettings], int]) -> int:
    """Resolve the address and the channel settings, then `call` them: every failure is one line on stderr."""
    import grpc

    from summaryd.client.commands import ChannelSettings, resolve_address

    try:
        address = resolve_address(args.address)
        settings = ChannelSettings.from_environment(
            token=args.token, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key
        )
    except ValueError as exc:
        sub.error(str(exc))
    try:
        return call(address, settings)
    except grpc.RpcError as exc:
        print(f"summaryd at {address}: {rpc_failure(exc)}", file=sys.stderr)
    except OSError as exc:  # a TLS file that cannot be read
        print(f"summaryd {args.command}: {exc.strerror or exc}: {exc.filename}", file=sys.stderr)
    return 1


def _call(address: str, settings: ChannelSettings, call: str, timeout: float) -> Message:
    """One unary call (`status` or `health`) over a channel with the client's token and TLS.

    Raises:
        grpc.RpcError: the daemon could not be reached or refused the call.
    """
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from summaryd.client.commands import open_channel
    from summaryd.v1 import summaryd_pb2 as pb
    from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

    with open_channel(address, settings) as channel:
        if call == "status":
            answer: Message = pb_grpc.SummariesStub(channel).GetStatus(pb.GetStatusRequest(), timeout=timeout)
        else:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
    return answer


def message_json(message: Message) -> dict[str, Any]:
    """Every field of `message` by its proto name, always present: integers as JSON numbers (64-bit ones too),
    strings, floats, booleans, nested messages as objects and repeated fields as lists."""
    result: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None:
            result[field.name] = [message_json(item) for item in value] if field.is_repeated else message_json(value)
        else:
            result[field.name] = list(value) if field.is_repeated else value
    return result


def _status(address: str, settings: ChannelSettings, timeout: float, as_json: bool) -> int:
    from summaryd.v1 import summaryd_pb2 as pb

    status = _call(address, settings, "status", timeout)
    assert isinstance(status, pb.GetStatusResponse)
    if as_json:
        print(json.dumps({"address": address, **message_json(status)}, indent=2))
        return 0
    print(f"logdir {status.logdir}  (summaryd {status.version})")
    print(f"{'OPEN RUN':<40} {'FILE':<58} {'EVENTS':>9} {'BYTES':>11} {'SESSIONS':>8}")
    for run in status.runs:
        print(
            f"{run.run_dir:<40} {run.event_file or '-':<58} {run.events_written:>9} {run.bytes_written:>11} "
            f"{run.sessions:>8}"
        )
    if any(run.lease_holder or run.staged_bytes or run.last_upload_unix for run in status.runs):
        _bucket_table(status)
    print()
    print(
        f"{'SESSION':<36} {'RUN':<30} {'WORKER':<10} {'HOST':<16} {'PID':>7} {'EVENTS':>9} {'ACKED':>9} "
        f"{'LAST SEEN':>9} {'LAG':>6}"
    )
    for s in status.sessions:
        # LAG: steps behind the run's furthest worker (aggregated sessions only).
        lag = str(s.lag_steps) if s.aggregated else "-"
        print(
            f"{s.session_id:<36} {s.run_dir:<30} {s.worker or '-':<10} {s.client.host:<16} {s.client.pid:>7} "
            f"{s.events_written:>9} {s.acked_sequence:>9} {s.idle_seconds:>7.1f}s {lag:>6}"
        )
    _watch_table(status)
    open_files = sum(1 for run in status.runs if run.event_file)
    if status.HasField("board"):
        board = status.board
        behind = f", {_count(board.runs_pending, 'run')} already there not read yet" if board.runs_pending else ""
        if board.segments_pending:
            behind += f", {_count(board.segments_pending, 'segment')} in the bucket not read yet"
        print(f"\nboard {board.address} (tensorboard --grpc_data_provider): {_count(board.runs, 'run')}{behind}")
    print(
        f"\n{_count(len(status.runs), 'open run')} (with a live session or an open event file; finished runs "
        f"stay in the logdir), {_count(len(status.sessions), 'live session')}, {_count(open_files, 'open file')}"
    )
    return 0


def _watch_table(status: pb.GetStatusResponse) -> None:
    """WATCH: the findings firing, one a line (or that the watch is off)."""
    print()
    if not status.watching:
        print("WATCH off (--no-watch)")
        return
    print(f"{'WATCH':<11} {'RUN':<30} {'RANK':<10} {'STEP':>9}  SUMMARY")
    for f in status.findings:
        print(f"{f.rule:<11} {f.run:<30} {f.rank or '-':<10} {f.step:>9}  {f.summary}")
    if not status.findings:
        print("-           (nothing found)")


def _bucket_table(status: pb.GetStatusResponse) -> None:
    """The open runs of a bucket logdir: who holds each run's lease, what waits in staging, the last upload."""
    print()
    print(f"{'OPEN RUN (BUCKET)':<40} {'LEASE HOLDER':<28} {'STAGED BYTES':>12} {'LAST UPLOAD (UTC)':<20} {'AGO':>8}")
    for run in status.runs:
        when, ago = "-", "-"
        if run.last_upload_unix:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(run.last_upload_unix))
            ago = f"{run.last_upload_age_seconds:.1f}s"
        print(f"{run.run_dir:<40} {run.lease_holder or '-':<28} {run.staged_bytes:>12} {when:<20} {ago:>8}")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _health(address: str, settings: ChannelSettings, timeout: float) -> int:
    from grpc_health.v1 import health_pb2

    answer = _call(address, settings, "health", timeout)
    assert isinstance(answer, health_pb2.HealthCheckResponse)
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    print(f"summaryd at {address}: {name}")
    return 0 if answer.status == health_pb2.HealthCheckResponse.SERVING else 1


STATUS = Command("status", _add_status_parser, status)
HEALTH = Command("health", _add_health_parser, health)
