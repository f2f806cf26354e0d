"""What the tests share besides fixtures: a daemon started for a test (the launcher `_daemon`, which the
benchmarks use too, plus a health check), readers built on TensorBoard's own, and polling helpers. `conftest.py`
keeps the fixtures.

`pyproject.toml` puts the repository root and `tests/` on `sys.path` (pytest's `pythonpath`), so test modules
import this as `_support`, and the launchers of the daemon and of SeaweedFS as `_daemon` and `_seaweed`.
"""

from __future__ import annotations

import glob
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event

from _daemon import Daemon, stop_process
from _daemon import start_daemon as launch_daemon
from summaryd.cli import main
from summaryd.client import SummaryWriter
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

__all__ = [
    "Daemon",
    "Loopback",
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


TENSORBOARD_SERVING = re.compile(r"TensorBoard \S+ at http://127\.0\.0\.1:(\d+)/")


class TensorBoard:
    """`tensorboard` with `flags` (its data: `--logdir` or `--grpc_data_provider`) on a loopback port the OS
    picks (read from its own "TensorBoard ... at" line, so no port is chosen in a race); stop it by its pid."""

    def __init__(self, flags: list[str], workdir: Path) -> None:
        self.log_path = workdir / "tensorboard.log"
        env = {**os.environ, "TMPDIR": str(workdir)}
        args = [sys.executable, "-m", "tensorboard.main", *flags, "--host", "127.0.0.1", "--port", "0"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        wait_for(
            lambda: self.proc.poll() is not None or TENSORBOARD_SERVING.search(self.log()), 120, "TensorBoard to serve"
        )
        match = TENSORBOARD_SERVING.search(self.log())
        assert match is not None, self.log()
        self.url = f"http://127.0.0.1:{match.group(1)}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def raw(self, path: str, **query: str) -> bytes:
        """The body of GET `path` (which may carry a query already) with `query` added."""
        url = self.url + path + (("&" if "?" in path else "?") + urllib.parse.urlencode(query) if query else "")
        with urllib.request.urlopen(url, timeout=30) as answer:
            data: bytes = answer.read()
            return data

    def get(self, path: str, **query: str) -> Any:
        return json.loads(self.raw(path, **query))


class _Recorder(grpc.ServerInterceptor):  # type: ignore[misc]
    """Records the method and metadata of every call before it is handled (whatever the method)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []
        self._lock = threading.Lock()

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        with self._lock:
            self.calls.append((details.method, {k: str(v) for k, v in details.invocation_metadata}))
        return continuation(details)

    def tokens(self) -> list[str]:
        with self._lock:
            return [m["authorization"] for _, m in self.calls if "authorization" in m]


class Loopback:
    """A real gRPC server on a free loopback port, recording every call's metadata."""

    def __init__(self, servicer: pb_grpc.SummariesServicer) -> None:
        self.recorder = _Recorder()
        self.server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[self.recorder])
        pb_grpc.add_SummariesServicer_to_server(servicer, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait()
