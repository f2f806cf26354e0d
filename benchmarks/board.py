"""TensorBoard reads the daemon (issue 27's targets): how soon a point logged is in TensorBoard's HTTP API, and
how soon a logdir already on disk is.

One daemon with `--board-listen` and, on its logdir side by side in the same run, three real TensorBoards:
`--grpc_data_provider` on the board, and `--logdir` with RustBoard (`--load_fast=true`, what `tensorboard
--logdir` runs by default for a local logdir) and with the Python loader (`--load_fast=false`), both at their
default 5 s reload interval. A writer logs one `add_scalar` every `interval_ms`; a thread per TensorBoard asks
its `/data/plugin/scalars/scalars` every `poll_ms`. A point's latency is from its `add_scalar` returning until a
TensorBoard first answers with it; a point not served `wait_s` after the last was logged counts as unseen.

    python -m benchmarks.board [--points 200] [--interval-ms 50] [--poll-ms 10] [--wait-s 15]
    python -m benchmarks.board --startup [--runs 200] [--tags 10] [--steps 1000] [--limit-s 900] [--limit-mib 6144]
                               [--board-readers N] [--board-only]
    python -m benchmarks.board --bucket [--runs 200] [--tags 10] [--steps 1000]      (needs boto3)

`--startup`: a logdir of `runs` x `tags` x `steps` scalars (one `simple_value` an event, as `add_scalar` writes;
made from bytes and kept under `CACHE` by size, since a big one takes minutes) is read by each reader in turn,
timed until every run lists every tag and serves its last point (`Served`). The board three times: a daemon
started on the logdir with no saved index, timed from its start (it reads every run); the same daemon already
running, timed from TensorBoard's start (what a user meets: the daemon indexed the points as they were written,
or read them when it started); and the daemon stopped (saving its index) and started again, timed from its
start. Then RustBoard (`--load_fast=true`) and the Python loader (`--load_fast=false`), from TensorBoard's
start; a reader holding more than `--limit-mib` is stopped there (the Python loader keeps every event it read).
Each row: then 200 random `/data/plugin/scalars/scalars` queries, 200 Time Series `timeSeries` ones (one run's
tag), 20 `/data/plugin/scalars/tags` and 20 Time Series `tags` (p99), and the RSS of what holds the points (the
daemon, RustBoard's data server, the Python loader's TensorBoard).

`--bucket`: two daemons on a SeaweedFS bucket each write half of `runs` runs; TensorBoard on one daemon's board
(no bucket credentials) and TensorBoard's Python loader on `s3://` (boto3: RustBoard refuses `s3://`), each
timed from its start until every run is served, as above.

The figures depend on the machine's load (2 cores shared here): quote them with the command and the date.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _daemon import Daemon, start_daemon, stop_process
from _tensorboard import TensorBoard
from benchmarks._report import table
from benchmarks._run import running_daemon
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


CACHE = Path(tempfile.gettempdir()) / "summaryd-board-logdirs"
"""Where `--startup` keeps the logdirs it made, by size (a big one takes minutes to make): reused while whole."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def scalar_event(wall_time: float, step: int, tag: bytes, value: float) -> bytes:
    """`Event(wall_time, step, summary=Summary(value=[Value(tag, simple_value)]))` serialized, as protobuf does
    (fields in number order, a zero step left out), built from bytes: 20x quicker than building the message."""
    inner = b"\x0a" + _varint(len(tag)) + tag + b"\x15" + struct.pack("<f", value)
    summary = b"\x0a" + _varint(len(inner)) + inner
    step_field = b"\x10" + _varint(step) if step else b""
    return b"\x09" + struct.pack("<d", wall_time) + step_field + b"\x2a" + _varint(len(summary)) + summary


