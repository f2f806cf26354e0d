"""`summaryd ship`: event files written by anything reach the daemon exactly once, byte for byte.

The files are written here as a native writer does (TFRecords appended, `file_version` first); the daemon's
files are read back with TensorBoard's loader.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event

from _shipping import VERSION_RECORD, append, scalar, ship_argv
from _support import Daemon, assert_whole_records, event_files, start_daemon, unused_port, wait_for
from summaryd.cli import main
from summaryd.client._patch._shipper import STATE_NAME
from summaryd.v1.wire import frame, masked_crc32c


def daemon_records(run_dir: Path) -> list[bytes]:
    """Every record the daemon wrote for a run (its own `file_version` records left out), files in order."""
    records: list[bytes] = []
    for path in event_files(run_dir):
        assert_whole_records(path)
        for raw in RawEventFileLoader(str(path), detect_file_replacement=False).Load():
            if Event.FromString(raw).WhichOneof("what") != "file_version":
                records.append(raw)
    return records


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
    from summaryd.client._patch._shipper import Shipper

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
            writer.flush()
            while not os.path.exists(gate):
                time.sleep(0.02)
        tf.summary.scalar("loss", 1.0 / (step + 1), step=step)
        tf.summary.histogram("weights", np.random.default_rng(step).normal(size=100), step=step)
        if step % 10 == 0:
            tf.summary.image("sample", np.full((1, 4, 4, 3), step / 60, dtype=np.float32), step=step)
        writer.flush()
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
    from summaryd.client._patch._shipper import Shipper

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


def test_a_daemon_that_holds_less_than_the_checkpoint_gets_the_rest_again(
    daemons: list[Daemon], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The daemon's disk comes back without what it acknowledged last (as after a power loss: here its logdir
    and state are restored from a copy taken earlier): the session resumes where the daemon holds it, the
    shipper is told so and sends the rest again from its file, and nothing is skipped."""
    from summaryd.client._patch._shipper import Shipper

    daemons.append(start_daemon(tmp_path))
    logdir = daemons[0].logdir
    local = tmp_path / "local"
    path = local / "events.out.tfevents.1.host"
    append(path, VERSION_RECORD, *(scalar(s) for s in range(20)))
    shipper = Shipper(local, "behind", address=daemons[0].address)
    assert shipper.ship_pass() == 20
    earlier = tmp_path / "earlier"
    shutil.copytree(logdir, earlier)  # the daemon is idle: its files and journals hold records 1..20
    append(path, *(scalar(s) for s in range(20, 50)))
    assert shipper.ship_pass() == 30

    daemons[0].proc.kill()
    daemons[0].proc.wait()
    shutil.rmtree(logdir)
    shutil.copytree(earlier, logdir)
    daemons.append(start_daemon(tmp_path, "--listen", f"127.0.0.1:{daemons[0].port}", logdir=logdir))
    append(path, *(scalar(s) for s in range(50, 60)))
    shipper.ship_pass()
    shipper.close()
    assert daemon_records(logdir / "behind") == [scalar(s) for s in range(60)]


