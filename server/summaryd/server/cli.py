"""`summaryd` command line: `serve`, `status`, `health`, `replay`, `run`, `ship`; flags and `SUMMARYD_*`
variables map onto `Config`."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from summaryd.server.config import Config, fields
from summaryd.server.operations.logs import configure_logging
from summaryd.v1.search_path import unshadow
from summaryd.v1.wire import DEFAULT_ADDRESS, VERSION

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from summaryd.client._channel import ChannelSettings
    from summaryd.v1 import summaryd_pb2 as pb

ENV_PREFIX = "SUMMARYD_"


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line that names the command and where its help is, not a screen of usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    for f in fields():
        if isinstance(f.default, bool):
            parser.add_argument(
                "--" + f.name.replace("_", "-"),
                dest=f.name,
                # A setting on by default is turned off by its --no- form.
                action=argparse.BooleanOptionalAction if f.default else "store_true",
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


def _build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each command's."""
    parser = _Parser(
        prog="summaryd",
        description="summaryd: one daemon writes the TensorBoard event files of many training processes.",
    )
    parser.add_argument("--version", action="version", version=f"summaryd {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    serve = commands.add_parser(
        "serve",
        help="run the daemon",
        description="Serve gRPC clients and write their summaries as TensorBoard event files under --logdir. "
        "Every flag can also be set by the environment variable shown.",
    )
    _add_config_flags(serve)
    subs: dict[str, argparse.ArgumentParser] = {"serve": serve}
    for name, text in (
        ("status", "show the open runs and live sessions of a running daemon"),
        ("health", "check a daemon"),
    ):
        sub = subs[name] = commands.add_parser(
            name,
            help=text,
            description=f"{text[0].upper()}{text[1:]}. Token and TLS come from the flags, else the variables the "
            "client reads (SUMMARYD_TOKEN, SUMMARYD_TLS_CA, SUMMARYD_TLS_CERT, SUMMARYD_TLS_KEY, SUMMARYD_TLS=1).",
        )
        sub.add_argument(
            "--address",
            default=None,
            help=f"daemon HOST:PORT (env {ENV_PREFIX}ADDRESS, default {DEFAULT_ADDRESS})",
        )
        _add_channel_flags(sub)
        sub.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer")
        if name == "status":
            sub.add_argument("--json", action="store_true", help="print one JSON object (schema in README)")
    replay = subs["replay"] = commands.add_parser(
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
    _add_redirect_flag(replay)
    replay.add_argument("--timeout", type=float, default=30.0, help="seconds each call may take")
    replay.add_argument("--json", action="store_true", help="print one JSON object per spool")
    replay.add_argument("--keep", action="store_true", help="keep a delivered spool (replaying it again sends nothing)")
    _add_zero_code_parsers(commands, subs)
    return parser, subs


def _add_zero_code_parsers(commands: Any, subs: dict[str, argparse.ArgumentParser]) -> None:
    """`run` and `ship`: logging through summaryd without a change to the training code."""
    address_help = f"daemon HOST:PORT (env {ENV_PREFIX}ADDRESS, default {DEFAULT_ADDRESS})"
    run = subs["run"] = commands.add_parser(
        "run",
        help="run a training command with torch's and tensorboardX's writers logging through summaryd",
        description="Run COMMAND with summaryd in place of torch.utils.tensorboard.SummaryWriter and "
        "tensorboardX.SummaryWriter (and their FileWriter): a sitecustomize put first on the child's PYTHONPATH "
        "patches them at start-up, so Lightning, Transformers and Ignite log to the daemon unchanged. A "
        "framework's local log_dir maps to a run below --run-root: relative paths as they are "
        "(lightning_logs/version_0) but for a first component naming a logdir root (runs/, torch's default, or "
        "the daemon's logdir by name: runs/linreg is linreg), one inside the daemon's logdir by its path there, "
        "other absolute ones relative to the working directory when below it, else whole without the leading "
        "'/'. Each rank of torchrun or accelerate launch writes to <run>/rank-N. With "
        "--ship DIR a shipper follows DIR beside the command, for writers in native code (tf.summary). Prints a "
        "banner, and at the end the writers' delivery report; exits with the command's code.",
        usage="summaryd run [--address A] [--run-root R] [--ship DIR [--state FILE]] -- COMMAND [ARG ...]",
    )
    run.add_argument("--address", default=None, help=address_help)
    _add_redirect_flag(run)
    run.add_argument(
        "--run-root",
        default=None,
        metavar="R",
        help=f"run path the local log_dirs go below (env {ENV_PREFIX}RUN_ROOT, default: none, the log_dir alone)",
    )
    run.add_argument("--ship", default=None, metavar="DIR", help="also ship the event files written under DIR")
    run.add_argument("--state", default=None, metavar="FILE", help="the shipper's checkpoint (see 'summaryd ship')")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND", help="the command, after '--'")
    ship = subs["ship"] = commands.add_parser(
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
    ship.add_argument("--address", default=None, help=f"{address_help}; several comma-separated are tried in turn")
    _add_redirect_flag(ship)
    ship.add_argument("--state", default=None, metavar="FILE", help="checkpoint file (default DIR/.summaryd-ship.json)")
    ship.add_argument("--poll", type=float, default=0.5, metavar="SECS", help="seconds between looks at DIR")
    ship.add_argument("--timeout", type=float, default=10.0, help="seconds each call to the daemon may take")


def _add_redirect_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redirect-allow",
        default=None,
        metavar="A,B",
        help=f"daemons beyond --address that a daemon may send this client to (a bucket logdir's run owner), "
        f"comma-separated (env {ENV_PREFIX}REDIRECT_ALLOW); a redirect to any other address is not followed",
    )


def _add_channel_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token", default=None, help="bearer token (env SUMMARYD_TOKEN)")
    parser.add_argument(
        "--tls-ca", default=None, metavar="FILE", help="PEM CA bundle of the daemon (env SUMMARYD_TLS_CA)"
    )
    parser.add_argument(
        "--tls-cert", default=None, metavar="FILE", help="PEM client certificate (env SUMMARYD_TLS_CERT)"
    )
    parser.add_argument("--tls-key", default=None, metavar="FILE", help="PEM key of --tls-cert (env SUMMARYD_TLS_KEY)")


def _channel_settings(args: argparse.Namespace) -> ChannelSettings:
    from summaryd.client._channel import ChannelSettings

    return ChannelSettings.from_environment(
        token=args.token, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key
    )


def _call(address: str, settings: ChannelSettings, call: str, timeout: float) -> Message:
    """One unary call (`status` or `health`) over a channel with the client's token and TLS.

    Raises:
        grpc.RpcError: the daemon could not be reached or refused the call.
    """
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from summaryd.client._channel import open_channel
    from summaryd.v1 import summaryd_pb2 as pb
    from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

    with open_channel(address, settings) as channel:
        if call == "status":
            answer: Message = pb_grpc.SummariesStub(channel).GetStatus(pb.GetStatusRequest(), timeout=timeout)
        else:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
    return answer


def _message_json(message: Message) -> dict[str, Any]:
    """Every field of `message` by its proto name, always present: integers as JSON numbers (64-bit ones too),
    strings, floats, booleans, nested messages as objects and repeated fields as lists."""
    result: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None:
            result[field.name] = [_message_json(item) for item in value] if field.is_repeated else _message_json(value)
        else:
            result[field.name] = list(value) if field.is_repeated else value
    return result


def _status(address: str, settings: ChannelSettings, timeout: float, as_json: bool) -> int:
    from summaryd.v1 import summaryd_pb2 as pb

    status = _call(address, settings, "status", timeout)
    assert isinstance(status, pb.GetStatusResponse)
    if as_json:
        print(json.dumps({"address": address, **_message_json(status)}, indent=2))
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
    open_files = sum(1 for run in status.runs if run.event_file)
    print(
        f"\n{_count(len(status.runs), 'open run')} (with a live session or an open event file; finished runs "
        f"stay in the logdir), {_count(len(status.sessions), 'live session')}, {_count(open_files, 'open file')}"
    )
    return 0


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


def _client_command(args: argparse.Namespace, sub: argparse.ArgumentParser) -> int:
    """`status` or `health`: every failure is one line on stderr."""
    import grpc

    from summaryd.client._environment import resolve_address

    try:
        address = resolve_address(args.address)
        settings = _channel_settings(args)
    except ValueError as exc:
        sub.error(str(exc))
    try:
        if args.command == "status":
            return _status(address, settings, args.timeout, args.json)
        return _health(address, settings, args.timeout)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        print(f"summaryd at {address}: {code.name if code else 'ERROR'}: {details}", file=sys.stderr)
    except OSError as exc:  # a TLS file that cannot be read
        print(f"summaryd {args.command}: {exc.strerror or exc}: {exc.filename}", file=sys.stderr)
    return 1


def _replay(args: argparse.Namespace, sub: argparse.ArgumentParser) -> int:
    from pathlib import Path

    from summaryd.client._sender._replay import replay

    try:
        results = replay(
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


def _run(args: argparse.Namespace, sub: argparse.ArgumentParser) -> int:
    from pathlib import Path

    from summaryd.client._environment import resolve_addresses, resolve_redirect_allow
    from summaryd.client._patch._launch import run_command

    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        sub.error("give the command to run after '--', e.g. summaryd run -- python train.py")
    try:
        # Every address, in order: the command's writers and the shipper fail over between them.
        address = ",".join(resolve_addresses(args.address))
        redirect_allow = ",".join(resolve_redirect_allow(args.redirect_allow))
    except ValueError as exc:
        sub.error(str(exc))
    run_root = args.run_root if args.run_root is not None else os.environ.get(ENV_PREFIX + "RUN_ROOT", "")
    ship_dir = Path(args.ship) if args.ship else None
    state = Path(args.state) if args.state else None
    return run_command(
        command, address=address, run_root=run_root, ship_dir=ship_dir, state_path=state, redirect_allow=redirect_allow
    )


def _ship_reporting(args: argparse.Namespace, sub: argparse.ArgumentParser) -> int:
    """`ship`, saying on stderr what the shipper finds on the way (a file replaced, a corrupt record), a line each."""
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

    from summaryd.client._patch._shipper import ShipError, Shipper
    from summaryd.client._sender._targets import RedirectRefusedError

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
        code = exc.code() if isinstance(exc, grpc.Call) else None
        shipper.totals.stopped_by(
            f"{code.name if code else 'ERROR'}: {exc.details() if isinstance(exc, grpc.Call) else exc}"
        )
        totals = shipper.totals
    except (ShipError, RedirectRefusedError) as exc:
        shipper.totals.stopped_by(str(exc))
        totals = shipper.totals
    print(f"summaryd ship: {totals.describe()}", file=sys.stderr)
    return 1 if totals.error else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `summaryd` console script."""
    unshadow()  # before a command imports the client: the working directory may be on sys.path
    parser, subs = _build_parser()
    args, unknown = parser.parse_known_args(argv)
    sub = subs[args.command]
    if unknown:
        # Told by the command's parser, not the top-level one: its help is where the right flag is.
        known = [option for action in sub._actions for option in action.option_strings]
        hints = [match for flag in unknown for match in difflib.get_close_matches(flag.split("=")[0], known, 1)]
        sub.error(
            f"unrecognized arguments: {' '.join(unknown)}" + (f"; did you mean {', '.join(hints)}?" if hints else "")
        )
    if args.command in ("status", "health"):
        return _client_command(args, sub)
    if args.command == "replay":
        return _replay(args, sub)
    if args.command == "run":
        return _run(args, sub)
    if args.command == "ship":
        return _ship_reporting(args, sub)
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


if __name__ == "__main__":
    sys.exit(main())