def make_logdir(logdir: Path, runs: int, tags: int, steps: int) -> None:
    """`runs` runs of one event file each: `tags` scalar tags at every step, one `simple_value` an event."""
    from tensorboard.compat.proto.event_pb2 import Event

    from summaryd.v1.wire import frame, frame_all

    names = [f"tag-{t}".encode() for t in range(tags)]
    for r in range(runs):
        run_dir = logdir / f"run-{r:04d}"
        run_dir.mkdir(parents=True)
        with open(run_dir / f"events.out.tfevents.1700000000.bench.{r}.0", "wb") as f:
            f.write(frame(Event(wall_time=1.7e9, file_version="brain.Event:2").SerializeToString()))
            for first in range(0, steps, 1000):
                f.write(
                    frame_all(
                        scalar_event(1.7e9 + step, step, name, step / (t + 1))
                        for step in range(first, min(first + 1000, steps))
                        for t, name in enumerate(names)
                    )
                )


def cached_logdir(runs: int, tags: int, steps: int) -> Path:
    """The logdir of that size under `CACHE`, made when missing (a marker file says it is whole)."""
    logdir = CACHE / f"{runs}x{tags}x{steps}"
    if (logdir / ".whole").exists():
        return logdir
    shutil.rmtree(logdir, ignore_errors=True)
    made = time.perf_counter()
    make_logdir(logdir, runs, tags, steps)
    (logdir / ".whole").touch()
    print(f"made {logdir} in {time.perf_counter() - made:.0f} s", file=sys.stderr)
    return logdir


class Served:
    """Whether a TensorBoard serves every run's every tag to its last step: every run lists every tag, and
    every run serves its last tag to the last step. That point is the last record of the run's events (steps
    in order, a step's tags in order), and every reader reads a run's records in order, so it is served only
    once everything before it is; asking for the other tags too would make the asking (about 20 MB of JSON
    per 500 runs and tag) outweigh the loading. A run served once is not asked again (no reader forgets)."""

    def __init__(self, tb: TensorBoard, size: Logdir) -> None:
        self.tb = tb
        self.size = size
        self.missing = {f"tag-{size.tags - 1}": [f"run-{r:04d}" for r in range(size.runs)]}

    def all(self) -> bool:
        names = [f"run-{r:04d}" for r in range(self.size.runs)]
        try:  # first the cheap question (every run and tag listed), so that asking does not slow the loading
            listed = self.tb.get("/data/plugin/scalars/tags")
        except (urllib.error.URLError, OSError, json.JSONDecodeError):
            return False
        if any(len(listed.get(n, {})) < self.size.tags for n in names):
            return False
        for tag, runs in self.missing.items():
            for at in range(0, len(runs), 500):  # 500 runs a request: one answer of ~20 MB of JSON at most
                form = urllib.parse.urlencode([("tag", tag), *(("runs", n) for n in runs[at : at + 500])]).encode()
                try:
                    with urllib.request.urlopen(self.tb.url + "/data/plugin/scalars/scalars_multirun", data=form) as a:
                        series = json.loads(a.read())
                except (urllib.error.URLError, OSError, json.JSONDecodeError):
                    return False
                done = {n for n in runs[at : at + 500] if series.get(n) and series[n][-1][1] == self.size.steps - 1}
                self.missing[tag] = [n for n in self.missing[tag] if n not in done]
        return not any(self.missing.values())


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def _query_p99(tb: TensorBoard, runs: int, tags: int) -> tuple[float, float, float, float]:
    """p99 of 200 random `scalars` queries, 200 Time Series ones (`timeSeries`, one run's tag), 20 `tags` and
    20 Time Series `tags` (every run's every tag of the scalars, histograms and images: 3 List calls)."""
    rng = random.Random(0)
    scalars, series, listing, series_listing = [], [], [], []
    for _ in range(200):
        run, tag = f"run-{rng.randrange(runs):04d}", f"tag-{rng.randrange(tags)}"
        started = time.perf_counter()
        tb.get("/data/plugin/scalars/scalars", run=run, tag=tag)
        scalars.append(time.perf_counter() - started)
    for _ in range(200):
        run, tag = f"run-{rng.randrange(runs):04d}", f"tag-{rng.randrange(tags)}"
        form = urllib.parse.urlencode({"requests": json.dumps([{"plugin": "scalars", "tag": tag, "run": run}])})
        started = time.perf_counter()
        with urllib.request.urlopen(tb.url + "/data/plugin/timeseries/timeSeries", data=form.encode()) as answer:
            answer.read()
        series.append(time.perf_counter() - started)
    for _ in range(20):
        started = time.perf_counter()
        tb.get("/data/plugin/scalars/tags")
        listing.append(time.perf_counter() - started)
        started = time.perf_counter()
        tb.get("/experiment/defaultExperimentId/data/plugin/timeseries/tags")
        series_listing.append(time.perf_counter() - started)
    quantiles = (statistics.quantiles(q, n=100)[98] for q in (scalars, series, listing, series_listing))
    return tuple(quantiles)  # type: ignore[return-value]


