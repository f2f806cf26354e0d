"""`summaryd run`: a command run with summaryd in place of torch's and tensorboardX's writers.

The child gets the `sitecustomize` of `_bootstrap` first on its `PYTHONPATH` (it calls `patch()` and then
the `sitecustomize` it shadows), the daemon's address and the run root in `SUMMARYD_ADDRESS` and
`SUMMARYD_RUN_ROOT`, the daemon's logdir (asked once) in `SUMMARYD_DAEMON_LOGDIR`, and a file its writers
append their delivery reports to; with `ship_dir`, a shipper follows that directory beside it (for writers in
native code) and drains once the child has exited.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TextIO

import grpc

from summaryd.client._channel import ChannelSettings
from summaryd.client._patch import DAEMON_LOGDIR_ENV, REPORT_ENV, RUN_ROOT_ENV
from summaryd.client._patch._shipper import Shipper, ship_until
from summaryd.client._sender import DeliveryReport

BOOTSTRAP = str(Path(__file__).with_name("_bootstrap"))


def child_environment(
    environ: Mapping[str, str],
    address: str,
    run_root: str,
    report_path: str,
    redirect_allow: str = "",
    daemon_logdir: str = "",
) -> dict[str, str]:
    """The child's environment: ours, with the bootstrap first on `PYTHONPATH` and summaryd's settings."""
    path = [BOOTSTRAP, *(p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP)]
    extra = {DAEMON_LOGDIR_ENV: daemon_logdir} if daemon_logdir else {}
    return {
        **environ,
        "PYTHONPATH": os.pathsep.join(path),
        "SUMMARYD_ADDRESS": address,
        "SUMMARYD_REDIRECT_ALLOW": redirect_allow,
        RUN_ROOT_ENV: run_root,
        REPORT_ENV: report_path,
        **extra,
    }


LOOPBACK = ("localhost", "127.", "[::1]", "::1", "unix:")


def daemon_logdir(address: str, settings: ChannelSettings | None, timeout: float = 2.0) -> str:
    """The first daemon's logdir as its writers' run paths need it (see `_patch.run_path`): the whole path for a
    daemon on this machine, only its name for one elsewhere (its paths are not this machine's); "" when it
    does not answer within `timeout` (the command runs all the same)."""
    from summaryd.client._channel import open_channel
    from summaryd.v1 import summaryd_pb2 as pb
    from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

    first = address.split(",", maxsplit=1)[0].strip()
    try:
        with open_channel(first, settings or ChannelSettings.from_environment()) as channel:
            status = pb_grpc.SummariesStub(channel).GetStatus(pb.GetStatusRequest(), timeout=timeout)
    except grpc.RpcError:
        return ""
    logdir = str(status.logdir)
    if "://" in logdir or first.startswith(LOOPBACK):
        return logdir
    return os.path.basename(os.path.normpath(logdir))


def reports_in(path: Path) -> tuple[int, DeliveryReport]:
    """How many writers reported, and their reports added up."""
    delivered = undelivered = 0
    dropped: dict[str, int] = {}
    count = 0
    if path.exists():
        for line in path.read_text().splitlines():
            report = json.loads(line)
            count += 1
            delivered += report["delivered"]
            undelivered += report["undelivered"]
            for reason, n in report["dropped"].items():
                dropped[reason] = dropped.get(reason, 0) + n
    return count, DeliveryReport(delivered=delivered, undelivered=undelivered, dropped=dropped)


def run_command(
    command: Sequence[str],
    *,
    address: str,
    run_root: str,
    ship_dir: Path | None = None,
    state_path: Path | None = None,
    channel_settings: ChannelSettings | None = None,
    redirect_allow: str = "",
    out: TextIO = sys.stderr,
) -> int:
    """Run `command` patched; return its exit code (128 + signal number when a signal ended it).

    SIGINT and SIGTERM are passed on to the child; the shipper (with `ship_dir`) drains after the child ends.
    The writers and the shipper follow a redirect only to `address` or `redirect_allow` (comma-separated).
    """
    shipping = f", shipping {ship_dir}" if ship_dir is not None else ""
    print(f"summaryd run: daemon {address}, run root {run_root or '.'}{shipping}: {' '.join(command)}", file=out)
    stop = threading.Event()
    shipper = thread = None
    if ship_dir is not None:
        shipper = Shipper(
            ship_dir,
            run_root or ship_dir.name,
            address=address,
            redirect_allow=redirect_allow,
            channel_settings=channel_settings,
            state_path=state_path,
        )
        thread = ship_until(stop, shipper)
    with tempfile.TemporaryDirectory(prefix="summaryd-run-") as scratch:
        report_path = Path(scratch) / "reports.jsonl"
        logdir = daemon_logdir(address, channel_settings)
        environment = child_environment(os.environ, address, run_root, str(report_path), redirect_allow, logdir)
        child = subprocess.Popen(command, env=environment)

        def forward(signum: int, _frame: FrameType | None) -> None:
            child.send_signal(signum)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            code = child.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        writers, report = reports_in(report_path)
    dropped = ", ".join(f"{n} {reason}" for reason, n in report.dropped.items() if n) or "none"
    print(
        f"summaryd run: {writers} writer{'' if writers == 1 else 's'} delivered {report.delivered} events, "
        f"{report.undelivered} undelivered, "
        f"dropped {dropped}",
        file=out,
    )
    if shipper is not None and thread is not None:
        stop.set()
        thread.join()
        print(f"summaryd run: ship {shipper.totals.describe()}", file=out)
        if shipper.totals.error and code == 0:
            code = 1
    return code if code >= 0 else 128 - code
