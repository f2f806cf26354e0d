"""What a framework calls on its step path costs the loop what torch's does, whatever the daemon does.

`flush()` with no arguments hands the queue to the sender and returns (waiting is `flush(timeout=...)`,
`flush(durable=True)`, `close()`); writers closing at exit share one deadline; a writer dropped without
`close()` stops its threads; the first line saying the daemon is away says what to do.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from _support import Daemon, steps_in, unused_port, wait_for
from summaryd.client import SummaryWriter
from summaryd.client._sender._loop import SenderLoop
from summaryd.client._spool import Spool

# Long enough that a flush() waiting for the stopped or absent daemon would outlast the test's own timeout.
NEVER = 3600.0


@pytest.fixture
def stopped(daemon: Daemon) -> Iterator[Daemon]:
    """The daemon, SIGSTOPped by the test through `os.kill`; always continued again before it is stopped."""
    try:
        yield daemon
    finally:
        os.kill(daemon.pid, signal.SIGCONT)


def test_flush_returns_while_the_daemon_is_stopped_and_the_events_arrive_after_it_resumes(
    stopped: Daemon,
) -> None:
    writer = SummaryWriter("stopped", address=stopped.address, rpc_timeout=NEVER, spool_after=NEVER)
    writer.add_scalar("loss", 0.0, 0)
    assert writer.flush(timeout=30).delivered == 1  # the session is open and streaming
    os.kill(stopped.pid, signal.SIGSTOP)
    for step in range(1, 6):
        writer.add_scalar("loss", float(step), step)
        report = writer.flush()  # as Lightning's logger.save() after every step
        # The daemon is stopped: nothing it could acknowledge has come back, yet flush() has returned.
        assert report.delivered == 1 and report.undelivered == step
    os.kill(stopped.pid, signal.SIGCONT)
    assert writer.flush(timeout=30).delivered == 6
    assert writer.close().ok
    assert steps_in(stopped.logdir / "stopped") == list(range(6))


def test_flush_returns_with_no_daemon_and_close_spools_what_it_holds(tmp_path: Path) -> None:
    writer = SummaryWriter("away", address=f"127.0.0.1:{unused_port()}", rpc_timeout=NEVER, spool_after=NEVER)
    for step in range(3):
        writer.add_scalar("loss", float(step), step)
        assert writer.flush().undelivered == step + 1
    report = writer.close(timeout=1.0)
    assert report.spooled == 3 and report.spool_path is not None


class Calls:
    """Counts the calls of one method (every instance), calling it as before: a probe, not a fake."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> None:
        self.count = 0
        original: Callable[..., object] = getattr(cls, name)

        def counted(*args: object, **kwargs: object) -> object:
            self.count += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(cls, name, counted)


@pytest.mark.parametrize("away", ["absent", "stopped"])
def test_a_loop_flushing_every_step_while_the_daemon_is_away_writes_the_spool_once_per_gap(
    away: str, stopped: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past `spool_after` the queue goes to disk in batches: a flush() per step is not a spool write and a
    wake-up of the sender thread per step (it was: about 800 of each a second for a loop of 1,000 steps a
    second), with no daemon there and with a stopped one whose stream is open."""
    spool_after = 0.3  # the gap is then 0.3 s too (SPILL_GAP_SECS is at most spool_after)
    address = stopped.address if away == "stopped" else f"127.0.0.1:{unused_port()}"
    writer = SummaryWriter("away", address=address, rpc_timeout=NEVER, spool_after=spool_after, spool_dir=tmp_path)
    if away == "stopped":
        writer.add_scalar("loss", 0.0, 0)
        assert writer.flush(timeout=30).delivered == 1  # streaming
        os.kill(stopped.pid, signal.SIGSTOP)
    writes, wakeups = Calls(monkeypatch, Spool, "append"), Calls(monkeypatch, SenderLoop, "_next_wakeup")
    started, step = time.monotonic(), 1
    while time.monotonic() - started < 2.0:
        writer.add_scalar("loss", float(step), step)
        writer.flush()  # as Lightning's logger.save() after every step
        step += 1
        time.sleep(0.001)
    assert step > 200, "the loop ran"
    # About one write per gap over the 1.7 s past spool_after, and the in-flight batches of the stopped stream.
    assert writes.count <= 30, f"{writes.count} spool writes for {step} flushes"
    # The stopped stream's tick (10 a second), the reconnect schedule, one per gap: not one per flush.
    assert wakeups.count <= 80, f"{wakeups.count} wake-ups of the sender thread for {step} flushes"
    if away == "stopped":
        os.kill(stopped.pid, signal.SIGCONT)
        assert writer.close(timeout=30).delivered == step
    else:
        assert writer.close(timeout=1.0).spooled == step - 1


def _sender_threads(before: set[threading.Thread]) -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t not in before)


def test_a_writer_dropped_without_close_delivers_and_stops_its_threads(daemon: Daemon) -> None:
    before = set(threading.enumerate())
    writer = SummaryWriter("dropped", address=daemon.address)
    for step in range(5):
        writer.add_scalar("loss", float(step), step)
    writer.add_scalars("pair", {"a": 1.0, "b": 2.0}, 0)  # sub-runs have senders of their own
    assert writer.flush(timeout=30).delivered == 7
    assert any(name.startswith("summaryd-sender") for name in _sender_threads(before))
    writer.add_scalar("loss", 5.0, 5)  # still queued when the writer is dropped
    del writer
    gc.collect()
    wait_for(lambda: not _sender_threads(before), 60, "the dropped writer's sender and gRPC threads to end")
    assert steps_in(daemon.logdir / "dropped") == list(range(6))


def test_patched_writers_exit_under_one_deadline_and_the_first_away_line_says_what_to_do(tmp_path: Path) -> None:
    """Four writers of `summaryd run` with no daemon: two closed by the script as a framework closes them,
    two left open. Each would wait its `close_timeout` (5 s) in turn; together they wait one."""
    address = f"127.0.0.1:{unused_port()}"
    script = textwrap.dedent(
        """
        import time
        import tensorboardX

        writers = [tensorboardX.SummaryWriter(f"runs/w{i}") for i in range(4)]
        for i, writer in enumerate(writers):
            writer.add_scalar("loss", float(i), 0)
            writer.flush()
        writers[0].close()
        writers[1].close()
        print("done", time.monotonic(), flush=True)
        """
    )
    (tmp_path / "train.py").write_text(script)
    command = [sys.executable, "-m", "summaryd.server", "run", "--address", address, "--", sys.executable, "train.py"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    exited = time.monotonic()
    finished = float(done.stdout.split("done ", 1)[1].split()[0])
    # In turn they would take 4 x 5 s at least; under one deadline about 5 s.
    assert exited - finished < 3 * 5.0, (exited - finished, done.stderr)
    away = [line for line in done.stderr.splitlines() if address in line and "summaryd serve" in line]
    assert away, done.stderr
    first = away[0]
    assert "UNAVAILABLE" not in first and "Connection refused" not in first
    assert "is `summaryd serve` running there?" in first and "`summaryd replay`" in first
    assert str(tmp_path / "spool") in first  # where the events wait for `summaryd replay`
