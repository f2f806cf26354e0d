"""A real TensorBoard serves what client processes log, while they are still logging.

For each loader (`--load_fast=false`: the Python multiplexer; `--load_fast=true`: the Rust data server, which
is what the default `auto` picks when the binary is installed) the test:

1. starts the daemon (`daemon` fixture) and a `tensorboard` process on the daemon's logdir, on a port the OS
   picks (`--port 0`; the port is read from TensorBoard's own "TensorBoard ... at http://127.0.0.1:PORT/"
   line, so there is no race between choosing a free port and binding it);
2. checks from the process tree which loader really runs: with `--load_fast=true` TensorBoard's child process
   is the `tensorboard_data_server` binary on our logdir (and its `rustboard_core` log lines are in
   TensorBoard's output); with `--load_fast=false` there is no such child. `--load_fast=true` makes
   TensorBoard exit instead of falling back to the Python loader when the binary cannot start, and the test
   checks at the end that TensorBoard and its data server are still running;
3. starts `WORLD` client processes that log scalar `loss` to run `exp` at steps 0, 1, 2, ... with a short
   pause per step, each recording what it logged (wall time, step, value) in a file *before* logging it; they
   keep logging until the test creates a stop file (reaching a step cap instead fails the test);
4. polls `/data/runs` and `/data/plugin/scalars/scalars?run=exp/rank-N&tag=loss` until every run is served
   and every run's served points have grown at least once, asserting at each such answer that every client
   process is still running and that the served points are exactly a prefix, in order, of what that client
   logged;
5. stops the clients (they `close()`, which returns once everything is on disk and synced), and polls until
   TensorBoard serves every point each client logged.

All waiting is polling against deadlines; the only sleeps are the pauses between polls and the pause inside
the clients' logging loop.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import tensorboard_data_server

from _support import Daemon, stop_process

WORLD = 3
RUN = "exp"
TAG = "loss"
CLIENT_PAUSE = 0.05  # seconds between two steps of a client
CLIENT_MAX_STEPS = 600  # safety cap (30 s of logging); stays below TensorBoard's 1000-point scalar reservoir
POLL = 0.1  # seconds between two polls

# One training process: logs `loss` at increasing steps until the stop file appears, then closes the writer.
# Each point goes to the record file before it is handed to the writer, so every point TensorBoard can serve
# is already in the record. Values are multiples of 1/4, exact in the float32 of `simple_value`.
CLIENT_SCRIPT = r"""
import json, os, sys, time
from summaryd.client import SummaryWriter

address, rank, world, stop_file, record_path, pause, max_steps = sys.argv[1:8]
rank, world, pause, max_steps = int(rank), int(world), float(pause), int(max_steps)
writer = SummaryWriter("exp", address=address, worker=f"rank-{rank}", world_size=world, aggregate=False)
step = 0
with open(record_path, "w") as record:
    while step < max_steps and not os.path.exists(stop_file):
        value = rank + step / 4
        wall_time = time.time()
        record.write(json.dumps([wall_time, step, value]) + "\n")
        record.flush()
        writer.add_scalar("loss", value, global_step=step, walltime=wall_time)
        step += 1
        time.sleep(pause)
report = writer.close(timeout=30)
summary = {"steps": step, "delivered": report.delivered, "undelivered": report.undelivered,
           "dropped": dict(report.dropped), "synced": report.synced, "error": report.error}
print(json.dumps(summary), flush=True)
sys.exit(0 if report.ok and report.synced and report.delivered == step else 1)
"""

SERVING = re.compile(r"TensorBoard \S+ at http://127\.0\.0\.1:(\d+)/")
Point = tuple[float, int, float]


@dataclass
class TensorBoard:
    """A `tensorboard` process started by the test; stopped by its pid."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    port: int = 0
    data_server_pid: int | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str, **query: str) -> Any:
        """GET a JSON route; None when TensorBoard answers 404 (no such run or tag yet)."""
        url = f"http://127.0.0.1:{self.port}{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as e:
            if e.code == 404:
                e.close()
                return None
            raise