@dataclass(frozen=True)
class Logdir:
    """The startup logdir's size, how long a reader may take to serve it all, and how much memory (MiB) it may
    take meanwhile (the Python loader holds every event it read: stopped there, for the machine's sake)."""

    runs: int
    tags: int
    steps: int
    limit_s: float
    limit_mib: float = 6144.0


def _holder(tb: TensorBoard, daemon: Daemon | None) -> tuple[str, float]:
    """What holds the points, and its RSS (MiB)."""
    if daemon is not None:
        return "daemon", _rss_mib(daemon.pid)
    if "--load_fast=true" in tb.flags:
        return "RustBoard's server", sum(_rss_mib(c) for c in _children(tb.proc.pid))
    return "TensorBoard", _rss_mib(tb.proc.pid)


def _measure(name: str, tb: TensorBoard, started: float, daemon: Daemon | None, size: Logdir) -> list[Any]:
    """One row: `tb` (started at `started`) until every run's every tag serves its last step, then its
    queries' p99 and the RSS of what holds the points. The row's second item is the seconds (None: not
    within the limits)."""
    served = Served(tb, size)
    peak, why = 0.0, f"not within {size.limit_s:.0f} s"
    while not served.all():
        holder, rss = _holder(tb, daemon)
        peak = max(peak, rss)
        if peak > size.limit_mib:
            why = f"stopped at {peak / 1024:.1f} GiB after {time.perf_counter() - started:.0f} s"
            break
        if time.perf_counter() - started > size.limit_s:
            break
        time.sleep(0.5)
    else:
        loaded = time.perf_counter() - started
        p99s = [f"{p99 * 1000:.1f} ms" for p99 in _query_p99(tb, size.runs, size.tags)]
        holder, rss = _holder(tb, daemon)
        return [name, loaded, *p99s, f"{rss:.0f} MiB ({holder})"]
    return [name, None, why, "-", "-", "-", f"{peak:.0f} MiB ({holder})"]


