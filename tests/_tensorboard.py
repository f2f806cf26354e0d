"""A real `tensorboard` as a subprocess, for the benchmarks and the tests alike (nothing here imports pytest).

It listens on a loopback port the OS picks, read from its own "TensorBoard ... at" line, so no port is chosen
in a race; stop it by its pid (`_daemon.stop_process`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

START_TIMEOUT = 120.0
TENSORBOARD_SERVING = re.compile(r"TensorBoard \S+ at http://127\.0\.0\.1:(\d+)/")


class TensorBoard:
    """`tensorboard` with `flags` (its data: `--logdir` or `--grpc_data_provider`), its log and temporary files
    in `workdir`."""

    def __init__(self, flags: list[str], workdir: Path) -> None:
        self.flags = flags
        self.log_path = workdir / "tensorboard.log"
        env = {**os.environ, "TMPDIR": str(workdir)}
        args = [sys.executable, "-m", "tensorboard.main", *flags, "--host", "127.0.0.1", "--port", "0"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + START_TIMEOUT
        while not (match := TENSORBOARD_SERVING.search(self.log())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"TensorBoard did not serve within {START_TIMEOUT:.0f} s:\n{self.log()[-3000:]}")
            time.sleep(0.05)
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
