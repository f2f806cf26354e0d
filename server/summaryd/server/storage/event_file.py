"""One TensorBoard event file: naming that sorts last, `file_version` first, whole records only."""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import time
from typing import Protocol

from tensorboard.compat.proto.event_pb2 import Event

from summaryd.v1.wire import frame

_counter = itertools.count(1)
_PREFIX = "events.out.tfevents."


def next_name(dir_fd: int) -> str:
    """A file name that sorts after every event file already in the directory.

    TensorBoard reads a run's files in name order and never returns to an earlier one, so a new file must
    sort last even when the clock went backwards or an earlier daemon used a larger pid.
    """
    existing = [name for name in os.listdir(dir_fd) if "tfevents" in name]
    host = socket.gethostname().replace("/", "_") or "localhost"
    stamp = int(time.time())
    while True:
        name = f"{_PREFIX}{stamp:010d}.{host}.{os.getpid()}.{next(_counter)}"
        if all(name > other for other in existing):
            return name
        stamp += 1


def append_whole(fd: int, blob: bytes, size: int) -> int:
    """Append `blob` to the file `fd` of `size` bytes completely, or cut the file back to `size` and raise.

    Returns the new size. A partial record would hide everything after it from TensorBoard (and a partial
    journal line would end the journal), so a failed write (ENOSPC, EIO) leaves the file as it was.
    """
    view = memoryview(blob)
    written = 0
    try:
        while written < len(view):
            written += os.write(fd, view[written:])
    except OSError:
        if written:
            os.ftruncate(fd, size)
        raise
    return size + written


class EventFile:
    """An open event file; every `append` writes whole records straight to the OS (page cache).

    Writes are unbuffered on purpose: an acknowledged batch is then visible to TensorBoard at once and the
    daemon holds no event data that a crash could lose before the next flush. `sync` makes it durable.
    """

    def __init__(self, dir_fd: int, name: str | None = None) -> None:
        self.name = name or next_name(dir_fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        self._fd = os.open(self.name, flags, 0o644, dir_fd=dir_fd)
        self.size = 0
        self.synced_size = 0
        self._closed = False
        self.started = time.time()  # its `file_version` record's wall time: TensorBoard's start of a run
        header = Event(wall_time=self.started, file_version="brain.Event:2").SerializeToString()
        try:
            self.append(frame(header))
        except OSError:
            # No header, no file: a file without `file_version` first is not one TensorBoard should see.
            os.close(self._fd)
            self._closed = True
            with contextlib.suppress(OSError):
                os.unlink(self.name, dir_fd=dir_fd)
            raise

    def append(self, blob: bytes) -> None:
        """Write `blob` (whole framed records) completely, or leave the file as it was and raise."""
        self.size = append_whole(self._fd, blob, self.size)

    def truncate(self, size: int) -> None:
        """Cut the file back to `size` bytes (a batch whose journal line could not be written)."""
        os.ftruncate(self._fd, size)
        self.size = size
        self.synced_size = min(self.synced_size, size)

    def sync(self) -> None:
        """fsync the file if anything was written since the last sync."""
        if not self._closed and self.synced_size != self.size:
            os.fsync(self._fd)
            self.synced_size = self.size

    def close(self) -> None:
        """Sync and close; safe to call twice."""
        if self._closed:
            return
        try:
            self.sync()
        finally:
            self._closed = True
            os.close(self._fd)


class EventSink(Protocol):
    """Where a run's event files go beyond the disk they are written on: nowhere for a local logdir (no sink),
    the bucket for a bucket logdir (`segments.SegmentShipper`). Told on the event loop, after the fact."""

    def appended(self, run_dir: str, name: str, size: int, batch: tuple[str, int] | None = None) -> None:
        """`name` in `run_dir` now holds `size` journaled bytes (whole records), the last a `batch` of
        (session id, last sequence number)."""

    def closed(self, run_dir: str, name: str, size: int) -> None:
        """`name` in `run_dir` was closed at `size` bytes; no more is written to it."""

    async def file_written(self, run_dir: str, path: str, content: bytes) -> None:
        """A file beside the run's event files (`PutFile`) was written whole; deliver it before the answer.

        Raises:
            OSError: it could not be delivered (the client keeps it and tries again).
        """

    async def drain(self) -> None:
        """Deliver everything told so far (shutdown, after every file closed)."""