def _board_rows(workdir: Path, logdir: Path, size: Logdir, flags: list[str]) -> list[list[Any]]:
    """The board's three rows: a daemon started on the logdir with no saved index (it reads every run), the
    same daemon already running (what a user meets most: it indexed the points as they were written, or read
    them when it started), and the daemon restarted (its index saved at its stop, taken up at its start)."""
    home = workdir / "board"
    home.mkdir()
    # The state directory not inside the cached logdir: each run starts with no saved index.
    daemon_flags = ["--state-dir", str(home / "state"), *flags]
    name = "TensorBoard on the board (--grpc_data_provider)"
    rows: list[list[Any]] = []

    def one(label: str, daemon_started: float | None, daemon: Daemon, board: str) -> list[Any]:
        place = home / f"tb-{len(rows)}"
        place.mkdir()
        started = time.perf_counter() if daemon_started is None else daemon_started
        tb = TensorBoard(["--grpc_data_provider", board], place)
        try:
            return _measure(f"{name}, {label}", tb, started, daemon, size)
        finally:
            stop_process(tb.proc, 10)

    board = f"127.0.0.1:{_free_port()}"
    started = time.perf_counter()
    daemon = start_daemon(home, "--log-level", "info", "--board-listen", board, *daemon_flags, logdir=logdir)
    try:
        rows.append(one("daemon started with no saved index (from its start)", started, daemon, board))
        print(rows[-1], file=sys.stderr)
        rows.append(one("daemon running", None, daemon, board))
        print(rows[-1], file=sys.stderr)
    finally:
        stopped = time.perf_counter()
        daemon.stop(timeout=600)
        print(f"daemon stopped (index saved) in {time.perf_counter() - stopped:.1f} s", file=sys.stderr)
    started = time.perf_counter()
    daemon = start_daemon(home, "--log-level", "info", "--board-listen", board, *daemon_flags, logdir=logdir)
    try:
        rows.append(one("daemon restarted, saved index (from its start)", started, daemon, board))
        print(rows[-1], file=sys.stderr)
    finally:
        daemon.stop(timeout=600)
    return rows


def startup(size: Logdir, daemon_flags: list[str], file_readers: bool = True) -> str:
    """The table of start → every run's scalars served, query p99 and RSS, one row per reader (the daemon's
    with `daemon_flags`; without `file_readers`, its rows alone)."""
    logdir = cached_logdir(size.runs, size.tags, size.steps)
    with tempfile.TemporaryDirectory(prefix="summaryd-board-startup-") as tmp:
        workdir = Path(tmp)
        rows = _board_rows(workdir, logdir, size, daemon_flags)
        for name, flags in list(READERS.items())[1:] if file_readers else ():
            home = workdir / f"tb-{len(rows)}"
            home.mkdir()
            started = time.perf_counter()
            tb = TensorBoard([f.format(logdir=logdir) for f in flags], home)
            try:
                rows.append(_measure(name, tb, started, None, size))
            finally:
                stop_process(tb.proc, 10)
            print(rows[-1], file=sys.stderr)
    rustboard = next((r[1] for r in rows if r[0].startswith("RustBoard")), None)
    for row in rows:
        seconds = row[1]
        row[1] = f"{seconds:.1f} s" if seconds is not None else row[2]
        if seconds is None:
            row[2] = "-"
        row.insert(2, f"{rustboard / seconds:.1f}x" if seconds and rustboard else "-")
    headers = ["reader", "start → all served", "vs RustBoard", "scalars p99", "time series p99", "tags p99"]
    headers += ["time series tags p99", "RSS"]
    return table(headers, rows, right=[False, *[True] * 7])


SETTLE_S = 10.0
"""After the bucket's runs are written, before a reader starts: a few seal (1 s) and follow (2 s) intervals."""


