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
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from _daemon import Daemon, stop_process
from _daemon import start_daemon as launch_daemon
from _tensorboard import TensorBoard
from summaryd.cli import main
from summaryd.client import Sender, SummaryWriter
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

__all__ = [
    "FORKING_WRITER",
    "Daemon",
    "Loopback",
    "TensorBoard",
    "assert_whole_records",
    "cli",
    "event_files",
    "leave_a_spool",
    "log_losses",
    "metrics_port",
    "one_line",
    "read_events",
    "replay",
    "run_script",
    "scrape",
    "start_daemon",
    "steps_in",
    "stop_process",
    "summaryd_run",
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


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m summaryd.server ARGS` as a user runs it, without SUMMARYD_* variables of the test's own."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SUMMARYD_")}
    return subprocess.run(
        [sys.executable, "-m", "summaryd.server", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The one non-empty line of stderr, after checking the exit code and that nothing else was said."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, result.stderr
    assert result.returncode == code, result.stderr
    return lines[0]


def summaryd_run(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`summaryd run ARGS` as a user runs it, in `cwd`."""
    return subprocess.run(
        [sys.executable, "-m", "summaryd.server", "run", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# A writer made with the arguments given as JSON (its token, say: no SUMMARYD_TOKEN) forks a child that logs
# through it: the parent's courier delivers the child's outbox with the writer's settings, as the writer itself does.
FORKING_WRITER = textwrap.dedent(
    """
    import json, os, sys
    from summaryd.client import Sender, SummaryWriter

    writer = SummaryWriter(sys.argv[1], worker="", close_timeout=30, **json.loads(sys.argv[2]))
    writer.add_scalar("parent", 1.0, 0)
    assert writer.flush(timeout=10).delivered == 1  # the parent used gRPC: its children must not
    child = os.fork()
    if child == 0:
        writer.add_scalar("child", 2.0, 1)
        writer.close()
        os._exit(0)
    os.waitpid(child, 0)
    report = writer.close()
    print(json.dumps({"ok": report.ok, "delivered": report.delivered}))
    """
)


def run_script(script: str, args: list[str], environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -c script args`, bounded by a timeout."""
    return subprocess.run(
        [sys.executable, "-c", script, *args], env=environ, check=False, capture_output=True, text=True, timeout=120
    )


def leave_a_spool(spool_root: Path, port: int) -> Path:
    """A process that logged 3 events to a daemon that never answered and ended: its spool stays behind."""
    sender = Sender("left", address=f"127.0.0.1:{port}", spool_dir=spool_root, spool_after=0.1)
    for step in range(3):
        event = Event(step=step, summary=Summary(value=[Summary.Value(tag="x", simple_value=float(step))]))
        sender.submit(event.SerializeToString(), 40)
    wait_for(lambda: sender.report().spooled == 3, 30, "the events to be spooled")
    report = sender.close(timeout=0.5)
    assert report.spooled == 3 and report.spool_path is not None
    return Path(report.spool_path)


def metrics_port(daemon: Daemon) -> int:
    """The port of a daemon's metrics endpoint, as its log says once it serves them."""
    deadline = time.monotonic() + 10
    while not (match := re.search(r"metrics on http://[^:]+:(\d+)/metrics", daemon.log())):
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.05)
    return int(match.group(1))


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a metrics endpoint, by name and labels."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


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
