"""Client processes that die, go quiet, are terminated or exit carelessly; a daemon that hangs.

Covers a client SIGKILLed mid-run (what it had acknowledged is in the file, the daemon
releases the session after its lease, a new session writes a new file that sorts last), the lease renewed by
heartbeats, and the exit paths: SIGTERM and interpreter exit deliver (or spool), `close()` keeps its timeout
against a daemon that stopped answering.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from _support import Daemon, event_files, read_events, start_daemon, steps_in, unused_port, wait_for
from summaryd.client import SummaryWriter
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc


def status(daemon: Daemon) -> pb.GetStatusResponse:
    with grpc.insecure_channel(daemon.address) as channel:
        answer: pb.GetStatusResponse = pb_grpc.SummariesStub(channel).GetStatus(pb.GetStatusRequest(), timeout=10)
        return answer


@pytest.fixture
def leased_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon whose sessions expire after one silent second."""
    d = start_daemon(tmp_path, "--session-lease", "1")
    try:
        yield d
    finally:
        d.terminate()


# Logs forever; after each flush it records how many events the daemon has acknowledged.
VICTIM = textwrap.dedent(
    """
    import os, sys, time
    from summaryd.client import SummaryWriter

    progress = sys.argv[1]
    writer = SummaryWriter("victim", worker="")
    step = 0
    while True:
        writer.add_scalar("loss", step, step)
        step += 1
        if step % 200 == 0:
            delivered = writer.flush(timeout=10).delivered
            with open(progress + ".tmp", "w") as f:
                f.write(str(delivered))
            os.replace(progress + ".tmp", progress)
            time.sleep(0.01)
    """
)


def test_a_sigkilled_client_is_released_after_its_lease(leased_daemon: Daemon, tmp_path: Path) -> None:
    """Everything the client saw acknowledged is in the file, once and in order; after the lease the daemon
    releases the session and closes the file; the next session on the run writes a new file that sorts last."""
    daemon, progress = leased_daemon, tmp_path / "acked"
    env = {**os.environ, "SUMMARYD_ADDRESS": daemon.address, "SUMMARYD_SPOOL_DIR": str(tmp_path / "spool")}
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, str(progress)], env=env, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: progress.exists() and int(progress.read_text()) >= 2000, 60, "2000 acknowledged events")
        acked = int(progress.read_text())
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.monotonic()
    finally:
        victim.kill()
        victim.wait(30)
    wait_for(lambda: not status(daemon).sessions and not status(daemon).runs, 30, "the session to be released")
    released_after = time.monotonic() - killed_at
    print(f"released {released_after:.2f}s after the kill (lease 1s)")
    assert released_after < 1 + 5
    # The run leaves the status as it is released; the file is closed, then the release logged, just after.
    released = "released after 1s without a batch or heartbeat"
    wait_for(lambda: released in daemon.log(), 10, "the release to be logged")
    assert os.listdir(daemon.logdir / ".summaryd" / "open") == [], "the file was not closed"
    [first] = event_files(daemon.logdir / "victim")
    steps = steps_in(daemon.logdir / "victim")
    assert len(steps) >= acked and steps == list(range(len(steps)))

    with SummaryWriter("victim", address=daemon.address, worker="", spool_dir=tmp_path / "spool") as writer:
        writer.add_scalar("loss", -1, 0)
    files = event_files(daemon.logdir / "victim")
    assert len(files) == 2 and files[0] == first and files[1].name > first.name
    assert [e.step for e in read_events(files[1]) if e.HasField("summary")] == [0]