def bucket(runs: int, tags: int, steps: int, limit_s: float) -> str:
    """The table of TensorBoard start → every run of a bucket served: two daemons on SeaweedFS, each writing
    half the runs; TensorBoard on one daemon's board (no bucket credentials) against TensorBoard's Python
    loader on `s3://` (boto3; RustBoard refuses `s3://`)."""
    from _seaweed import create_bucket, start_seaweed

    def daemon_in(home: Path, url: str, *flags: str) -> Daemon:
        home.mkdir()
        return start_daemon(home, "--logdir", url, "--state-dir", str(home / "state"), *flags)

    size = Logdir(runs, tags, steps, limit_s)
    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory(prefix="summaryd-board-bucket-") as tmp:
        workdir = Path(tmp)
        seaweed = start_seaweed(workdir / "seaweed")
        daemons: list[Daemon] = []
        try:
            create_bucket(seaweed, "board")
            os.environ.update(seaweed.environment())
            url = "s3://board/logdir"
            board = f"127.0.0.1:{_free_port()}"
            fast = ("--seal-secs", "1", "--no-watch", "--log-level", "warning")
            daemons.append(daemon_in(workdir / "a", url, *fast, "--board-listen", board))
            daemons.append(daemon_in(workdir / "b", url, *fast))
            written = time.perf_counter()
            for r in range(runs):  # half through each daemon: the board's daemon follows the other's segments
                with SummaryWriter(f"run-{r:04d}", address=daemons[r % 2].address) as writer:
                    for step in range(steps):
                        for t in range(tags):
                            writer.add_scalar(f"tag-{t}", step / (t + 1), step)
            print(f"wrote {runs} runs in {time.perf_counter() - written:.0f} s", file=sys.stderr)
            time.sleep(SETTLE_S)  # the last segments sealed and uploaded, and followed: the bucket holds it all
            readers = {
                "TensorBoard on one daemon's board (--grpc_data_provider), both daemons running": [
                    "--grpc_data_provider",
                    board,
                ],
                "Python loader (--logdir s3://, boto3)": ["--logdir", url, "--load_fast=false"],
            }
            for name, flags in readers.items():
                home = workdir / f"tb-{len(rows)}"
                home.mkdir()
                started = time.perf_counter()
                tb = TensorBoard(flags, home)
                try:
                    rows.append(
                        _measure(name, tb, started, daemons[0] if "--grpc_data_provider" in flags else None, size)
                    )
                finally:
                    stop_process(tb.proc, 10)
                print(rows[-1], file=sys.stderr)
        finally:
            for daemon in daemons:
                daemon.stop()
            seaweed.stop()
    loader = rows[-1][1]
    for row in rows:
        seconds = row[1]
        row[1] = f"{seconds:.1f} s" if seconds is not None else row[2]
        row.insert(2, f"{loader / seconds:.1f}x" if seconds and loader else "-")
    headers = ["reader", "start → all served", "vs Python loader", "scalars p99", "time series p99", "tags p99"]
    headers += ["time series tags p99", "RSS"]
    return table(headers, rows, right=[False, *[True] * 7])


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--startup", action="store_true", help="a logdir on disk at start instead of live points")
    parser.add_argument("--bucket", action="store_true", help="a bucket logdir of two daemons (needs boto3)")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--tags", type=int, default=10)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--limit-s", type=float, default=900.0)
    parser.add_argument("--limit-mib", type=float, default=6144.0, help="stop a reader holding more (MiB)")
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--interval-ms", type=float, default=50.0)
    parser.add_argument("--poll-ms", type=float, default=10.0)
    parser.add_argument("--wait-s", type=float, default=15.0)
    parser.add_argument("--board-readers", type=int, help="the daemon's --board-readers (its default when absent)")
    parser.add_argument("--board-only", action="store_true", help="--startup: the daemon's rows alone")
    args = parser.parse_args()
    if args.bucket:
        print(bucket(args.runs, args.tags, args.steps, args.limit_s))
        print(
            f"\n{args.runs} runs x {args.tags} tags x {args.steps} steps in a SeaweedFS bucket, written through two "
            "daemons (half each); one reader at a time."
        )
        return
    if args.startup:
        readers = [] if args.board_readers is None else ["--board-readers", str(args.board_readers)]
        size = Logdir(args.runs, args.tags, args.steps, args.limit_s, args.limit_mib)
        print(startup(size, readers, file_readers=not args.board_only))
        print(
            f"\n{args.runs} runs x {args.tags} tags x {args.steps} steps on disk at start; default sampling "
            "(1,000 scalars a series); one reader at a time."
        )
        return
    print(live(args.points, args.interval_ms, args.poll_ms, args.wait_s))
    print(
        f"\n{args.points} points, one add_scalar every {args.interval_ms:g} ms; each TensorBoard asked every "
        f"{args.poll_ms:g} ms; latency from add_scalar returning until TensorBoard's HTTP API first serves it."
    )


if __name__ == "__main__":
    main()
