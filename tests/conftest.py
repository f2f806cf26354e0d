"""Shared fixtures: a real daemon process on a free loopback port, and readers built on TensorBoard's own."""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event

from summaryd.client import reset_global_step
from summaryd.client.hooks import SummaryWriterCache
from summaryd.server.cli import main


@dataclass
class Daemon:
    """A `summaryd serve` process started by a test; stopped by its pid."""

    proc: subprocess.Popen[bytes]
    logdir: Path
    port: int
    log_path: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM the daemon and wait for its exit code."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


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
    logdir = logdir or tmp_path / "runs"
    port_file = tmp_path / f"port-{time.monotonic_ns()}"
    log_path = tmp_path / f"daemon-{time.monotonic_ns()}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "summaryd.server",
                "serve",
                "--logdir",
                str(logdir),
                "--listen",
                "127.0.0.1:0",
                "--port-file",
                str(port_file),
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"daemon did not start:\n{log_path.read_text()}")
        time.sleep(0.02)
    daemon = Daemon(proc, logdir, int(port_file.read_text()), log_path)
    wait_healthy(daemon.address, credentials=credentials)
    return daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon on a fresh logdir; SIGTERM'd (then killed) by pid at the end."""
    d = start_daemon(tmp_path)
    try:
        yield d
    finally:
        # Hook writers close while their daemon is still there to confirm; the autouse fixture clears later.
        SummaryWriterCache.clear()
        if d.proc.poll() is None:
            os.kill(d.proc.pid, signal.SIGTERM)
            try:
                d.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(d.proc.pid, signal.SIGKILL)
                d.proc.wait()


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Daemons a test starts and appends here; each is killed by pid at the end if still running."""
    started: list[Daemon] = []
    try:
        yield started
    finally:
        for d in started:
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait(30)


@pytest.fixture(autouse=True)
def _private_spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spools of a test stay in its own folder, never in the user's cache."""
    monkeypatch.setenv("SUMMARYD_SPOOL_DIR", str(tmp_path / "spool"))


@pytest.fixture(autouse=True)
def _fresh_client_state() -> Iterator[None]:
    """Each test starts without a global step or cached hook writers."""
    reset_global_step()
    yield
    SummaryWriterCache.clear()
    reset_global_step()


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
