"""What the tests share besides fixtures: a daemon started for a test (the launcher of `benchmarks._daemon`
plus a health check), readers built on TensorBoard's own, and polling helpers. `conftest.py` keeps the fixtures.

`pyproject.toml` puts the repository root and `tests/` on `sys.path` (pytest's `pythonpath`), so test modules
import this as `_support` and it imports the launcher as `benchmarks._daemon`.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event

from benchmarks._daemon import Daemon, stop_process
from benchmarks._daemon import start_daemon as launch_daemon
from benchmarks._tensorboard import TensorBoard
from summaryd.client import SummaryWriter
from summaryd.server.cli import main

__all__ = [
    "Daemon",
    "TensorBoard",
    "assert_whole_records",
    "event_files",
    "log_losses",
    "read_events",
    "replay",
    "start_daemon",
    "steps_in",
    "stop_process",
    "unused_port",
    "wait_for",
    "wait_healthy",
]


def wait_healthy(address: str, timeout: float = 20.0, credentials: grpc.ChannelCredentials | None = None) -> None:
    """Poll the gRPC health service until it answers SERVING."""
    deadline = time.monotonic() + timeout
    channel = grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                answer = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.02)


def start_daemon(
    tmp_path: Path, *extra: str, logdir: Path | None = None, credentials: grpc.ChannelCredentials | None = None
) -> Daemon:
    """A `summaryd serve` on a free loopback port (`logdir` default `tmp_path/runs`), answering its health
    check (over TLS with `credentials`)."""
    daemon = launch_daemon(tmp_path, *extra, logdir=logdir)
    try:
        wait_healthy(daemon.address, credentials=credentials)
    except BaseException:
        daemon.stop(0)
        raise
    return daemon


def event_files(run_dir: Path) -> list[Path]:
    return sorted(Path(p) for p in glob.glob(str(run_dir / "*tfevents*")))


def read_events(path: Path) -> list[Event]:
    """Every record of one event file, parsed, using TensorBoard's own loader (CRC-checked)."""
    return [Event.FromString(raw) for raw in RawEventFileLoader(str(path), detect_file_replacement=False).Load()]


def assert_whole_records(path: Path) -> int:
    """Assert TensorBoard's reader consumes the file to its very end (no torn or corrupt record); return count.

    The loader stops quietly at a bad CRC or a torn tail, so the record sizes it returned must add up to the
    file size.
    """
    records = list(RawEventFileLoader(str(path), detect_file_replacement=False).Load())
    framed = sum(8 + 4 + len(r) + 4 for r in records)
    assert framed == path.stat().st_size, f"{path}: readable records end at {framed} of {path.stat().st_size} bytes"
    return len(records)


def replay(
    path: Path, address: str, capsys: pytest.CaptureFixture[str] | None = None, *, keep: bool = False
) -> list[dict[str, object]]:
    """`summaryd replay PATH --address ADDRESS --json [--keep]`: as a user runs it, or (with `capsys`) in this
    process."""
    command = ["replay", str(path), "--address", address, "--json", *(["--keep"] if keep else [])]
    if capsys is None:
        argv = [sys.executable, "-m", "summaryd.server", *command]
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        out = done.stdout
    else:
        capsys.readouterr()
        assert main(command) == 0
        out = capsys.readouterr().out
    return [json.loads(line) for line in out.splitlines()]


def log_losses(writer: SummaryWriter, steps: range, tag: str = "loss", flush_every: int = 0) -> None:
    """Log `float(step)` under `tag` at every step of `steps` (flushing after every `flush_every` steps)."""
    for step in steps:
        writer.add_scalar(tag, float(step), step)
        if flush_every and (step + 1) % flush_every == 0:
            writer.flush(timeout=10)


def unused_port() -> int:
    """A loopback port nothing listens on (bound a moment, then released): a daemon that is away, or a port
    for a server a test starts next."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll `condition` until it is true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def steps_in(run_dir: Path) -> list[int]:
    """The steps of every summary in a run directory's event files, each file checked to be whole."""
    steps = []
    for path in event_files(run_dir):
        assert_whole_records(path)
        steps += [e.step for e in read_events(path) if e.HasField("summary")]
    return steps


ARTIFACTS = Path(os.environ.get("SUMMARYD_ARTIFACTS_DIR", Path(__file__).resolve().parent.parent / "artifacts"))
"""Where slow-tier tests keep what a person looks at (screenshots): `$SUMMARYD_ARTIFACTS_DIR`, or `artifacts/`."""


def screenshot(url: str, shot: Path, profile: Path) -> None:
    """A PNG of the page at `url` by headless Chromium (Debian's `chromium`), its profile in `profile`, once
    the page had 20 s of virtual time to draw."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "the slow tier needs Debian's chromium (apt-get install -y chromium)"
    shot.parent.mkdir(parents=True, exist_ok=True)
    shot.unlink(missing_ok=True)
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--screenshot={shot}",
        "--window-size=1400,1000",
        "--virtual-time-budget=20000",
        url,
    ]
    done = subprocess.run(command, capture_output=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert shot.stat().st_size > 10_000, "the screenshot is (nearly) empty"
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
