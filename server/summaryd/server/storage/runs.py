"""The run registry: one writer and one active event file per run directory, shared by its sessions.

Batches are written by group commit (`GroupCommit`): what arrives while the previous commit is under way is
written together, in one hop to an I/O thread, with one write of each run's file and one journal append per
run, however many batches and runs it holds. A big job's daemon takes a batch from every rank each step, one
per run (a rank writes `<run>/<worker>`): a hop per batch cost more than the batch's own write.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

from summaryd.server.errors import EventError
from summaryd.server.io_threads import run_to_completion
from summaryd.server.operations.metrics import Metrics
from summaryd.server.records.event_check import check_and_frame
from summaryd.server.records.scalar_records import ScalarRecords, framed_together
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
    commit: GroupCommit | None = None
    # Opening the next file (`open_file`), and whether the last attempt failed (the commit then tries again
    # itself and fails the batches, which their sessions answer).
    opening: asyncio.Future[None] | None = None
    open_failed: bool = False
    _counters: tuple[Any, Any] | None = field(default=None, init=False, repr=False)

    async def write(self, session_id: str, last: int, events: Sequence[bytes]) -> None:
        """Check, frame and append one batch of `session_id` ending at sequence `last`; returns when the batch
        and its journal line are in the page cache (written with whatever else arrived meanwhile, `GroupCommit`).

        Raises:
            EventError: an event of the batch is refused; nothing of the batch was written.
            OSError: the file or its journal could not be written; nothing of the batch was written.
        """
        if self.commit is None:
            self.commit = GroupCommit(self.executor)
        metrics = self.metrics
        if metrics is not None:
            metrics.write_queue.inc()
        started = time.perf_counter()
        try:
            framed_bytes = await self.commit.write(self, session_id, last, events)
        except BaseException:
            # The error's traceback holds this frame for as long as the caller keeps the error (a future does):
            # the refused batch must not stay with it.
            del events
            raise
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
            self._counters[1].inc(framed_bytes)

    @property
    def end(self) -> FileEnd | None:
        """Where the run's active file ends now (None when none is open): what a durable flush or a close
        waits to see uploaded on a bucket logdir."""
        return (self.run_dir, self.file.name, self.file.size) if self.file is not None else None

    def _write_group(self, entries: Sequence[_Pending]) -> None:
        """Blocking, on an I/O thread, holding `lock`: check and frame each batch of `entries` (in order; one
        refused gets its error, the others go on), append them in one write and journal them in one append.
        A failed write or journal append fails every batch of the group (nothing of them stays in the file)."""
        self._frame(entries)
        good = [entry for entry in entries if entry.error is None]
        if not good:
            return
        try:
            if self.file is None:
                self._open_file()
                self.open_failed = False
            assert self.file is not None and self.journal is not None
            before = end = self.file.size
            for entry in good:
                end += len(entry.blob)
                entry.end = end
            self.file.append(b"".join(entry.blob for entry in good) if len(good) > 1 else good[0].blob)
            try:
                self.journal.batches([(entry.session_id, entry.last, entry.end) for entry in good])
            except OSError:
                # Not journaled means not acknowledged: take the records back out so that file and journal agree.
                self.file.truncate(before)
                raise
        except OSError as exc:
            for entry in good:
                entry.error = exc
            return
        for entry in good:
            if entry.session_id:  # the daemon's own records (aggregates) are written without a session
                self.marks[entry.session_id] = entry.last
        self.bytes_written += end - before
        try:
            self.journal.compact_if_large(self.marks, self.file.size)
        except OSError:
            log.exception("run %s: compacting the journal failed; it keeps growing", self.run_dir)

    async def open_file(self, first: _Pending) -> None:
        """Check and frame `first`, the batch that finds no file open, and, unless it is refused (a refused batch
        leaves no file behind), open the run's next event file and its journal before a commit writes to it
        (never raises: what fails is the batch's error, or the commit's own attempt to open)."""
        async with self.lock:
            await run_to_completion(self.executor, lambda: self._frame([first]))
            if self.file is not None or first.error is not None:
                return
            try:
                await run_to_completion(self.executor, self._open_file)
                self.open_failed = False
            except OSError:  # the commit's own attempt raises it to the batches
                self.open_failed = True

    def _frame(self, entries: Sequence[_Pending]) -> None:
        """Check and frame each batch of `entries` not framed yet; a refused one gets its error."""
        for entry in entries:
            if entry.framed:
                continue
            entry.framed = True
            events = entry.events
            try:
                if isinstance(events, ScalarRecords):
                    entry.blob = events.framed(self.limits)
                else:
                    entry.blob = check_and_frame(events, self.limits)
            except EventError as exc:
                entry.error = exc

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


@dataclass(eq=False)
class _Pending:
    """One batch waiting for its commit, and what the commit made of it."""

    writer: RunWriter
    session_id: str
    last: int
    events: Sequence[bytes]
    done: asyncio.Future[int]
    """Its result is the framed size, never the entry: an entry holding its future holding the entry is a cycle,
    freed by the cyclic collector only, with the batch in it."""
    blob: bytes = b""
    end: int = 0
    """The file's size after the batch."""
    error: BaseException | None = None
    framed: bool = False


