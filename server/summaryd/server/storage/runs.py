"""The run registry: one writer and one active event file per run directory, shared by its sessions."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

from summaryd.server.io_threads import run_to_completion
from summaryd.server.operations.metrics import Metrics
from summaryd.server.records.event_check import check_and_frame
from summaryd.server.records.scalar_records import ScalarRecords
from summaryd.server.security.limits import DEFAULT, LimitError, Limits
from summaryd.server.storage.event_file import EventFile, EventSink, next_name
from summaryd.server.storage.journal import FileJournal
from summaryd.server.storage.runpath import check_run_dir, open_run_dir
from summaryd.server.storage.session_store import SessionRecord

log = logging.getLogger("summaryd.server.runs")  # the name log lines carry, kept across moves


class WriteObserver(Protocol):
    """What follows a written batch: a consumer of every batch the run writers write (cross-worker
    aggregation, the board index), subscribed with `RunRegistry.observe`.

    `written` is called on the event loop right after a batch is in its run's file and journaled, before it is
    acknowledged, in the order the observers were subscribed: the batch's run, the session that wrote it (""
    for the daemon's own records, the aggregates) and the records new to the file (serialized events, or
    `ScalarRecords`; `records.scalar_points.points` reads the scalars of either). It must not raise or block:
    slow work goes to a task or a thread of its own.
    """

    def written(self, run_dir: str, session_id: str, events: Sequence[bytes]) -> None: ...


FileEnd = tuple[str, str, int]
"""Where a run's active file ends: (run directory, file name, size in bytes)."""


