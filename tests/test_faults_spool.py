"""The daemon away: training goes on at full speed, events wait in the spool, and arrive exactly once.

Covers the daemon down for the whole run (`summaryd replay`, twice with `--keep`) and the overflow
policies (`spill`, `drop_oldest`, `block`): counted, warned about at a limited rate, bounded in memory.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from _support import Daemon, replay, start_daemon, unused_port, wait_for
from _support import steps_in as logged_steps  # every scalar step, each file read whole
from summaryd.cli import main
from summaryd.client import Sender, SummaryWriter


def scalar(step: int) -> bytes:
    summary = Summary(value=[Summary.Value(tag="loss", simple_value=float(step))])
    return Event(wall_time=1.0 + step, step=step, summary=summary).SerializeToString()


def timed_loop(writer: SummaryWriter, steps: int) -> float:
    started = time.perf_counter()
    for step in range(steps):
        writer.add_scalar("loss", step, step)
    return time.perf_counter() - started


def test_daemon_down_for_the_whole_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The loop runs as fast as with a daemon, close() keeps its timeout, the spool holds every event (a valid
    event file), `summaryd replay` delivers it, and replaying again adds nothing."""
    steps, spool_root = 10_000, tmp_path / "spool"
    writer = SummaryWriter("down", address=f"127.0.0.1:{unused_port()}", worker="", spool_dir=spool_root)
    down_secs = timed_loop(writer, steps)
    started = time.monotonic()
    report = writer.sender.close(timeout=1.0)
    took = time.monotonic() - started
    assert took < 1.0 + 1.0, f"close(timeout=1) took {took:.2f}s"
    assert (report.delivered, report.undelivered, report.spooled, dict(report.dropped)) == (0, steps, steps, {})
    assert report.spool_path is not None
    [spool] = list(spool_root.iterdir())
    assert str(spool) == report.spool_path
    [spooled_file] = spool.glob("down/events.out.tfevents.*")
    records = list(RawEventFileLoader(str(spooled_file), detect_file_replacement=False).Load())
    assert len(records) == 1 + steps
    assert [Event.FromString(r).step for r in records[1:]] == list(range(steps))

    daemon = start_daemon(tmp_path)
    try:
        # The same loop with a live daemon, for "normal speed": the sender thread competes for the GIL there.
        with SummaryWriter("up", address=daemon.address, worker="", spool_dir=spool_root) as live:
            up_secs = timed_loop(live, steps)
        figures = f"{steps} add_scalar calls: {down_secs:.3f}s with the daemon down, {up_secs:.3f}s with it up"
        assert down_secs < 2 * up_secs + 0.5, figures  # said only on failure: the -q output stays quiet

        [first] = replay(spool, daemon.address, keep=True)
        assert (first["ok"], first["sent"], first["held"], first["synced"]) == (True, steps, 0, True)
        assert logged_steps(daemon.logdir / "down") == list(range(steps))
        [again] = replay(spool_root, daemon.address, capsys, keep=True)
        assert (again["ok"], again["already"], again["sent"]) == (True, True, 0)
        # Even without the manifest's record of the first replay, the daemon itself writes nothing twice.
        manifest = json.loads((spool / "manifest.json").read_text())
        del manifest["delivered_through"]
        (spool / "manifest.json").write_text(json.dumps(manifest))
        [forgetful] = replay(spool, daemon.address, capsys)
        assert (forgetful["ok"], forgetful["sent"], forgetful["held"]) == (True, 0, steps)
        assert forgetful["removed"] and not spool.exists()
        assert logged_steps(daemon.logdir / "down") == list(range(steps))
    finally:
        daemon.terminate()


def test_the_sender_delivers_its_spool_when_the_daemon_returns(tmp_path: Path) -> None:
    """Unacknowledged for `spool_after`: events go to disk; when the daemon comes up they are sent from there,
    in order and once, and the spool is deleted."""
    port, spool_root = unused_port(), tmp_path / "spool"
    sender = Sender("later", address=f"127.0.0.1:{port}", spool_dir=spool_root, spool_after=0.3)
    for step in range(5000):
        sender.submit(scalar(step), 40)
    wait_for(lambda: sender.report().spooled == 5000, 30, "the events to be spooled")
    assert len(list(spool_root.iterdir())) == 1
    for step in range(5000, 6000):  # logging goes on while spooled
        sender.submit(scalar(step), 40)
    daemon = start_daemon(tmp_path, "--listen", f"127.0.0.1:{port}")
    try:
        report = sender.close(timeout=60)
        assert report.ok and report.synced and report.delivered == 6000 and report.spooled == 0
        assert list(spool_root.iterdir()) == []
        assert logged_steps(daemon.logdir / "later") == list(range(6000))
    finally:
        daemon.terminate()