@pytest.mark.slow
def test_heartbeats_keep_a_quiet_client_s_session(leased_daemon: Daemon, tmp_path: Path) -> None:
    """A client that is alive but has nothing to log for several leases keeps its session and its file."""
    daemon = leased_daemon
    writer = SummaryWriter("quiet", address=daemon.address, worker="", spool_dir=tmp_path / "spool")
    writer.add_scalar("x", 1.0, 0)
    assert writer.flush(timeout=10).delivered == 1
    [session] = [s.session_id for s in status(daemon).sessions if s.run_dir == "quiet"]
    time.sleep(3.5)  # the scenario itself: three and a half leases of silence from the training loop
    assert [s.session_id for s in status(daemon).sessions if s.run_dir == "quiet"] == [session]
    writer.add_scalar("x", 2.0, 1)
    assert writer.close().ok
    assert len(event_files(daemon.logdir / "quiet")) == 1
    assert "released" not in daemon.log()


# A training process that logs, then either exits without close() or waits to be terminated.
ENDING = textwrap.dedent(
    """
    import sys, time
    from summaryd.client import SummaryWriter

    ending, ready = sys.argv[1], sys.argv[2]
    writer = SummaryWriter("ending", worker="", close_timeout=1.5)
    for step in range(5000):
        writer.add_scalar("loss", step, step)
    if ending == "exit":
        sys.exit(0)  # no close(): atexit delivers
    open(ready, "w").close()
    while True:
        time.sleep(0.01)
    """
)


@pytest.mark.parametrize(
    "daemon_up", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["daemon-up", "daemon-down"]
)
@pytest.mark.parametrize("ending", ["sigterm", "exit"])
def test_exit_and_sigterm_deliver_or_spool(daemon: Daemon, tmp_path: Path, ending: str, daemon_up: bool) -> None:
    """Without close(): at interpreter exit, and on SIGTERM (the process still dies of SIGTERM), every event
    reaches the daemon, or, with the daemon away, the spool (from which replay delivers it)."""
    address = daemon.address if daemon_up else f"127.0.0.1:{unused_port()}"
    spool_root, ready = tmp_path / "spool", tmp_path / "ready"
    env = {**os.environ, "SUMMARYD_ADDRESS": address, "SUMMARYD_SPOOL_DIR": str(spool_root)}
    proc = subprocess.Popen(
        [sys.executable, "-c", ENDING, ending, str(ready)], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        if ending == "sigterm":
            wait_for(lambda: ready.exists() or proc.poll() is not None, 60, "the process to have logged")
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == (-signal.SIGTERM if ending == "sigterm" else 0), err
    if daemon_up:
        assert steps_in(daemon.logdir / "ending") == list(range(5000)), err
        assert "session" in daemon.log() and "closed: run ending, 5000 events written" in daemon.log()
        assert not spool_root.exists() or list(spool_root.iterdir()) == []
    else:
        [spool] = list(spool_root.iterdir())
        assert "summaryd replay" in err
        done = subprocess.run(
            [sys.executable, "-m", "summaryd.server", "replay", str(spool), "--address", daemon.address],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and "delivered 5000 events" in done.stdout, done.stdout + done.stderr
        assert steps_in(daemon.logdir / "ending") == list(range(5000))


def test_close_keeps_its_timeout_when_the_daemon_stops_answering(tmp_path: Path) -> None:
    """A daemon that hangs (SIGSTOP: connections open, nothing answered): close(timeout=1) returns in time
    and what was not acknowledged is in the spool."""
    daemon = start_daemon(tmp_path)
    try:
        writer = SummaryWriter("hung", address=daemon.address, worker="", spool_dir=tmp_path / "spool", rpc_timeout=30)
        writer.add_scalar("loss", 0, 0)
        assert writer.flush(timeout=10).delivered == 1
        os.kill(daemon.proc.pid, signal.SIGSTOP)
        for step in range(1, 1001):
            writer.add_scalar("loss", step, step)
        started = time.monotonic()
        report = writer.sender.close(timeout=1.0)
        took = time.monotonic() - started
        assert took < 1.0 + 1.5, f"close(timeout=1) took {took:.2f}s"
        assert report.delivered == 1 and report.spooled == 1000 and dict(report.dropped) == {}
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
        daemon.terminate()