@dataclass(eq=False)
class RunWriter:
    """Appends batches to a run's event file; file I/O runs on the executor, one batch at a time, in order.

    Every batch is journaled (`journal.FileJournal`) right after it is written, before it is acknowledged;
    `marks` holds each session's last sequence number in the current file, handed over when the file closes
    (`ClosedFile`). The run's directory is made and opened at its first event file, so a session that never
    writes leaves no directory.
    """

    run_dir: str
    logdir_fd: int
    executor: Executor
    journal_dir_fd: int
    dir_fd: int = -1
    file: EventFile | None = None
    journal: FileJournal | None = None
    marks: dict[str, int] = field(default_factory=dict)
    sessions: int = 0
    events_written: int = 0
    bytes_written: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    metrics: Metrics | None = None
    limits: Limits = DEFAULT
    sink: EventSink | None = None
    observers: Sequence[WriteObserver] = ()
    _counters: tuple[Any, Any] | None = field(default=None, init=False, repr=False)

    async def write(self, session_id: str, last: int, events: Sequence[bytes]) -> None:
        """Check, frame and append one batch of `session_id` ending at sequence `last`; returns when the batch
        and its journal line are in the page cache."""
        metrics = self.metrics
        if metrics is not None:
            metrics.write_queue.inc()
        try:
            async with self.lock:
                started = time.perf_counter()
                size_before = self.bytes_written
                await run_to_completion(self.executor, lambda: self._write_blocking(session_id, last, events))
                if self.sink is not None and self.file is not None:
                    self.sink.appended(self.run_dir, self.file.name, self.file.size, (session_id, last))
        finally:
            if metrics is not None:
                metrics.write_queue.dec()
        self.events_written += len(events)
        for observer in self.observers:
            observer.written(self.run_dir, session_id, events)
        if metrics is not None:
            metrics.write_seconds.observe(time.perf_counter() - started)
            if self._counters is None:  # looked up once per run: `labels` costs a lock and a key per batch
                self._counters = metrics.events_written.labels(self.run_dir), metrics.bytes_written.labels(self.run_dir)
            self._counters[0].inc(len(events))
            self._counters[1].inc(self.bytes_written - size_before)

    @property
    def end(self) -> FileEnd | None:
        """Where the run's active file ends now (None when none is open): what a durable flush or a close
        waits to see uploaded on a bucket logdir."""
        return (self.run_dir, self.file.name, self.file.size) if self.file is not None else None

    def _write_blocking(self, session_id: str, last: int, events: Sequence[bytes]) -> None:
        blob = events.framed(self.limits) if isinstance(events, ScalarRecords) else check_and_frame(events, self.limits)
        if self.file is None:
            self._open_file()
        assert self.file is not None and self.journal is not None
        before = self.file.size
        self.file.append(blob)
        try:
            self.journal.batch(session_id, last, self.file.size)
        except OSError:
            # Not journaled means not acknowledged: take the records back out so that file and journal agree.
            self.file.truncate(before)
            raise
        if session_id:  # the daemon's own records (aggregates) are written without a session
            self.marks[session_id] = last
        self.bytes_written += len(blob)
        try:
            self.journal.compact_if_large(self.marks, self.file.size)
        except OSError:
            log.exception("run %s: compacting the journal failed; it keeps growing", self.run_dir)

    def _open_file(self) -> None:
        if self.dir_fd < 0:
            self.dir_fd = open_run_dir(self.logdir_fd, self.run_dir.split("/"))
        # The journal comes first: an event file never exists without the journal that recovery reads.
        name = next_name(self.dir_fd)
        journal = FileJournal(self.journal_dir_fd, self.run_dir, name)
        try:
            self.file = EventFile(self.dir_fd, name)
            journal.whole_through(self.file.size)
        except BaseException:
            journal.remove()
            if self.file is not None:
                with contextlib.suppress(OSError):
                    self.file.close()
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=self.dir_fd)
                self.file = None
            raise
        self.journal = journal
        self.marks = {}
        log.info("run %s: writing %s", self.run_dir, name)

    async def sync(self) -> None:
        """fsync the active file and its journal (a no-op when nothing new was written)."""
        async with self.lock:
            await run_to_completion(self.executor, self._sync_blocking)

    def _sync_blocking(self) -> None:
        if self.file is not None and self.journal is not None:
            started = time.perf_counter()
            self.file.sync()
            self.journal.sync()
            if self.metrics is not None:
                self.metrics.fsync_seconds.observe(time.perf_counter() - started)

    async def close(self) -> ClosedFile | None:
        """Sync and close the file and the run's directory descriptor; None when no file was open.

        The file's journal stays until the caller has its marks on disk (`ClosedFile.finish`).
        """
        async with self.lock:
            file = self.file
            closed = await run_to_completion(self.executor, self._close_blocking)
            if self.sink is not None and file is not None:
                self.sink.closed(self.run_dir, file.name, file.size)
            return closed

    def _close_blocking(self) -> ClosedFile | None:
        try:
            return self._close_file()
        finally:
            if self.dir_fd >= 0:
                os.close(self.dir_fd)
                self.dir_fd = -1

    def _close_file(self) -> ClosedFile | None:
        if self.file is None or self.journal is None:
            return None
        file, journal, self.file, self.journal = self.file, self.journal, None, None
        try:
            file.close()
            os.fsync(self.dir_fd)
        except OSError:
            journal.close()  # kept for the next start-up's recovery
            raise
        log.info("run %s: closed %s", self.run_dir, file.name)
        return ClosedFile(self.run_dir, file.name, dict(self.marks), journal)


@dataclass(frozen=True)
class ClosedFile:
    """An event file closed and synced whose journal still holds its sessions' sequence numbers."""

    run_dir: str
    name: str
    marks: dict[str, int]
    """Each session's last sequence number in the file."""
    journal: FileJournal

    def records(self) -> list[SessionRecord]:
        """The marks as session-store records."""
        return [SessionRecord(sid, self.run_dir, last) for sid, last in self.marks.items()]

    def finish(self, recorded: bool) -> None:
        """Delete the journal once the marks are on disk in the session store (`recorded`); otherwise keep it,
        so that the next start-up recovers them from it (blocking; run it on the executor)."""
        if recorded:
            self.journal.remove()
        else:
            self.journal.close()