def test_replay_leaves_a_spool_alone_while_its_process_holds_it(
    tmp_path: Path, daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    """A spool still owned by a live sender is not replayed behind its back."""
    sender = Sender("owned", address=f"127.0.0.1:{unused_port()}", spool_dir=tmp_path / "spool", spool_after=0.1)
    sender.submit(scalar(0), 40)
    wait_for(lambda: sender.report().spooled == 1, 30, "the event to be spooled")
    [spool] = list((tmp_path / "spool").iterdir())
    capsys.readouterr()
    assert main(["replay", str(spool), "--address", daemon.address]) == 1
    assert f"in use by process {os.getpid()}" in capsys.readouterr().out
    sender.close(timeout=0.5)
    assert replay(spool, daemon.address, capsys)[0]["sent"] == 1


def test_drop_oldest_counts_and_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Over its byte bound the queue drops its oldest events, counted; the warning is rate-limited."""
    sender = Sender(
        "bounded",
        address=f"127.0.0.1:{unused_port()}",
        spool_dir=tmp_path / "spool",
        overflow="drop_oldest",
        max_queue_bytes=100 * 100,
        spool_after=60,
    )
    with caplog.at_level(logging.WARNING, logger="summaryd.client"):
        started = time.monotonic()
        for step in range(1000):
            assert sender.submit(scalar(step), 100)
        took = time.monotonic() - started
    assert took < 1.0
    report = sender.close(timeout=0.5)
    assert report.dropped["queue_full"] >= 900 - 8 * 1024  # at most the in-flight window escapes the bound
    assert report.dropped["queue_full"] + report.spooled + report.dropped.get("timeout", 0) == 1000
    assert sum("dropping the oldest" in r.getMessage() for r in caplog.records) == 1


def test_spill_keeps_everything_within_the_memory_bound(tmp_path: Path) -> None:
    """Policy `spill`: beyond `max_queue_bytes` the events go to the spool, none is dropped."""
    sender = Sender(
        "spilled", address=f"127.0.0.1:{unused_port()}", spool_dir=tmp_path / "spool", max_queue_bytes=100 * 100
    )
    started = time.monotonic()
    for step in range(3000):
        assert sender.submit(scalar(step), 100)
    took = time.monotonic() - started
    assert took < 2.0, f"spilling held the caller for {took:.2f}s"
    wait_for(lambda: sender.report().spooled >= 2900, 30, "the excess to be spilled")
    report = sender.close(timeout=1.0)
    assert report.dropped == {} and report.spooled == 3000


def test_block_waits_for_room_at_most_block_secs(tmp_path: Path) -> None:
    """Policy `block`: a full queue holds the caller, for `block_secs` at most, then drops the event."""
    sender = Sender(
        "blocked",
        address=f"127.0.0.1:{unused_port()}",
        spool=False,
        overflow="block",
        block_secs=0.3,
        max_queue_bytes=100 * 10,
    )
    for step in range(10):
        assert sender.submit(scalar(step), 100)
    started = time.monotonic()
    assert not sender.submit(scalar(10), 100)
    assert 0.25 < time.monotonic() - started < 2.0
    report = sender.close(timeout=0.5)
    assert report.dropped["queue_full"] == 1


# Logs with the daemon away until everything is spooled, says so, then waits to be killed.
SPOOLER = textwrap.dedent(
    """
    import sys, time
    from summaryd.client import Sender
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    address, ready = sys.argv[1], sys.argv[2]
    sender = Sender("killed", address=address, spool_after=0.2)
    for step in range(3000):
        value = Summary.Value(tag="loss", simple_value=float(step))
        sender.submit(Event(wall_time=1.0, step=step, summary=Summary(value=[value])).SerializeToString(), 40)
    while sender.report().spooled < 3000:
        time.sleep(0.01)
    open(ready, "w").close()
    time.sleep(600)
    """
)


@pytest.mark.slow
def test_a_spool_survives_its_process_being_killed(tmp_path: Path, daemon: Daemon) -> None:
    """What was spooled is on disk, not in the process: after a SIGKILL `summaryd replay` delivers all of it."""
    ready, spool_root = tmp_path / "ready", tmp_path / "spool"
    env = {**os.environ, "SUMMARYD_SPOOL_DIR": str(spool_root)}
    proc = subprocess.Popen([sys.executable, "-c", SPOOLER, f"127.0.0.1:{unused_port()}", str(ready)], env=env)
    try:
        wait_for(lambda: ready.exists() or proc.poll() is not None, 60, "the process to spool everything")
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    [result] = replay(spool_root, daemon.address)
    assert (result["ok"], result["sent"]) == (True, 3000)
    assert logged_steps(daemon.logdir / "killed") == list(range(3000))
