"""`summaryd ship` to a bucket logdir: a daemon lost with its disk loses nothing the shipper sent it.

Against a real SeaweedFS and real daemons (the fixtures of `test_objstore`); the bucket is read back with
TensorBoard's loader.
"""

from __future__ import annotations

import collections
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from _bucket import start_bucket_daemon, steps_from_bucket
from _seaweed import SeaweedServer
from _shipping import VERSION_RECORD, append, scalar, ship_argv
from _support import Daemon, wait_for
from summaryd.client._patch._shipper import STATE_NAME, Shipper

pytestmark = pytest.mark.objstore

# Sealing by age is off in effect: what a daemon acknowledged stays staged on it until a session closes.
FLAGS = ("--run-lease", "2", "--seal-secs", "3600")


def lose(daemon: Daemon, workdir: Path, url: str) -> Daemon:
    """SIGKILL `daemon` and delete its state and staging; start another daemon on the bucket at its address (a
    daemon on a fresh disk back on the address a lease names takes the run over at once)."""
    daemon.proc.kill()
    daemon.proc.wait(30)
    shutil.rmtree(workdir / "state")
    return start_bucket_daemon(workdir, url, *FLAGS, "--listen", f"127.0.0.1:{daemon.port}")


def test_a_daemon_lost_with_its_disk_loses_nothing_the_shipper_sent(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    local = tmp_path / "local"
    path = local / "events.out.tfevents.1.host"
    workdir = tmp_path / "daemon"
    workdir.mkdir()
    daemons.append(start_bucket_daemon(workdir, logdir_url, *FLAGS))
    append(path, VERSION_RECORD, *(scalar(s) for s in range(50)))
    first = Shipper(local, "shipped", address=daemons[0].address)
    assert first.ship_pass() == 50  # acknowledged: staged on the daemon, not uploaded
    cursor = json.loads((local / STATE_NAME).read_text())["files"][path.name]
    assert cursor["next_sequence"] == 1  # the checkpoint follows what is durable, not the acks

    # The daemon is lost with its disk, and so is the shipper (it never closes): another daemon resumes the
    # session from the bucket, and a new shipper from the checkpoint sends again what was not uploaded.
    daemons.append(lose(daemons[0], workdir, logdir_url))
    first._daemons.close()
    append(path, *(scalar(s) for s in range(50, 70)))
    second = Shipper(local, "shipped", address=daemons[1].address)
    assert second.ship_pass() == 70

    # Lost again under a shipper that lives on: it hears that the daemon holds less than it acknowledged and
    # sends the rest again from its file.
    append(path, *(scalar(s) for s in range(70, 90)))
    assert second.ship_pass() == 20
    daemons.append(lose(daemons[1], workdir, logdir_url))
    append(path, *(scalar(s) for s in range(90, 100)))
    second.ship_pass()
    second.close()  # the session's events are uploaded before its close is answered
    assert steps_from_bucket(seaweed, logdir_url, "shipped", tmp_path / "read") == collections.Counter(range(100))


def test_a_following_shipper_killed_over_and_over_and_a_lost_daemon_lose_nothing(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    """`summaryd ship` following a file as it grows, to a daemon that uploads every 0.2 s: the shipper is
    SIGKILLed once its checkpoint has moved in each of four rounds, and the daemon is lost with its disk in the
    third. Every record is in the bucket once."""
    local = tmp_path / "local"
    path = local / "events.out.tfevents.1.host"
    state = local / STATE_NAME
    workdir = tmp_path / "daemon"
    workdir.mkdir()
    flags = ("--run-lease", "2", "--seal-secs", "0.2")
    daemons.append(start_bucket_daemon(workdir, logdir_url, *flags))
    append(path, VERSION_RECORD)
    written = 0

    def checkpointed() -> int:
        files = json.loads(state.read_text())["files"] if state.exists() else {}
        return int(files[path.name]["next_sequence"]) - 1 if path.name in files else 0

    for round_ in range(4):
        if round_ == 2:
            daemons[-1].proc.kill()
            daemons[-1].proc.wait(30)
            shutil.rmtree(workdir / "state")
            daemons.append(start_bucket_daemon(workdir, logdir_url, *flags, "--listen", f"127.0.0.1:{daemons[0].port}"))
        follower = subprocess.Popen(
            ship_argv(local, "chaos", daemons[-1].address, "--poll", "0.05"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(10):
                append(path, *(scalar(s) for s in range(written, written + 100)))
                written += 100
            before = written - 1000
            wait_for(lambda: checkpointed() > before, 60, f"the checkpoint to move in round {round_}")  # noqa: B023
        finally:
            follower.kill()
            follower.wait()
    done = subprocess.run(
        [*ship_argv(local, "chaos", daemons[-1].address), "--once"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert steps_from_bucket(seaweed, logdir_url, "chaos", tmp_path / "read") == collections.Counter(range(written))
