"""A run directory on a disk that fills up, or that cannot be written: clear statuses, nothing lost.

The test mounts small tmpfs filesystems inside the daemon's logdir (it runs as root), so that one run's disk
fills while the rest of the logdir, and the daemon's state directory, stay writable.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata

from _support import Daemon, start_daemon, steps_in, wait_for
from summaryd.client import SummaryWriter
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc


def mount_tmpfs(where: Path, *options: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(where)], check=True)


def unmount(where: Path) -> None:
    subprocess.run(["umount", str(where)], check=False)


@pytest.fixture
def disks(tmp_path: Path) -> Iterator[tuple[Daemon, Path, Path]]:
    """A daemon whose logdir holds `full/` (a 2 MB tmpfs, nearly filled) and `ro/` (a read-only tmpfs)."""
    logdir = tmp_path / "runs"
    full, read_only = logdir / "full", logdir / "ro"
    mount_tmpfs(full, "size=2m")
    mount_tmpfs(read_only, "size=1m", "ro")
    daemon: Daemon | None = None
    try:
        filler = full / "filler"
        filler.write_bytes(b"\0" * (2 * 1024 * 1024 - 256 * 1024))
        daemon = start_daemon(tmp_path, logdir=logdir)
        yield daemon, full, filler
    finally:
        if daemon is not None:
            daemon.terminate()
        unmount(full)
        unmount(read_only)


def test_a_full_disk_is_resource_exhausted_and_nothing_is_lost(
    disks: tuple[Daemon, Path, Path], tmp_path: Path
) -> None:
    """ENOSPC: the client is told RESOURCE_EXHAUSTED and keeps its events; every acknowledged event stays in a
    whole file; another run is served meanwhile; when space returns the rest arrives, exactly once."""
    daemon, full, filler = disks
    spool = tmp_path / "spool"
    blocked = SummaryWriter("full/a", address=daemon.address, worker="", spool_dir=spool, spool_after=1.0)
    for step in range(20_000):  # about 1.2 MB of records; 256 KB fit
        blocked.add_scalar("loss", step, step)
    wait_for(lambda: "RESOURCE_EXHAUSTED" in (blocked.sender.report().error or ""), 60, "the disk to fill")
    error = blocked.sender.report().error or ""
    assert "disk holding run 'full/a' is full" in error and "No space left on device" in error

    # Meanwhile another run, on another disk, is served normally.
    with SummaryWriter("ok", address=daemon.address, worker="", spool_dir=spool) as other:
        for step in range(1000):
            other.add_scalar("loss", step, step)
        assert other.flush(timeout=30).delivered == 1000
    assert steps_in(daemon.logdir / "ok") == list(range(1000))

    # What was acknowledged is in the file, whole and in order; the rest waits in the client (and its spool).
    acked = blocked.sender.report().delivered
    assert 0 < acked < 20_000
    assert steps_in(full / "a") == list(range(acked))
    wait_for(lambda: blocked.sender.report().spooled > 0, 30, "the client to spool what waits")

    # A raw client sees the status and the message too.
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.SummariesStub(channel)
        session = str(uuid.uuid4())
        stub.OpenSession(pb.OpenSessionRequest(session_id=session, run="full/probe"), timeout=10)
        padding = Summary.Value(tag="x", metadata=SummaryMetadata(summary_description="x" * 200_000))
        big = Event(wall_time=1.0, step=0, summary=Summary(value=[padding]))
        request = pb.WriteRequest(session_id=session, first_sequence=1, events=[big.SerializeToString()])
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Write(iter([request]), timeout=10))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    filler.unlink()  # space returns
    report = blocked.sender.close(timeout=60)
    assert report.ok and report.synced and report.delivered == 20_000, report
    assert steps_in(full / "a") == list(range(20_000))
    assert "No space left on device" in daemon.log()


def test_an_unwritable_run_directory_is_unavailable_with_the_reason(disks: tuple[Daemon, Path, Path]) -> None:
    """A run whose directory cannot be created (read-only filesystem): UNAVAILABLE, saying why, and logged."""
    daemon = disks[0]
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.SummariesStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.OpenSession(pb.OpenSessionRequest(session_id=str(uuid.uuid4()), run="ro/x"), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "cannot write run 'ro/x' (Read-only file system)" in refused.value.details()
    assert os.listdir(daemon.logdir / "ro") == []
    # The operator learns it too, at the default level: one WARNING line.
    [line] = [line for line in daemon.log().splitlines() if "ro/x" in line]
    assert " WARNING " in line and "Read-only file system" in line