def test_a_file_replaced_or_truncated_under_its_name_is_shipped_anew(
    daemon: Daemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checkpoint knows a file by its device and inode: a writer rotating by rename (the old file moves to
    another name, a new one takes its name), or one restarted over a truncated file, has its new records
    shipped, and what the shipper found is said on stderr; the renamed file is not shipped twice."""
    local = tmp_path / "local"
    path = local / "events.out.tfevents.1.host"
    append(path, VERSION_RECORD, *(scalar(s) for s in range(30)))
    ship(local, "replaced", daemon, capsys)

    path.rename(local / "events.out.tfevents.1.host.old")
    append(path, VERSION_RECORD, *(scalar(s) for s in range(100, 400)))
    err = ship(local, "replaced", daemon, capsys)
    assert "events.out.tfevents.1.host.old is events.out.tfevents.1.host renamed" in err
    assert "holds another file than the one checkpointed" in err
    assert "delivered 300 records" in err.splitlines()[-1] and "1 files replaced or truncated" in err

    with open(path, "r+b") as f:  # a writer restarted over the same file
        f.truncate(0)
    append(path, VERSION_RECORD, *(scalar(s) for s in range(500, 600)))
    err = ship(local, "replaced", daemon, capsys)
    assert "truncated; shipping it from its start" in err
    assert "delivered 100 records" in err.splitlines()[-1]

    # Truncated and written again past the checkpoint before the shipper looks: its first bytes tell (a
    # restarted writer's `file_version` holds its own start time).
    with open(path, "r+b") as f:
        f.truncate(0)
    restarted = Event(wall_time=2.0, file_version="brain.Event:2").SerializeToString()
    append(path, restarted, *(scalar(s) for s in range(600, 1000)))
    err = ship(local, "replaced", daemon, capsys)
    assert "begins with other bytes than when checkpointed" in err
    assert "delivered 400 records" in err.splitlines()[-1]
    expected = [*range(30), *range(100, 400), *range(500, 600), *range(600, 1000)]
    assert sorted(Event.FromString(r).step for r in daemon_records(daemon.logdir / "replaced")) == expected


def test_a_corrupt_record_is_reported_and_stops_its_file_where_tensorboard_stops(
    daemon: Daemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record whose data fails its CRC stops its file there, as TensorBoard's loader stops (the shipper says
    where and why, and ships the other files); a record whose length field exceeds the largest event the daemon
    takes is stepped over without being read."""
    local = tmp_path / "local"
    bad_crc = local / "a" / "events.out.tfevents.1.host"
    append(bad_crc, VERSION_RECORD, *(scalar(s) for s in range(5)))
    corrupt_at = bad_crc.stat().st_size
    damaged = bytearray(frame(scalar(5)))
    damaged[-1] ^= 0xFF
    with open(bad_crc, "ab") as f:
        f.write(bytes(damaged))
    append(bad_crc, *(scalar(s) for s in range(6, 10)))
    huge = local / "b" / "events.out.tfevents.1.host"
    append(huge, VERSION_RECORD, scalar(0))
    huge_at = huge.stat().st_size
    length = (100 * 1024 * 1024).to_bytes(8, "little")
    with open(huge, "ab") as f:  # a 100 MB record, as its length field says (a valid header), all zeros
        f.write(length + masked_crc32c(length).to_bytes(4, "little"))
        f.truncate(huge_at + 12 + 100 * 1024 * 1024 + 4)
    append(huge, scalar(1))

    tracemalloc.start()
    try:
        err = ship(local, "damaged", daemon, capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * 1024 * 1024, f"shipping allocated up to {peak} bytes"  # the 100 MB record is never read
    assert f"a/events.out.tfevents.1.host: the record at offset {corrupt_at} cannot be read (its data fails" in err
    assert f"b/events.out.tfevents.1.host: the record at offset {huge_at} is of {100 * 1024 * 1024} bytes" in err
    last = err.splitlines()[-1]
    assert "delivered 7 records" in last and "1 files stopped at a corrupt record" in last
    assert "not whole records yet" not in last
    assert daemon_records(daemon.logdir / "damaged" / "a") == [scalar(s) for s in range(5)]
    assert daemon_records(daemon.logdir / "damaged" / "b") == [scalar(0), scalar(1)]
    # TensorBoard's own loader reads the damaged file exactly as far.
    loaded = list(RawEventFileLoader(str(bad_crc), detect_file_replacement=False).Load())
    assert loaded[1:] == [scalar(s) for s in range(5)]


def test_ship_and_run_from_the_parent_of_a_clone(daemon: Daemon, tmp_path: Path) -> None:
    """A folder named `summaryd` in the working directory (the parent of a clone: its `cli/`, `client/` and
    `server/` folders hold no `__init__.py`) would be a portion of the namespace package `summaryd` wherever the
    working directory is on `sys.path`: `python -m`, and `''` or `.` on PYTHONPATH, for the console script and
    the children of `summaryd run` alike. Every entry point imports the installed package all the same."""
    parent = tmp_path / "parent"
    for part in ("cli", "client", "server", "proto"):
        (parent / "summaryd" / part / "summaryd").mkdir(parents=True)
    append(parent / "logs" / "events.out.tfevents.1.host", VERSION_RECORD, *(scalar(s) for s in range(5)))
    console = str(Path(sys.executable).parent / "summaryd")
    dotted = {**os.environ, "PYTHONPATH": "."}
    child = "from summaryd.client import SummaryWriter; print(SummaryWriter.__module__)"
    commands = [
        (ship_argv(Path("logs"), "clone", daemon.address, "--once"), os.environ),
        ([console, *ship_argv(Path("logs"), "clone", daemon.address, "--once", "--state", "again.json")[3:]], dotted),
        ([console, "run", "--address", daemon.address, "--", sys.executable, "-c", child], dotted),
    ]
    for argv, env in commands:
        done = subprocess.run(argv, cwd=parent, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0 and "Error" not in done.stderr, done.stderr
        assert "not patching" not in done.stderr, done.stderr
    assert "summaryd.client.writer" in done.stdout
    assert daemon_records(daemon.logdir / "clone") == [scalar(s) for s in range(5)] * 2
