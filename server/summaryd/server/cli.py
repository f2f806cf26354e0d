"""`summaryd` command line: `serve`, `status`, `health`, `replay`; flags and `SUMMARYD_*` variables map onto
`Config`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from summaryd.server.config import Config, fields
from summaryd.server.logs import configure_logging

ENV_PREFIX = "SUMMARYD_"
DEFAULT_ADDRESS = "localhost:6065"


def _env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    for f in fields():
        if isinstance(f.default, bool):
            parser.add_argument(
                "--" + f.name.replace("_", "-"),
                dest=f.name,
                action="store_true",
                default=None,
                help=f"{f.metadata['help']} (env {_env_name(f.name)}=1)",
            )
            continue
        kind = f.type if isinstance(f.type, type) else {"str": str, "int": int, "float": float}[str(f.type)]
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=kind,
            default=None,
            metavar=f.metadata.get("metavar"),
            help=f"{f.metadata['help']} (env {_env_name(f.name)}, default {f.default!r})",
        )


def config_from(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str]) -> Config:
    """Flags win over `SUMMARYD_*` variables, which win over the defaults."""
    values: dict[str, Any] = {}
    for f in fields():
        flag = getattr(args, f.name, None)
        if flag is not None:
            values[f.name] = flag
            continue
        env = environ.get(_env_name(f.name))
        if env is not None and isinstance(f.default, bool):
            if env.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
                raise ValueError(f"{_env_name(f.name)}={env!r}: use 1/true/yes/on or 0/false/no/off")
            values[f.name] = env.lower() in ("1", "true", "yes", "on")
        elif env is not None:
            kind: type = type(f.default)
            try:
                values[f.name] = kind(env)
            except ValueError:
                raise ValueError(f"{_env_name(f.name)}={env!r} is not a valid {kind.__name__}") from None
    return Config(**values)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="summaryd",
        description="summaryd: one daemon writes the TensorBoard event files of many training processes.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="run the daemon",
        description="Serve gRPC clients and write their summaries as TensorBoard event files under --logdir. "
        "Every flag can also be set by the environment variable shown.",
    )
    _add_config_flags(serve)
    for name, text in (("status", "show runs and sessions of a running daemon"), ("health", "check a daemon")):
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument(
            "--address",
            default=os.environ.get(ENV_PREFIX + "ADDRESS", DEFAULT_ADDRESS),
            help=f"daemon address (env {ENV_PREFIX}ADDRESS, default {DEFAULT_ADDRESS})",
        )
        sub.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer")
        if name == "status":
            sub.add_argument("--json", action="store_true", help="print JSON for scripts")
    replay = commands.add_parser(
        "replay",
        help="deliver spooled events (and projector files) a client left behind",
        description="Deliver the events a client spooled while the daemon was away, exactly once: what the "
        "daemon holds already is skipped, so replaying twice writes nothing twice. The projector files kept "
        "beside them (SESSION.files) are uploaded in the same session. PATH is one spool (a directory with "
        "manifest.json) or a spool root holding several (SUMMARYD_SPOOL_DIR, by default "
        "~/.cache/summaryd/spool).",
    )
    replay.add_argument("path", metavar="PATH", help="a spool directory, or a directory of spools")
    replay.add_argument("--address", default=None, help="daemon address (default: the one the client was logging to)")
    replay.add_argument("--timeout", type=float, default=30.0, help="seconds each call may take")
    replay.add_argument("--json", action="store_true", help="print one JSON object per spool")
    return parser


def _status(address: str, timeout: float, as_json: bool) -> int:
    import grpc
    from google.protobuf.json_format import MessageToDict

    from summaryd.v1 import summaryd_pb2 as pb
    from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address) as channel:
        status = pb_grpc.SummariesStub(channel).GetStatus(pb.GetStatusRequest(), timeout=timeout)
    if as_json:
        print(json.dumps(MessageToDict(status, preserving_proto_field_name=True), indent=2))
        return 0
    print(f"logdir {status.logdir}  (summaryd {status.version})")
    print(f"{'RUN':<40} {'FILE':<58} {'EVENTS':>9} {'BYTES':>11} {'SESSIONS':>8}")
    for run in status.runs:
        print(
            f"{run.run_dir:<40} {run.event_file or '-':<58} {run.events_written:>9} {run.bytes_written:>11} "
            f"{run.sessions:>8}"
        )
    print()
    print(
        f"{'SESSION':<36} {'RUN':<30} {'WORKER':<10} {'HOST':<16} {'PID':>7} {'EVENTS':>9} {'ACKED':>9} "
        f"{'LAST SEEN':>9}"
    )
    for s in status.sessions:
        print(
            f"{s.session_id:<36} {s.run_dir:<30} {s.worker or '-':<10} {s.client.host:<16} {s.client.pid:>7} "
            f"{s.events_written:>9} {s.acked_sequence:>9} {s.idle_seconds:>7.1f}s"
        )
    print(
        f"\n{len(status.runs)} runs, {len(status.sessions)} sessions, "
        f"{sum(1 for run in status.runs if run.event_file)} open files"
    )
    return 0


def _health(address: str, timeout: float) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        with grpc.insecure_channel(address) as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        print(f"summaryd at {address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    print(f"summaryd at {address}: {name}")
    return 0 if answer.status == health_pb2.HealthCheckResponse.SERVING else 1


def _replay(path: str, address: str | None, timeout: float, as_json: bool) -> int:
    from pathlib import Path

    from summaryd.client._replay import replay

    results = replay(Path(path), address, timeout)
    if not results:
        print(f"{path}: no spool here (a spool is a directory holding manifest.json)", file=sys.stderr)
        return 1
    for result in results:
        print(json.dumps(result.to_json()) if as_json else result.describe())
    return 0 if all(r.ok for r in results) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `summaryd` console script."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command == "status":
        return _status(args.address, args.timeout, args.json)
    if args.command == "health":
        return _health(args.address, args.timeout)
    if args.command == "replay":
        return _replay(args.path, args.address, args.timeout, args.json)
    try:
        config = config_from(args, os.environ)
    except ValueError as exc:
        parser.error(str(exc))
    configure_logging(config.log_level, config.log_format)
    from summaryd.server.server import ListenError, run
    from summaryd.server.state import StateError

    log = logging.getLogger("summaryd")
    log.debug("config %s", dataclasses.asdict(config))
    try:
        run(config)
    except StateError as exc:
        log.error("%s", exc)
        return 1
    except ListenError as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
