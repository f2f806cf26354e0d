"""The one launcher of `summaryd serve` as a subprocess, for the tests and the benchmarks alike.

A daemon listens on a port the OS picks (`--listen 127.0.0.1:0`) and writes it to its port file once it
listens, so there is no race between choosing a free port and binding it. Processes started here are stopped
by their pid: SIGTERM, then SIGKILL if they do not exit in time. Nothing here imports pytest.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT = 30.0
STOP_TIMEOUT = 20.0


@dataclass
class Daemon:
    """A `summaryd serve` process on a loopback port."""

    proc: subprocess.Popen[bytes]
    logdir: Path
    port: int
    log_path: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM the daemon and wait for its exit code."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM the daemon, SIGKILL it if it has not exited within `timeout`; its exit code."""
        return stop_process(self.proc, timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_daemon(workdir: Path, *extra: str, logdir: Path | None = None) -> Daemon:
    """Start `python -m summaryd.server serve` on a free loopback port and wait until it listens.

    Args:
        workdir: where its port file and its log (stdout and stderr) go, under names of their own, so that
            several daemons can share one.
        extra: more `serve` arguments.
        logdir: its logdir; default `workdir/runs`.

    Raises:
        RuntimeError: the daemon exited, or did not listen within `START_TIMEOUT` (it is killed); with the end
            of its log.
    """
    logdir = logdir or workdir / "runs"
    started = time.monotonic_ns()
    port_file = workdir / f"port-{started}"
    log_path = workdir / f"daemon-{started}.log"
    command = [sys.executable, "-m", "summaryd.server", "serve", "--logdir", str(logdir)]
    command += ["--listen", "127.0.0.1:0", "--port-file", str(port_file), *extra]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        port = _wait_for_port(proc, port_file, log_path)
    except BaseException:
        stop_process(proc, 0)
        raise
    return Daemon(proc, logdir, port, log_path)


def _wait_for_port(proc: subprocess.Popen[bytes], port_file: Path, log_path: Path) -> int:
    # The daemon writes the port file, newline last, only once it listens.
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the daemon exited with {proc.returncode}:\n{tail(log_path)}")
        with contextlib.suppress(FileNotFoundError):
            text = port_file.read_text()
            if text.endswith("\n"):
                return int(text)
        time.sleep(0.02)
    raise RuntimeError(f"the daemon did not listen within {START_TIMEOUT}s:\n{tail(log_path)}")


def stop_process(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> int:
    """SIGTERM a process started here, by its pid; SIGKILL it if it has not exited within `timeout`. Its exit
    code."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
    return proc.wait()


def tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of a log."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
