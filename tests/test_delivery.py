"""The caller never waits on the daemon, and `close()` means on disk and synced."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _support import Daemon, assert_whole_records, event_files, read_events, unused_port
from summaryd.client import SummaryWriter
from summaryd.server.config import Config
from summaryd.server.server import Server
from summaryd.server.storage.event_file import EventFile


def _summaryd_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("summaryd")]


def test_no_daemon_never_raises_and_close_is_bounded() -> None:
    """With nothing listening, logging returns, close(timeout=1) returns in about a second and counts the loss."""
    writer = SummaryWriter("nowhere", address=f"127.0.0.1:{unused_port()}", worker="")
    for step in range(1000):
        writer.add_scalar("loss", 0.5, step)
    writer.add_image("img", [[[0.0]]], 1)
    started = time.monotonic()
    report = writer.close(timeout=1)
    took = time.monotonic() - started
    assert took < 2.5, f"close(timeout=1) took {took:.2f}s"
    assert report.delivered == 0
    assert report.undelivered == 1001
    assert report.error is not None and "UNAVAILABLE" in report.error
    assert _summaryd_threads() == [], "close() left sender threads behind"
    # Logging after close never raises either; it is counted.
    writer.add_scalar("late", 1.0)
    assert writer.close().dropped.get("closed") == 1


def test_close_leaves_no_threads_or_descriptors(daemon: Daemon) -> None:
    """After close() the sender's threads are gone and open descriptors are back where they were."""

    def one_writer(run: str) -> None:
        with SummaryWriter(run, address=daemon.address, worker="") as writer:
            writer.add_scalar("x", 1.0)
            writer.add_scalars("pair", {"a": 1, "b": 2})

    one_writer("warm-up")  # gRPC's process-wide resources (pollers, wakeup fds) are created once, on first use
    before = len(os.listdir("/proc/self/fd"))
    for attempt in range(5):
        one_writer(f"tidy-{attempt}")
    assert _summaryd_threads() == []
    # gRPC's I/O threads close a channel's sockets asynchronously: wait (bounded) for them to go.
    deadline = time.monotonic() + 5
    while len(os.listdir("/proc/self/fd")) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(os.listdir("/proc/self/fd")) <= before


def test_close_returns_when_everything_is_written(daemon: Daemon) -> None:
    """Right after close() returns, every event is in the file, whole, and the daemon confirmed the sync."""
    writer = SummaryWriter("many", address=daemon.address, worker="")
    for step in range(20_000):
        writer.add_scalar("loss", step, step)
    report = writer.close(timeout=60)
    assert report.ok and report.synced and report.delivered == 20_000
    [path] = event_files(daemon.logdir / "many")
    assert assert_whole_records(path) == 1 + 20_000
    assert [int(v.simple_value) for e in read_events(path) for v in e.summary.value] == list(range(20_000))


@pytest.fixture
def in_process_daemon(tmp_path: Path) -> Iterator[tuple[Server, str, list[tuple[str, int]]]]:
    """A daemon on a thread of this process whose fsyncs are recorded (the real fsync still runs)."""
    synced: list[tuple[str, int]] = []
    real_sync = EventFile.sync

    def recording_sync(self: EventFile) -> None:
        real_sync(self)
        synced.append((self.name, self.synced_size))

    EventFile.sync = recording_sync  # type: ignore[method-assign]
    server = Server(Config(logdir=str(tmp_path / "runs"), listen="127.0.0.1:0"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),))
    thread.start()
    try:
        port = asyncio.run_coroutine_threadsafe(server.wait_started(), loop).result(10)
        yield server, f"127.0.0.1:{port}", synced
    finally:
        loop.call_soon_threadsafe(server.request_shutdown)
        thread.join(30)
        loop.close()
        EventFile.sync = real_sync  # type: ignore[method-assign]


def test_close_and_end_fsync_before_returning(
    in_process_daemon: tuple[Server, str, list[tuple[str, int]]], tmp_path: Path
) -> None:
    """close() returns only after the daemon fsynced the file up to its full size; flush(durable) too."""
    _, address, synced = in_process_daemon
    writer = SummaryWriter("durable", address=address, worker="")
    for step in range(100):
        writer.add_scalar("x", step, step)
    assert writer.flush(durable=True).delivered == 100
    [path] = event_files(tmp_path / "runs" / "durable")
    assert synced and synced[-1] == (path.name, path.stat().st_size)
    for step in range(100, 200):
        writer.add_scalar("x", step, step)
    report = writer.close()
    assert report.synced and report.delivered == 200
    assert synced[-1] == (path.name, path.stat().st_size)
