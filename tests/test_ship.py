"""`summaryd ship`: event files written by anything reach the daemon exactly once, byte for byte.

The files are written here as a native writer does (TFRecords appended, `file_version` first); the daemon's
files are read back with TensorBoard's loader.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event

from _support import Daemon, assert_whole_records, event_files, start_daemon, unused_port, wait_for
from summaryd.client._shipper import STATE_NAME
from summaryd.server.cli import main
from summaryd.v1.wire import frame

VERSION_RECORD = Event(wall_time=1.0, file_version="brain.Event:2").SerializeToString()


def scalar(step: int, tag: str = "loss") -> bytes:
    # A wall time with many digits: re-encoding it anywhere on the way would show in the bytes.
    event = Event(wall_time=1_700_000_000.123456789 + step, step=step)
    event.summary.value.add(tag=tag, simple_value=step * 0.5)
    return event.SerializeToString()


def append(path: Path, *records: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(b"".join(frame(r) for r in records))


def daemon_records(run_dir: Path) -> list[bytes]:
    """Every record the daemon wrote for a run (its own `file_version` records left out), files in order."""
    records: list[bytes] = []
    for path in event_files(run_dir):
        assert_whole_records(path)
        for raw in RawEventFileLoader(str(path), detect_file_replacement=False).Load():
            if Event.FromString(raw).WhichOneof("what") != "file_version":
                records.append(raw)
    return records


def ship_argv(directory: Path, run: str, address: str, *flags: str) -> list[str]:
    """`summaryd ship DIR --run RUN --address A [flags]` as a user runs it."""
    return [sys.executable, "-m", "summaryd.server", "ship", str(directory), "--run", run, "--address", address, *flags]


def ship(directory: Path, run: str, daemon: Daemon, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    """`summaryd ship DIR --run RUN --once` in this process; returns what it printed."""
    capsys.readouterr()
    code = main(["ship", str(directory), "--run", run, "--once", "--address", daemon.address, *flags])
    err = capsys.readouterr().err
    assert code == 0, err
    return err


def test_ship_once_passes_records_through_and_waits_for_a_torn_one(
    daemon: Daemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = tmp_path / "local"
    train = local / "events.out.tfevents.1700000000.host.1.v2"
    evaluation = local / "eval" / "events.out.tfevents.1700000000.host.1.v2"
    append(train, VERSION_RECORD, *(scalar(s) for s in range(50)))
    append(evaluation, VERSION_RECORD, *(scalar(s, "acc") for s in range(0, 50, 10)))
    torn = frame(scalar(50))
    with open(train, "ab") as f:
        f.write(torn[:20])  # the writer is in the middle of this record

    err = ship(local, "exp", daemon, capsys)
    assert err.splitlines()[0] == f"summaryd ship: daemon {daemon.address}, run root exp, {local} (once)"
    assert "delivered 55 records" in err.splitlines()[-1]
    assert "from 2 files to 2 runs" in err and "not whole records yet" in err
    assert daemon_records(daemon.logdir / "exp") == [scalar(s) for s in range(50)]
    assert daemon_records(daemon.logdir / "exp" / "eval") == [scalar(s, "acc") for s in range(0, 50, 10)]

    # The record becomes whole, more follow, and the writer rotates to a new file: only the new ones go.
    with open(train, "ab") as f:
        f.write(torn[20:])
    append(train, scalar(51))
    rotated = local / "events.out.tfevents.1700000100.host.1.v2"
    append(rotated, VERSION_RECORD, *(scalar(s) for s in range(52, 60)))
    err = ship(local, "exp", daemon, capsys)
    assert "delivered 10 records" in err.splitlines()[-1]
    assert daemon_records(daemon.logdir / "exp") == [scalar(s) for s in range(60)]

    # Nothing new: nothing sent.
    assert "delivered 0 records" in ship(local, "exp", daemon, capsys).splitlines()[-1]
    assert daemon_records(daemon.logdir / "exp") == [scalar(s) for s in range(60)]


def test_ship_moves_on_from_a_daemon_that_is_away_to_the_next_address(
    daemon: Daemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = tmp_path / "local"
    append(local / "events.out.tfevents.1700000000.host.1.v2", VERSION_RECORD, *(scalar(s) for s in range(20)))
    addresses = f"127.0.0.1:{unused_port()},{daemon.address}"  # the first daemon is away
    assert main(["ship", str(local), "--run", "exp", "--once", "--address", addresses]) == 0
    assert "delivered 20 records" in capsys.readouterr().err.splitlines()[-1]
    assert daemon_records(daemon.logdir / "exp") == [scalar(s) for s in range(20)]


def test_a_killed_shipper_and_a_restarted_daemon_double_nothing(
    daemons: list[Daemon], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A following shipper sees its daemon SIGKILLed and restarted, then is SIGKILLed itself with a checkpoint
    that lags what the daemon acknowledged (restored from earlier, as if killed between an ack and the
    checkpoint): the records after the checkpoint go again in the same session, and the daemon drops them."""
    daemons.append(start_daemon(tmp_path))
    first = daemons[0]
    local = tmp_path / "local"
    path = local / "events.out.tfevents.1.host"
    state = local / STATE_NAME
    append(path, VERSION_RECORD, *(scalar(s) for s in range(20)))
    follower = subprocess.Popen(
        ship_argv(local, "kill", first.address, "--poll", "0.05"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run_dir = first.logdir / "kill"
        wait_for(lambda: len(daemon_records(run_dir)) == 20, 60, "the first 20 records")
        wait_for(lambda: state.exists() and json.loads(state.read_text())["files"], 10, "the checkpoint")
        lagging = state.read_bytes()

        first.proc.kill()
        first.proc.wait()
        append(path, *(scalar(s) for s in range(20, 30)))
        daemons.append(start_daemon(tmp_path, "--listen", f"127.0.0.1:{first.port}", logdir=first.logdir))
        append(path, *(scalar(s) for s in range(30, 40)))
        wait_for(lambda: len(daemon_records(run_dir)) >= 40, 60, "40 records after the daemon's restart")
    finally:
        follower.kill()
        follower.wait()
    state.write_bytes(lagging)
    append(path, *(scalar(s) for s in range(40, 45)))
    ship(local, "kill", daemons[1], capsys)
    assert daemon_records(run_dir) == [scalar(s) for s in range(45)]


def test_a_close_the_checkpoint_missed_doubles_nothing(
    daemon: Daemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shipper closed a session and died before its checkpoint said so (restored here from before): the
    daemon answers what the closed session holds, and only the rest goes, in a new session."""
    from summaryd.client._shipper import Shipper

    local = tmp_path / "local"
    path = local / "events.out.tfevents.1.host"
    state = local / STATE_NAME
    append(path, VERSION_RECORD, *(scalar(s) for s in range(10)))
    shipper = Shipper(local, "closed", address=daemon.address)
    assert shipper.ship_pass() == 10
    before = state.read_bytes()
    append(path, *(scalar(s) for s in range(10, 20)))
    assert shipper.ship_pass() == 10
    shipper.close()
    state.write_bytes(before)  # the session of records 1..20, at the offset of record 10, not closed

    append(path, *(scalar(s) for s in range(20, 25)))
    assert "delivered 5 records" in ship(local, "closed", daemon, capsys).splitlines()[-1]
    assert daemon_records(daemon.logdir / "closed") == [scalar(s) for s in range(25)]


def test_a_record_the_daemon_refuses_is_skipped_alone(
    daemon: Daemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = tmp_path / "local"
    path = local / "events.out.tfevents.1.host"
    not_an_event = b"\xff\xff\xff\xff"
    append(path, VERSION_RECORD, *(scalar(s) for s in range(5)), not_an_event, *(scalar(s) for s in range(5, 8)))
    err = ship(local, "refused", daemon, capsys)
    assert "delivered 8 records" in err and "1 records refused by the daemon" in err
    assert daemon_records(daemon.logdir / "refused") == [scalar(s) for s in range(8)]
    assert "delivered 0 records" in ship(local, "refused", daemon, capsys)


def test_ship_follows_until_sigterm_then_drains(daemon: Daemon, tmp_path: Path) -> None:
    local = tmp_path / "local"
    path = local / "run-a" / "events.out.tfevents.1.host"
    append(path, VERSION_RECORD, *(scalar(s) for s in range(10)))
    follower = subprocess.Popen(
        ship_argv(local, "follow", daemon.address),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run_dir = daemon.logdir / "follow" / "run-a"
        wait_for(lambda: len(daemon_records(run_dir)) == 10, 60, "the first records")
        append(path, *(scalar(s) for s in range(10, 15)))
        follower.send_signal(signal.SIGTERM)
        _, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    assert "delivered 15 records" in err.splitlines()[-1]
    assert daemon_records(run_dir) == [scalar(s) for s in range(15)]


def test_ship_refuses_what_it_cannot_ship(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["ship", str(tmp_path / "missing"), "--run", "x", "--once"])
    assert "is not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["ship", str(tmp_path), "--run", "../x", "--once"])
    assert "summaryd ship: error:" in capsys.readouterr().err
    # No daemon there: exit 1, the report says why, and the checkpoint holds nothing delivered.
    local = tmp_path / "local"
    append(local / "events.out.tfevents.1.host", VERSION_RECORD, scalar(1))
    assert main(["ship", str(local), "--run", "away", "--once", "--address", f"127.0.0.1:{unused_port()}"]) == 1
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("summaryd ship: delivered 0 records") and "stopped by: UNAVAILABLE" in last


TF2_SCRIPT = """
import os, sys, time
import numpy as np
import tensorflow as tf

logdir, gate = sys.argv[1], sys.argv[2]
writer = tf.summary.create_file_writer(logdir)
with writer.as_default():
    for step in range(60):
        if step == 30:  # half written: the test kills the shipper and starts it again
            writer.flush(timeout=10)
            while not os.path.exists(gate):
                time.sleep(0.02)
        tf.summary.scalar("loss", 1.0 / (step + 1), step=step)
        tf.summary.histogram("weights", np.random.default_rng(step).normal(size=100), step=step)
        if step % 10 == 0:
            tf.summary.image("sample", np.full((1, 4, 4, 3), step / 60, dtype=np.float32), step=step)
        writer.flush(timeout=10)
writer.close()
"""


@pytest.mark.slow
def test_tf2_summaries_shipped_while_written_exactly_once_across_a_sigkill(daemon: Daemon, tmp_path: Path) -> None:
    """`tf.summary` writes in native code; `summaryd ship` follows it, is SIGKILLed half way and started again;
    the daemon's files hold every record once, byte-equal to TensorFlow's."""
    local = tmp_path / "tf"
    gate = tmp_path / "continue"
    local.mkdir()
    ship_command = ship_argv(local, "tf2", daemon.address, "--poll", "0.05")
    script = subprocess.Popen(
        [sys.executable, "-c", TF2_SCRIPT, str(local), str(gate)],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    shipper = subprocess.Popen(ship_command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run_dir = daemon.logdir / "tf2"
        # Steps 0..29 as scalar and histogram records, 3 images.
        wait_for(lambda: len(daemon_records(run_dir)) >= 63, 120, "the first half of the records")
        shipper.kill()
        shipper.wait()
        shipper = subprocess.Popen(ship_command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        gate.touch()
        assert script.wait(120) == 0
        local_records = [
            r
            for path in event_files(local)
            for r in RawEventFileLoader(str(path), detect_file_replacement=False).Load()
            if Event.FromString(r).WhichOneof("what") != "file_version"
        ]
        assert len(local_records) == 60 * 2 + 6
        wait_for(lambda: len(daemon_records(run_dir)) >= len(local_records), 60, "every record")
        shipper.send_signal(signal.SIGTERM)
        _, err = shipper.communicate(timeout=60)
        assert shipper.returncode == 0, err
    finally:
        for proc in (script, shipper):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert daemon_records(run_dir) == local_records


def test_a_session_the_daemon_forgot_or_released_is_opened_again(
    daemons: list[Daemon], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Between two passes of one shipper the daemon is restarted (it knows the session only from its store), then
    releases the session after its lease: each time the session is opened again and resumes, nothing doubled."""
    from summaryd.client._shipper import Shipper

    daemons.append(start_daemon(tmp_path, "--session-lease", "1"))
    local = tmp_path / "local"
    path = local / "events.out.tfevents.1.host"
    append(path, VERSION_RECORD, *(scalar(s) for s in range(5)))
    shipper = Shipper(local, "again", address=daemons[0].address)
    assert shipper.ship_pass() == 5

    daemons[0].proc.kill()
    daemons[0].proc.wait()
    daemons.append(
        start_daemon(
            tmp_path, "--listen", f"127.0.0.1:{daemons[0].port}", "--session-lease", "1", logdir=daemons[0].logdir
        )
    )
    append(path, *(scalar(s) for s in range(5, 10)))
    assert shipper.ship_pass() == 5

    capsys.readouterr()
    wait_for(
        lambda: (
            main(["status", "--address", daemons[1].address, "--json"]) == 0
            and not json.loads(capsys.readouterr().out)["sessions"]
        ),
        30,
        "the session's release",
    )
    append(path, *(scalar(s) for s in range(10, 15)))
    assert shipper.ship_pass() == 5
    shipper.close()
    assert daemon_records(daemons[1].logdir / "again") == [scalar(s) for s in range(15)]


def test_ship_once_shows_progress_on_a_terminal(daemon: Daemon, tmp_path: Path) -> None:
    """On a terminal `ship --once` rewrites one progress line (records and bytes) as it goes; piped, it prints
    only the banner and the report (the other tests)."""
    import pty

    local = tmp_path / "local"
    append(local / "events.out.tfevents.1.host", VERSION_RECORD, *(scalar(s) for s in range(12)))
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            [*ship_argv(local, "tty", daemon.address), "--once"], stdout=subprocess.DEVNULL, stderr=terminal
        )
        os.close(terminal)
        output = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the terminal's other end closed: the shipper exited
                break
            if not chunk:
                break
            output += chunk
        assert proc.wait(60) == 0
    finally:
        os.close(controller)
    text = output.decode()
    nbytes = sum(len(scalar(s)) for s in range(12))
    assert f"\rsummaryd ship: 12 records, {nbytes} bytes" in text
    assert "delivered 12 records" in text.splitlines()[-1]
