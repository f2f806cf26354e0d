"""Runs trials in fresh processes (`benchmarks._worker`), alone or several started at the same moment."""

from __future__ import annotations

import itertools
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parent.parent
_READY_TIMEOUT = 180.0
_counter = itertools.count(1)


class TrialError(RuntimeError):
    pass


class _Trial:
    """A trial process that has set up and waits for `go`."""

    def __init__(self, name: str, params: dict[str, Any], workdir: Path) -> None:
        number = next(_counter)
        self.name = name
        self.result_file = workdir / f"trial-{number}.json"
        self.stderr_file = workdir / f"trial-{number}.stderr"
        command = [sys.executable, "-m", "benchmarks._worker", name, json.dumps(params), str(self.result_file)]
        with open(self.stderr_file, "wb") as stderr:
            self.process = subprocess.Popen(
                command, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True
            )

    def _streams(self) -> tuple[IO[str], IO[str]]:
        assert self.process.stdin is not None and self.process.stdout is not None
        return self.process.stdin, self.process.stdout

    def wait_ready(self, deadline: float) -> None:
        _, stdout = self._streams()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([stdout], [], [], remaining)[0]:
                self.kill()
                raise TrialError(f"{self.name}: not ready within {_READY_TIMEOUT}s\n{self.stderr_tail()}")
            line = stdout.readline()
            if line == "ready\n":
                return
            if not line:
                self.process.wait()
                raise TrialError(f"{self.name}: exited with {self.process.returncode}\n{self.stderr_tail()}")

    def go(self) -> None:
        stdin, _ = self._streams()
        stdin.write("go\n")
        stdin.flush()

    def result(self, timeout: float) -> dict[str, Any]:
        try:
            self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TrialError(f"{self.name}: still running after {timeout}s\n{self.stderr_tail()}") from None
        if self.process.returncode != 0:
            raise TrialError(f"{self.name}: exited with {self.process.returncode}\n{self.stderr_tail()}")
        result: dict[str, Any] = json.loads(self.result_file.read_text())
        self.result_file.unlink()
        self.stderr_file.unlink()
        return result

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stderr_tail(self, lines: int = 30) -> str:
        text = self.stderr_file.read_text(errors="replace") if self.stderr_file.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def run_together(name: str, params: list[dict[str, Any]], workdir: Path, timeout: float) -> list[dict[str, Any]]:
    """Set up one process per params (all at once), start their timed parts together, return their results."""
    trials: list[_Trial] = []
    try:
        for one in params:
            trials.append(_Trial(name, one, workdir))
        deadline = time.monotonic() + _READY_TIMEOUT
        for trial in trials:
            trial.wait_ready(deadline)
        for trial in trials:
            trial.go()
        return [trial.result(timeout) for trial in trials]
    finally:
        for trial in trials:
            trial.kill()


def run_trial(name: str, params: dict[str, Any], workdir: Path, timeout: float) -> dict[str, Any]:
    """Run one trial in a fresh process."""
    return run_together(name, [params], workdir, timeout)[0]