class RunRegistry:
    """Hands out one `RunWriter` per run directory and closes its file when no session holds it.

    A session that opens a run while another holds it shares the active file (a new file would hide the
    other session's later points from TensorBoard); once the last session lets go the file closes, and the
    next session gets a new file that sorts last, which TensorBoard reads as a restart.
    """

    def __init__(
        self,
        logdir: str,
        executor: Executor,
        journal_dir_fd: int,
        metrics: Metrics | None = None,
        sink: EventSink | None = None,
    ) -> None:
        """Open the logdir (made when missing); `close()` closes its descriptor. With a `sink` (a bucket logdir)
        every appended and closed file is handed on to it."""
        self.metrics = metrics
        self.sink = sink
        os.makedirs(logdir, exist_ok=True)
        self.logdir = os.path.realpath(logdir)
        self.logdir_fd = os.open(self.logdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._executor = executor
        self._journal_dir_fd = journal_dir_fd
        self._runs: dict[str, RunWriter] = {}
        self._lock = asyncio.Lock()
        # Told of every batch written to any run, the daemon's own records too; shared with every writer.
        self._observers: list[WriteObserver] = []

    def observe(self, observer: WriteObserver) -> None:
        """Tell `observer` of every batch written from now on, after those subscribed before it."""
        self._observers.append(observer)

    @property
    def runs(self) -> list[RunWriter]:
        return list(self._runs.values())

    @property
    def executor(self) -> Executor:
        return self._executor

    def open_file(self, run_dir: str) -> tuple[str, float] | None:
        """The name of the run's open event file and its `file_version` record's wall time (None: no file)."""
        writer = self._runs.get(run_dir)
        return (writer.file.name, writer.file.started) if writer is not None and writer.file is not None else None

    async def acquire(self, parts: list[str], limits: Limits = DEFAULT) -> RunWriter:
        """Return the run's writer; its directory (inside the logdir only) is made when it is first written.

        Raises:
            LimitError: opening the run would exceed `limits.max_open_runs`.
            RunPathError: a part of the run path exists already as a symlink or a file.
        """
        run_dir = "/".join(parts)
        async with self._lock:
            writer = self._runs.get(run_dir)
            if writer is None:
                if len(self._runs) >= limits.max_open_runs:
                    raise LimitError(
                        f"the daemon has {len(self._runs)} runs open, its limit (--max-open-runs); close sessions "
                        "of finished runs or raise the limit"
                    )
                await run_to_completion(self._executor, lambda: check_run_dir(self.logdir_fd, parts))
                writer = RunWriter(
                    run_dir,
                    self.logdir_fd,
                    self._executor,
                    self._journal_dir_fd,
                    metrics=self.metrics,
                    limits=limits,
                    sink=self.sink,
                    observers=self._observers,
                )
                self._runs[run_dir] = writer
            writer.sessions += 1
            return writer

    async def release(self, writer: RunWriter) -> ClosedFile | None:
        """Let go of a writer; the last session to let go closes (and syncs) its file, returned for its marks.

        None when other sessions still hold the writer, when it had no file, or when closing failed (logged;
        the file's journal stays for recovery).
        """
        async with self._lock:
            writer.sessions -= 1
            if writer.sessions > 0:
                return None
            self._runs.pop(writer.run_dir, None)
        return await _closed(writer)

    async def close_all(self) -> list[ClosedFile]:
        """Sync and close every file (shutdown); return those closed for their marks."""
        async with self._lock:
            writers, self._runs = list(self._runs.values()), {}
        closed = [await _closed(writer) for writer in writers]
        if self.sink is not None:
            await self.sink.drain()
        return [c for c in closed if c is not None]

    def close(self) -> None:
        """Close the logdir's descriptor (after every file: the daemon is stopping)."""
        if self.logdir_fd >= 0:
            os.close(self.logdir_fd)
            self.logdir_fd = -1


async def _closed(writer: RunWriter) -> ClosedFile | None:
    try:
        return await writer.close()
    except OSError:
        log.exception("run %s: closing the event file failed; recovery will finish it", writer.run_dir)
        return None
