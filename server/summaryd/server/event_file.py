"""One TensorBoard event file: naming that sorts last, `file_version` first, whole records only."""

from __future__ import annotations

import itertools
import os
import socket
import time

from tensorboard.compat.proto.event_pb2 import Event

from summaryd.server.record_writer import frame

_counter = itertools.count(1)
_PREFIX = "events.out.tfevents."


def _next_name(dir_fd: int) -> str:
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


class EventFile:
    """An open event file; every `append` writes whole records straight to the OS (page cache).

    Writes are unbuffered on purpose: an acknowledged batch is then visible to TensorBoard at once and the
    daemon holds no event data that a crash could lose before the next flush. `sync` makes it durable.
    """

    def __init__(self, dir_fd: int) -> None:
        self.name = _next_name(dir_fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        self._fd = os.open(self.name, flags, 0o644, dir_fd=dir_fd)
        self.size = 0
        self.synced_size = 0
        self._closed = False
        header = Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString()
        self.append(frame(header))

    def append(self, blob: bytes) -> None:
        """Write `blob` (whole framed records) completely, or leave the file as it was and raise."""
        view = memoryview(blob)
        written = 0
        try:
            while written < len(view):
                written += os.write(self._fd, view[written:])
        except OSError:
            # A partial record would hide everything after it from TensorBoard: cut it off again.
            if written:
                os.ftruncate(self._fd, self.size)
            raise
        self.size += written

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