@dataclass
class Client:
    rank: int
    proc: subprocess.Popen[bytes]
    record_path: Path
    out_path: Path
    served: list[list[Point]] = field(default_factory=list)  # distinct non-empty answers seen while running

    @property
    def run(self) -> str:
        return f"{RUN}/rank-{self.rank}"

    def logged(self) -> list[Point]:
        """What the client has logged so far (complete lines of its record)."""
        text = self.record_path.read_text() if self.record_path.exists() else ""
        return [tuple(json.loads(line)) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _children(pid: int) -> list[int]:
    """Pids whose parent is `pid`, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process went away while we looked
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _exe(pid: int) -> str:
    try:
        return os.path.realpath(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def _poll_until(what: str, check: Callable[[], Any], timeout: float, diagnostics: Callable[[], str]) -> Any:
    """Call `check` every POLL seconds until it returns something truthy; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{diagnostics()}")
        time.sleep(POLL)


@pytest.fixture
def tensorboard_factory(tmp_path: Path) -> Iterator[Callable[[Path, str], TensorBoard]]:
    """Starts `tensorboard` on a logdir with a given `--load_fast`; stops it (and its data server) by pid."""
    started: list[TensorBoard] = []

    def start(logdir: Path, load_fast: str) -> TensorBoard:
        log_path = tmp_path / f"tensorboard-{load_fast}.log"
        tmpdir = tmp_path / "tb-tmp"  # TensorBoard's info file and the data server's port file stay here
        tmpdir.mkdir(exist_ok=True)
        args = [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(logdir),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--reload_interval",
            "1",
            f"--load_fast={load_fast}",
        ]
        if load_fast == "true":
            args.append("--extra_data_server_flags=--verbose")  # the Rust server logs its load cycles
        env = {**os.environ, "TMPDIR": str(tmpdir)}
        env.pop("TENSORBOARD_DATA_SERVER_BINARY", None)  # the installed `tensorboard_data_server`, no other
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        tb = TensorBoard(proc, log_path)
        started.append(tb)
        return tb

    try:
        yield start
    finally:
        for tb in started:
            stop_process(tb.proc, 10)
            pids = [tb.data_server_pid] if tb.data_server_pid else []
            # The data server exits when TensorBoard's end of its stdin closes; make sure it did.
            deadline = time.monotonic() + 10
            while any(_alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(POLL)
            for p in pids:
                if _alive(p):
                    os.kill(p, signal.SIGKILL)


def _wait_serving(tb: TensorBoard, diagnostics: Callable[[], str]) -> None:
    """Read the port from TensorBoard's serving line, then poll until `/data/runs` answers."""

    def port() -> int:
        if tb.proc.poll() is not None:
            pytest.fail(f"tensorboard exited with {tb.proc.returncode}\n{diagnostics()}")
        match = SERVING.search(tb.log())
        return int(match.group(1)) if match else 0

    tb.port = _poll_until("TensorBoard's serving line", port, 30, diagnostics)

    def runs_answer() -> bool:
        try:
            return tb.get("/data/runs") is not None
        except (urllib.error.URLError, ConnectionError):
            return False

    _poll_until("TensorBoard to answer /data/runs", runs_answer, 15, diagnostics)


def _check_loader(tb: TensorBoard, logdir: Path, load_fast: str, diagnostics: Callable[[], str]) -> None:
    """Which loader serves: the Rust data server is TensorBoard's child process, or there is none."""
    binary = os.path.realpath(tensorboard_data_server.server_binary() or "")
    servers = [p for p in _children(tb.proc.pid) if binary and _exe(p) == binary]
    if load_fast == "false":
        assert servers == [], f"--load_fast=false started a data server {servers}\n{diagnostics()}"
        assert "rustboard_core" not in tb.log()
        return
    assert len(servers) == 1, f"no tensorboard_data_server child of TensorBoard ({binary})\n{diagnostics()}"
    (tb.data_server_pid,) = servers
    cmdline = Path(f"/proc/{tb.data_server_pid}/cmdline").read_bytes().split(b"\0")
    assert f"--logdir={logdir}".encode() in cmdline, cmdline
    _poll_until(
        "the data server's load-cycle log line",
        lambda: "rustboard_core::cli] Finished load cycle" in tb.log(),
        10,
        diagnostics,
    )


@pytest.mark.parametrize("load_fast", ["false", "true"])
def test_tensorboard_serves_scalars_while_clients_log(
    daemon: Daemon,
    tensorboard_factory: Callable[[Path, str], TensorBoard],
    tmp_path: Path,
    load_fast: str,
) -> None:
    began = time.monotonic()
    tb = tensorboard_factory(daemon.logdir, load_fast)
    clients: list[Client] = []

    def diagnostics() -> str:
        parts = [
            f"--- tensorboard (rc={tb.proc.poll()}) ---\n{tb.log()[-4000:]}",
            f"--- daemon ---\n{daemon.log()[-3000:]}",
        ]
        for c in clients:
            out = c.out_path.read_text(errors="replace") if c.out_path.exists() else ""
            parts.append(f"--- client {c.rank} (rc={c.proc.poll()}) ---\n{out[-2000:]}")
        return "\n".join(parts)

    daemon.logdir.mkdir(parents=True, exist_ok=True)
    _wait_serving(tb, diagnostics)
    _check_loader(tb, daemon.logdir, load_fast, diagnostics)
    tb_ready = time.monotonic()

    stop_file = tmp_path / "stop-clients"
    try:
        for rank in range(WORLD):
            out_path = tmp_path / f"client-{rank}.out"
            record_path = tmp_path / f"client-{rank}.jsonl"
            with open(out_path, "wb") as out:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        CLIENT_SCRIPT,
                        daemon.address,
                        str(rank),
                        str(WORLD),
                        str(stop_file),
                        str(record_path),
                        str(CLIENT_PAUSE),
                        str(CLIENT_MAX_STEPS),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            clients.append(Client(rank, proc, record_path, out_path))
        clients_started = time.monotonic()
        first_point: list[float] = []  # when TensorBoard first served a point of any run

        def served(client: Client) -> list[Point]:
            answer = tb.get("/data/plugin/scalars/scalars", run=client.run, tag=TAG)
            points = [(float(w), int(s), float(v)) for w, s, v in answer or []]
            logged = client.logged()  # read after the answer: a superset of what TensorBoard can have seen
            assert points == logged[: len(points)], (
                f"{client.run}: served points are not a prefix of what the client logged\n"
                f"served={points[:5]}...{points[-3:]}\nlogged={logged[:5]}...\n{diagnostics()}"
            )
            return points

        # Live: every run is served, and grows between TensorBoard's reloads, while every client still logs.
        def live() -> bool:
            for c in clients:
                points = served(c)
                running = [x.rank for x in clients if x.proc.poll() is None]
                if points and (not c.served or len(points) > len(c.served[-1])):
                    assert running == list(range(WORLD)), (
                        f"client(s) {set(range(WORLD)) - set(running)} finished before TensorBoard served "
                        f"{c.run} live\n{diagnostics()}"
                    )
                    c.served.append(points)
                    first_point[:] = first_point or [time.monotonic()]
            return all(len(c.served) >= 2 for c in clients)

        _poll_until("TensorBoard to serve growing scalars of every run while the clients log", live, 25, diagnostics)
        first_served = time.monotonic()
        runs = tb.get("/data/runs")
        assert sorted(runs) == [c.run for c in clients], runs
        live_counts = [len(c.served[-1]) for c in clients]

        # Finish: the clients stop, close (synced), and TensorBoard catches up to every logged point.
        stop_file.touch()
        for c in clients:
            try:
                rc = c.proc.wait(40)
            except subprocess.TimeoutExpired:
                pytest.fail(f"client {c.rank} did not finish\n{diagnostics()}")
            assert rc == 0, f"client {c.rank} exited with {rc}\n{diagnostics()}"
        closed = time.monotonic()

        for c in clients:
            summary = json.loads(c.out_path.read_text().strip().splitlines()[-1])
            logged = c.logged()
            assert summary["steps"] == len(logged) == summary["delivered"], summary
            assert [s for _, s, _ in logged] == list(range(len(logged)))
            assert len(logged) < CLIENT_MAX_STEPS, f"client {c.rank} hit the step cap, was not stopped"
            _poll_until(f"every point of {c.run}", lambda c=c, logged=logged: served(c) == logged, 20, diagnostics)
        done = time.monotonic()

        assert tb.proc.poll() is None, f"tensorboard died\n{diagnostics()}"
        if load_fast == "true":
            assert tb.data_server_pid is not None and _alive(tb.data_server_pid), (
                f"the data server is gone\n{diagnostics()}"
            )
            assert tb.data_server_pid in _children(tb.proc.pid)
        loader = f"data server pid {tb.data_server_pid}" if tb.data_server_pid else "Python loader"
        print(
            f"\n[load_fast={load_fast}, {loader}] tensorboard up {tb_ready - began:.1f} s; first point "
            f"served {first_point[0] - clients_started:.1f} s after the clients started, every run served "
            f"and grown at {first_served - clients_started:.1f} s ({live_counts} points, clients running); "
            f"clients closed at {closed - clients_started:.1f} s; all {[len(c.logged()) for c in clients]} "
            f"points served {done - closed:.1f} s after close; total {done - began:.1f} s"
        )
    finally:
        stop_file.touch()
        for c in clients:
            try:
                c.proc.wait(30)
            except subprocess.TimeoutExpired:
                stop_process(c.proc, 10)
