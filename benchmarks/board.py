"""TensorBoard reads the daemon (issue 27's targets): how soon a point logged is in TensorBoard's HTTP API.

One daemon with `--board-listen` and, on its logdir side by side in the same run, three real TensorBoards:
`--grpc_data_provider` on the board, and `--logdir` with RustBoard (`--load_fast=true`, what `tensorboard
--logdir` runs by default for a local logdir) and with the Python loader (`--load_fast=false`), both at their
default 5 s reload interval. A writer logs one `add_scalar` every `interval_ms`; a thread per TensorBoard asks
its `/data/plugin/scalars/scalars` every `poll_ms`. A point's latency is from its `add_scalar` returning until a
TensorBoard first answers with it; a point not served `wait_s` after the last was logged counts as unseen.

    python -m benchmarks.board [--points 200] [--interval-ms 50] [--poll-ms 10] [--wait-s 15]

The figures depend on the machine's load (2 cores shared here): quote them with the command and the date.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import threading
import time
import urllib.error
from pathlib import Path

from benchmarks._daemon import running_daemon, stop_process
from benchmarks._report import table
from benchmarks._tensorboard import TensorBoard
from summaryd.client import SummaryWriter

RUN, TAG = "live", "loss"
READERS = {
    "TensorBoard on the board (--grpc_data_provider)": ["--grpc_data_provider", "{board}"],
    "RustBoard (--logdir, --load_fast=true)": ["--logdir", "{logdir}", "--load_fast=true"],
    "Python loader (--logdir, --load_fast=false)": ["--logdir", "{logdir}", "--load_fast=false"],
}


class Poller(threading.Thread):
    """Asks one TensorBoard for the run's points every `poll_s`, noting when each step is first served."""

    def __init__(self, tensorboard: TensorBoard, poll_s: float) -> None:
        super().__init__(daemon=True)
        self.tensorboard = tensorboard
        self.poll_s = poll_s
        self.seen: dict[int, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                points = self.tensorboard.get("/data/plugin/scalars/scalars", run=RUN, tag=TAG)
            except (urllib.error.URLError, OSError, json.JSONDecodeError):
                points = []  # not known yet: TensorBoard answers 400 for a run it has not loaded
            now = time.perf_counter()
            for _, step, _ in points:
                self.seen.setdefault(int(step), now)
            time.sleep(self.poll_s)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def live(points: int, interval_ms: float, poll_ms: float, wait_s: float) -> str:
    """The table of point logged → served, one row per TensorBoard."""
    with tempfile.TemporaryDirectory(prefix="summaryd-board-bench-") as tmp:
        workdir = Path(tmp)
        board = f"127.0.0.1:{_free_port()}"
        with running_daemon(workdir, "--board-listen", board) as daemon:
            tensorboards: dict[str, TensorBoard] = {}
            try:
                for name, flags in READERS.items():
                    home = workdir / f"tb-{len(tensorboards)}"
                    home.mkdir()
                    args = [f.format(board=board, logdir=daemon.logdir) for f in flags]
                    tensorboards[name] = TensorBoard(args, home)
                pollers = {name: Poller(tb, poll_ms / 1000) for name, tb in tensorboards.items()}
                for poller in pollers.values():
                    poller.start()
                logged: dict[int, float] = {}
                with SummaryWriter(RUN, address=daemon.address) as writer:
                    for step in range(points):
                        writer.add_scalar(TAG, step / 4, step)
                        logged[step] = time.perf_counter()
                        time.sleep(interval_ms / 1000)
                    deadline = time.perf_counter() + wait_s
                    while time.perf_counter() < deadline and any(len(p.seen) < points for p in pollers.values()):
                        time.sleep(0.1)
                for poller in pollers.values():
                    poller.stop.set()
                    poller.join()
            finally:
                for tb in tensorboards.values():
                    stop_process(tb.proc, 10)
    rows: list[list[str]] = []
    for name, poller in pollers.items():
        latencies = [poller.seen[s] - logged[s] for s in logged if s in poller.seen]
        if latencies:
            tail = statistics.quantiles(latencies, n=100)[98] if len(latencies) > 1 else latencies[0]
            p50, p99 = f"{statistics.median(latencies):.3f} s", f"{tail:.3f} s"
        else:
            p50 = p99 = f"not within {wait_s:.0f} s"
        rows.append([name, f"{len(latencies)} of {points}", p50, p99])
    return table(["reader", "points served", "p50", "p99"], rows, right=[False, True, True, True])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--interval-ms", type=float, default=50.0)
    parser.add_argument("--poll-ms", type=float, default=10.0)
    parser.add_argument("--wait-s", type=float, default=15.0)
    args = parser.parse_args()
    print(live(args.points, args.interval_ms, args.poll_ms, args.wait_s))
    print(
        f"\n{args.points} points, one add_scalar every {args.interval_ms:g} ms; each TensorBoard asked every "
        f"{args.poll_ms:g} ms; latency from add_scalar returning until TensorBoard's HTTP API first serves it."
    )


if __name__ == "__main__":
    main()