COMMIT_TICK = 0.04
"""The least time between the starts of two commits (`GroupCommit`) while many write streams are open: what a
batch may wait when the daemon is busy, under a client's own linger (50 ms). 256 ranks unpaced (1,280 batches a
second) took 20-25 % less daemon CPU a batch than at 5 ms: a commit of some 50 batches, not 7, framed together
and aggregated as columns."""


class GroupCommit:
    """Writes the batches of every run of one registry: while a commit is under way on an I/O thread, the
    batches that arrive wait, and the next commit takes all of them at once (so the groups grow with the load,
    and a lone batch goes at once); busy, commits begin at most a tick (`COMMIT_TICK`) apart, or sooner once
    waiting cannot bring more batches (`commit_now`: every open write stream waits for a write, since a stream
    sends its next batch only when this one is answered; or a relay's message, a group already, waits), so that
    one client's back-to-back batches never wait out a tick. One commit is under way at a time; each run's
    batches keep their order.

    A commit holds the lock of each run it writes (a sync or a close of the run waits for it, as before); a run
    whose lock is held meanwhile (its fsync, its close) waits for a later commit, without holding up the others.
    """

    def __init__(
        self, executor: Executor, tick: float = COMMIT_TICK, commit_now: Callable[[], bool] | None = None
    ) -> None:
        """`commit_now` tells whether a busy commit may go at once (`sessions.streams.WriteStreams`; None:
        always, so that a commit never waits for more batches)."""
        self._executor = executor
        self._tick = tick
        self._commit_now = commit_now or _always
        self._queue: list[_Pending] = []
        self._task: asyncio.Task[None] | None = None
        self._gathered: asyncio.Future[None] | None = None  # while a commit waits out its tick
        self._started = -math.inf  # when the last commit began (the event loop's clock)

    def write(self, writer: RunWriter, session_id: str, last: int, events: Sequence[bytes]) -> asyncio.Future[int]:
        """Queue a batch; the future is done once it is written and journaled (or raises why not)."""
        entry = _Pending(writer, session_id, last, events, asyncio.get_running_loop().create_future())
        entry.done.add_done_callback(_retrieved)  # a caller cancelled meanwhile no longer looks at the outcome
        self._queue.append(entry)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._commit_all())
        elif self._gathered is not None and self._commit_now():
            _set_done(self._gathered)
        # Written whatever becomes of the caller (a cancelled caller cancels only its wait): `Session.apply`, whose
        # count must follow the file, runs to its end anyway (`SessionLifecycle._complete`).
        return entry.done

    async def _commit_all(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            # Busy (the last commit began less than a tick ago), the commit waits out the tick and takes all that
            # came meanwhile: a commit's cost (the hop to a thread, a write and a journal line a run) is then
            # shared by many ranks' batches, and their columns are framed together. After a quiet tick a batch
            # goes at once.
            wait = self._started + self._tick - loop.time()
            if wait > 0 and not self._commit_now():
                await self._gather(wait)
            started = loop.time()
            queued, self._queue = self._queue, []
            groups: dict[RunWriter, list[_Pending]] = {}
            waiting: set[RunWriter] = set()
            later: list[_Pending] = []
            for entry in queued:
                writer = entry.writer
                group = groups.get(writer)
                if group is not None:
                    group.append(entry)
                elif writer in waiting or writer.lock.locked():
                    waiting.add(writer)  # its fsync, its close or its file's opening is under way: a later commit
                    later.append(entry)
                elif writer.file is None and not writer.open_failed and not entry.framed:
                    # A new file and journal are made and synced apart, on a thread of their own, in parallel
                    # with other runs': inside the commit, a job's thousand first writes would queue one by one.
                    waiting.add(writer)
                    later.append(entry)
                    writer.opening = asyncio.ensure_future(writer.open_file(entry))
                else:
                    await writer.lock.acquire()  # free: no wait
                    groups[writer] = [entry]
            self._queue[:0] = later
            if not groups:  # every batch waits for a run's fsync, close or opening: the first of those, again
                first = later[0].writer
                if first.opening is not None:
                    await asyncio.shield(first.opening)
                async with first.lock:
                    pass
                continue  # no commit began: the batches that waited for it go at once
            self._started = started
            failed: BaseException | None = None
            try:
                await run_to_completion(self._executor, functools.partial(_write_groups, groups))
            except BaseException as exc:  # not a batch's own error (those are set on it): cancelled, or a bug
                failed = exc
            for writer, group in groups.items():
                _settle(writer, group, failed)
                writer.lock.release()
            if isinstance(failed, asyncio.CancelledError):
                raise failed

    async def _gather(self, wait: float) -> None:
        """Wait `wait` seconds, or until the commit may go at once (`write` ends the wait then)."""
        loop = asyncio.get_running_loop()
        self._gathered = gathered = loop.create_future()
        timer = loop.call_later(wait, _set_done, gathered)
        try:
            await gathered
        finally:
            timer.cancel()
            self._gathered = None


def _always() -> bool:
    return True


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _settle(writer: RunWriter, group: list[_Pending], failed: BaseException | None) -> None:
    """After a commit, on the event loop: hand each batch of `writer` written on to the sink, and answer it."""
    sink, file = writer.sink, writer.file
    for entry in group:
        error = failed
        if entry.error is not None:
            error, entry.error = _bare(entry.error), None
        if error is None and sink is not None and file is not None:
            sink.appended(writer.run_dir, file.name, entry.end, (entry.session_id, entry.last))
        if not entry.done.cancelled():
            if error is None:
                entry.done.set_result(len(entry.blob))
            else:
                entry.done.set_exception(error)
        # The batch's bytes go now, whatever still holds the entry: left to the cyclic collector, a flood's
        # batches stayed for a hundred batches (`test_faults_flood`).
        entry.events, entry.blob = (), b""


def _bare(error: BaseException) -> BaseException:
    """A batch's own error without its traceback and the error it was raised from: it is told by its message,
    and those would hold the I/O thread's frames, which hold the entry, which holds the error (a cycle, with the
    batch in it)."""
    error.__cause__ = error.__context__ = None
    return error.with_traceback(None)


def _retrieved(done: asyncio.Future[int]) -> None:
    if not done.cancelled():
        done.exception()


def _write_groups(groups: dict[RunWriter, list[_Pending]]) -> None:
    _frame_scalars_together([entry for group in groups.values() for entry in group])
    for writer, group in groups.items():
        writer._write_group(group)


# From how many scalars a commit's small batches are framed together: joined, they cost a fixed ~120 µs and
# ~0.5 µs a scalar; one by one (`ScalarRecords._framed_each`), ~1.2 µs a scalar: even at about 160.
_TOGETHER_SCALARS = 160


def _frame_scalars_together(entries: list[_Pending]) -> None:
    """Frame the commit's batches of scalar columns in one pass over them all (`framed_together`), whatever run
    each is for: a job's ranks send a small batch each, and one by one their records cost three times as much.
    When one fails a check, each is framed on its own (`RunWriter._frame`), and the refused one gets its error."""
    limits = entries[0].writer.limits
    # (The batches of one registry share its limits: the test is for a commit of writers made otherwise.)
    batches = [
        (entry, entry.events)
        for entry in entries
        if not entry.framed and isinstance(entry.events, ScalarRecords) and entry.writer.limits is limits
    ]
    if len(batches) < 2 or sum(len(events) for _, events in batches) < _TOGETHER_SCALARS:
        return
    blobs = framed_together([events for _, events in batches], limits)
    if blobs is None:
        return
    for (entry, _), blob in zip(batches, blobs, strict=True):
        entry.blob, entry.framed = blob, True


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
        commit_now: Callable[[], bool] | None = None,
    ) -> None:
        """Open the logdir (made when missing); `close()` closes its descriptor. With a `sink` (a bucket logdir)
        every appended and closed file is handed on to it; `commit_now` tells the group commit whether a busy
        commit may go at once (`GroupCommit`)."""
        self.metrics = metrics
        self.sink = sink
        os.makedirs(logdir, exist_ok=True)
        self.logdir = os.path.realpath(logdir)
        self.logdir_fd = os.open(self.logdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._executor = executor
        self._journal_dir_fd = journal_dir_fd
        self._runs: dict[str, RunWriter] = {}
        self._commit = GroupCommit(executor, commit_now=commit_now)
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
                    commit=self._commit,
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
