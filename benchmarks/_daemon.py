"""The summaryd daemon as a subprocess for one benchmark section, and a loopback address nobody serves."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_START_TIMEOUT = 30.0
_STOP_TIMEOUT = 20.0


@dataclass(frozen=True)
class Daemon:
    """A running `summaryd serve` on a loopback port."""

    address: str
    logdir: Path
    pid: int


@contextlib.contextmanager
def running_daemon(workdir: Path, *flags: str) -> Iterator[Daemon]:
    """Start `python -m summaryd.server serve [flags]` on port 0; stop it by its pid (SIGTERM, then SIGKILL)."""
    logdir = workdir / "daemon-logdir"
    port_file = workdir / "daemon.port"
    log_path = workdir / "daemon.log"
    port_file.unlink(missing_ok=True)
    command = [
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
        "--log-level",
        "warning",
        *flags,
    ]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        port = _wait_for_port(process, port_file, log_path)
        yield Daemon(f"127.0.0.1:{port}", logdir, process.pid)
    finally:
        _stop(process, log_path)


def _wait_for_port(process: subprocess.Popen[bytes], port_file: Path, log_path: Path) -> int:
    # The daemon writes the port file (with its newline) only once it listens.
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the daemon exited with {process.returncode}:\n{_tail(log_path)}")
        with contextlib.suppress(FileNotFoundError):
            text = port_file.read_text()
            if text.endswith("\n"):
                return int(text)
        time.sleep(0.02)
    raise RuntimeError(f"the daemon did not listen within {_START_TIMEOUT}s:\n{_tail(log_path)}")


def _stop(process: subprocess.Popen[bytes], log_path: Path) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(_STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    if process.returncode != 0:
        print(f"warning: the daemon exited with {process.returncode}:\n{_tail(log_path)}", file=sys.stderr)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


@contextlib.contextmanager
def refused_address() -> Iterator[str]:
    """A loopback address that refuses connections: its port stays bound (nobody else gets it) but never listens."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"
