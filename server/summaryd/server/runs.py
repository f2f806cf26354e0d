"""The run registry: one writer and one active event file per run directory, shared by its sessions."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

from summaryd.server.event_check import check_and_frame
from summaryd.server.event_file import EventFile
from summaryd.server.runpath import open_run_dir

log = logging.getLogger(__name__)


@dataclass(eq=False)
class RunWriter:
    """Appends batches to a run's event file; file I/O runs on the executor, one batch at a time, in order."""

    run_dir: str
    dir_fd: int
    executor: Executor
    file: EventFile | None = None
    sessions: int = 0
    events_written: int = 0
    bytes_written: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def write(self, events: Sequence[bytes]) -> None:
        """Check, frame and append one batch; returns when it is in the page cache."""
        loop = asyncio.get_running_loop()
        async with self.lock:
            await loop.run_in_executor(self.executor, self._write_blocking, events)
        self.events_written += len(events)

    def _write_blocking(self, events: Sequence[bytes]) -> None:
        blob = check_and_frame(events)
        if self.file is None:
            self.file = EventFile(self.dir_fd)
            log.info("run %s: writing %s", self.run_dir, self.file.name)
        self.file.append(blob)
        self.bytes_written += len(blob)

    async def sync(self) -> None:
        """fsync the active file (a no-op when nothing new was written)."""
        loop = asyncio.get_running_loop()
        async with self.lock:
            if self.file is not None:
                await loop.run_in_executor(self.executor, self.file.sync)

    async def close(self) -> None:
        """Sync and close the file and the directory descriptor."""
        loop = asyncio.get_running_loop()
        async with self.lock:
            await loop.run_in_executor(self.executor, self._close_blocking)

    def _close_blocking(self) -> None:
        try:
            if self.file is not None:
                self.file.close()
                log.info("run %s: closed %s", self.run_dir, self.file.name)
        finally:
            self.file = None
            if self.dir_fd >= 0:
                os.close(self.dir_fd)
                self.dir_fd = -1


class RunRegistry:
    """Hands out one `RunWriter` per run directory and closes its file when no session holds it.

    A session that opens a run while another holds it shares the active file (a new file would hide the
    other session's later points from TensorBoard); once the last session lets go the file closes, and the
    next session gets a new file that sorts last, which TensorBoard reads as a restart.
    """

    def __init__(self, logdir: str, executor: Executor) -> None:
        os.makedirs(logdir, exist_ok=True)
        self.logdir = os.path.realpath(logdir)
        self._logdir_fd = os.open(self.logdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._executor = executor
        self._runs: dict[str, RunWriter] = {}
        self._lock = asyncio.Lock()

    @property
    def runs(self) -> list[RunWriter]:
        return list(self._runs.values())

    async def acquire(self, parts: list[str]) -> RunWriter:
        """Return the run's writer, opening the directory (inside the logdir only) when needed."""
        run_dir = "/".join(parts)
        loop = asyncio.get_running_loop()
        async with self._lock:
            writer = self._runs.get(run_dir)
            if writer is None:
                dir_fd = await loop.run_in_executor(self._executor, open_run_dir, self._logdir_fd, parts)
                writer = RunWriter(run_dir, dir_fd, self._executor)
                self._runs[run_dir] = writer
            writer.sessions += 1
            return writer

    async def release(self, writer: RunWriter) -> None:
        """Let go of a writer; the last session to let go closes (and syncs) its file."""
        async with self._lock:
            writer.sessions -= 1
            if writer.sessions > 0:
                return
            self._runs.pop(writer.run_dir, None)
        await writer.close()

    async def close_all(self) -> None:
        """Sync and close every file (shutdown)."""
        async with self._lock:
            writers, self._runs = list(self._runs.values()), {}
        for writer in writers:
            try:
                await writer.close()
            except OSError:
                log.exception("run %s: closing the event file failed", writer.run_dir)
        os.close(self._logdir_fd)
