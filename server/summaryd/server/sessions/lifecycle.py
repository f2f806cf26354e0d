"""The life of every session, from `OpenSession` to its close or release, and every session-store write.

A session opens new or resumes where the session store says it stands; it writes batches and files, flushes,
and ends either closed by its client (final) or released (its lease ran out, or the daemon stops; it stays
resumable). The servicer has checked each request and the caller's token before it gets here; what is refused
here is raised as one of the errors of `errors`, which the servicer answers with one status each.

The session store is written here only, in one place (`_record_blocking`): a session's record when it leaves
(released or closed), and when a run's event file closes, the sequence numbers its journal held
(`runs.ClosedFile`), in the same append, synced once; then the file's journal is deleted.

Everything that changes a session or a file (a batch, a flush, a close, a release) runs to its end even if
the RPC that asked for it is cancelled (`_complete`): a client that hangs up half-way must not leave a batch
written but not counted, which would write it twice when the client sends it again.

Where the bytes go is the storage's (`storage.backend.Storage`: a local disk, or a bucket with its leases,
uploads and session state); the rules here hold for both.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from summaryd.server.aggregation.aggregator import Aggregation, AggregationSettings
from summaryd.server.errors import (
    DiskFullError,
    ResumeRefusedError,
    RunMismatchError,
    RunPathError,
    SessionClosedError,
    SessionReleasedError,
    SessionUnknownError,
    StorageError,
)
from summaryd.server.io_threads import run_to_completion
from summaryd.server.operations.logs import Throttle
from summaryd.server.security.limits import DEFAULT, LimitError, Limits
from summaryd.server.security.request_checks import MAX_SEQUENCE
from summaryd.server.sessions.live import Ending, Session, SessionTable
from summaryd.server.storage import run_files
from summaryd.server.storage.backend import SharedRecord, Storage, owned_run
from summaryd.server.storage.runs import ClosedFile, FileEnd, RunWriter
from summaryd.server.storage.session_store import SessionRecord, SessionStore
from summaryd.v1 import summaryd_pb2 as pb

log = logging.getLogger("summaryd.server.session_lifecycle")  # the name log lines carry, kept across moves

T = TypeVar("T")

# What the daemon fails to write is logged at a limited rate: a client retrying into a broken disk must not flood.
_write_failures = Throttle(log)


def _retrieve(task: asyncio.Task[Any]) -> None:
    # An RPC cancelled while its work went on no longer awaits the result; its error is logged, not lost.
    if not task.cancelled() and task.exception() is not None:
        log.debug("work of a cancelled call failed: %r", task.exception())


class SessionLifecycle:
    """Opens, resumes, writes, flushes, releases and closes the sessions of one storage and session store."""

    def __init__(
        self,
        storage: Storage,
        store: SessionStore,
        lease: float,
        limits: Limits = DEFAULT,
        aggregation: AggregationSettings | None = None,
    ) -> None:
        self.storage = storage
        self.registry = storage.runs
        # Cross-worker aggregation of the sessions that ask for it (off unless its settings enable it): told of
        # every batch written; the files of an aggregator that stops on its own are recorded here.
        self.aggregation = Aggregation(storage, aggregation, limits, closed=self._record_closed)
        self.registry.observe(self.aggregation)
        self.store = store
        self.lease = lease
        self.limits = limits
        self._stopping = False
        self.sessions = SessionTable()
        # Batches, flushes, closes and releases being carried out; shutdown waits for these.
        self._busy = 0
        self._quiet = asyncio.Event()
        self._quiet.set()

    # ---- work that outlives its call -------------------------------------------------------------------

    async def _complete(self, work: Coroutine[Any, Any, T]) -> T:
        """Carry `work` out to its end even if the calling RPC is cancelled; `wait_quiet` waits for it."""
        self._busy += 1
        self._quiet.clear()
        # The work's own task, counted out and its outcome handed to the caller by one done callback: a coroutine
        # around it to count would be one more frame and resumption per batch, and `asyncio.shield` two more
        # callbacks (one a loop iteration of its own once the caller has its answer).
        loop = asyncio.get_running_loop()
        task = loop.create_task(work)
        answer: asyncio.Future[T] = loop.create_future()
        task.add_done_callback(functools.partial(self._done, answer))
        return await answer  # cancelled, only this wait ends: the task goes on

    def _done(self, answer: asyncio.Future[T], task: asyncio.Task[T]) -> None:
        _retrieve(task)
        self._busy -= 1
        if self._busy == 0:
            self._quiet.set()
        if answer.done():  # the caller was cancelled meanwhile
            return
        if task.cancelled():
            answer.cancel()
        elif (exc := task.exception()) is not None:
            answer.set_exception(exc)
        else:
            answer.set_result(task.result())

    async def wait_quiet(self) -> None:
        """Return once no batch, flush, close or release is being carried out."""
        await self._quiet.wait()

    # ---- the durable watermark (a bucket logdir) -----------------------------------------------------

    @property
    def durable_acks(self) -> bool:
        """Whether an ack means staged only, and clients keep batches until the durable watermark covers them."""
        return self.storage.durable_acks

    def durable(self, session_id: str) -> int:
        """The session's highest sequence number uploaded and recorded in the bucket (0 on a local logdir)."""
        return self.storage.durable(session_id)

    async def _shared_state(self, session_id: str) -> SharedRecord | None:
        """The session as the bucket knows it (a bucket logdir; None on a local one)."""
        try:
            return await self.storage.stored(session_id)
        except OSError as exc:
            raise self._storage_error(exc, "?", "the session's state could not be read") from exc

    async def _settle(
        self, session_id: str, run_dir: str, record: SessionRecord | None, shared: SharedRecord | None
    ) -> tuple[SessionRecord | None, int]:
        """The run's lease held: the session's record and the highest sequence number of it in the bucket
        (`Storage.settle`).

        Raises:
            StorageError: the bucket could not be read or written.
        """
        try:
            return await self.storage.settle(session_id, run_dir, record, shared)
        except OSError as exc:
            raise self._storage_error(exc, run_dir, "the session's state in the bucket could not be settled") from exc

    # ---- lookups ---------------------------------------------------------------------------------------

    def run_of(self, session_id: str) -> str | None:
        """The run a session id is bound to: its live session's, else its record's; None when unknown."""
        session = self.sessions.get(session_id)
        if session is not None:
            return session.run.run_dir
        record = self.store.get(session_id)
        return record.run_dir if record is not None else None

    def live(self, session_id: str) -> Session:
        """The live session `session_id`.

        Raises:
            SessionClosedError, SessionReleasedError: it ended (released: resume it with `OpenSession`).
            SessionUnknownError: the daemon never saw it, or forgot it (`--session-retention-days`).
        """
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        record = self.store.get(session_id)
        if record is not None and record.closed:
            raise SessionClosedError(session_id)
        if record is not None:
            raise SessionReleasedError(session_id, self.lease)
        raise SessionUnknownError(session_id)

    # ---- opening ---------------------------------------------------------------------------------------

    async def open(self, request: pb.OpenSessionRequest, parts: list[str], peer: str) -> Session:
        """Open session `request.session_id` on the run `parts` for a client at `peer`: new, resumed where the
        store says it stands, or the live one (its lease renewed).

        Raises:
            SessionClosedError: the session was closed.
            RunMismatchError: the session id is bound to another run.
            ResumeRefusedError: resuming could write events twice.
            LimitError: the session would exceed `--max-sessions`, `--max-sessions-per-peer` or `--max-open-runs`.
            RunPathError: a part of the run path exists already as a symlink or a file.
            RunOwnedElsewhereError: (a bucket logdir) another daemon writes the run.
            StorageError: the run directory (or the run's lease) could not be opened.
        """
        session_id, run_dir = request.session_id, "/".join(parts)
        session = self.sessions.get(session_id)
        refused = self.aggregation.open_problem(request)
        if refused is not None:
            raise RunPathError(refused)
        if session is None:
            # A bucket logdir: the bucket's state says what is uploaded, also of a session the local store knows.
            shared = await self._shared_state(session_id)
            record = self.store.get(session_id) or (shared.record if shared is not None else None)
            self._check_resumable(request, run_dir, record)
            session = await self._complete(self._start(request, parts, record, peer, shared))
        if session.run.run_dir != run_dir:  # held already, or opened meanwhile by a racing call of the same id
            raise RunMismatchError(session_id, session.run.run_dir, run_dir)
        session.touch()
        return session

    def _check_resumable(self, request: pb.OpenSessionRequest, run_dir: str, record: SessionRecord | None) -> None:
        session_id = request.session_id
        if record is not None and record.closed:
            raise SessionClosedError(session_id)
        if record is not None and record.run_dir != run_dir:
            raise RunMismatchError(session_id, record.run_dir, run_dir)
        if record is not None and record.last > MAX_SEQUENCE:  # kept by a daemon that did not bound them
            raise ResumeRefusedError(
                f"session {session_id} holds sequence numbers beyond {MAX_SEQUENCE}; open a new session"
            )
        if (record is not None and record.doubtful) or (
            record is None and self.store.may_have_lost(request.next_sequence, request.session_started)
        ):
            raise ResumeRefusedError(
                f"session {session_id} cannot be resumed: the daemon's record of it may have been lost with "
                f"damaged state (see the daemon's log), and resuming could write its events twice; check run "
                f"{run_dir!r} for what arrived and log the rest in a new session"
            )

    async def _start(
        self,
        request: pb.OpenSessionRequest,
        parts: list[str],
        record: SessionRecord | None,
        peer: str,
        shared: SharedRecord | None = None,
    ) -> Session:
        """A session this daemon does not hold live: new, or resumed where the session store (or, on a daemon
        that does not know it, the bucket: `state` and the run's segments) says it stands."""
        over = self._over_session_limits(peer)
        if over is not None:  # before any directory is made
            raise LimitError(over)
        run = owned_run("/".join(parts), request.worker)
        await self._own(run)
        try:
            record, durable = await self._settle(request.session_id, "/".join(parts), record, shared)
            session = await self._start_owned(request, parts, record, peer)
            self._track(session, durable)
        except BaseException:
            await self._disown(run)
            raise
        return session

    async def _own(self, run_dir: str) -> None:
        """Hold the run (a bucket logdir: its lease) for one more session."""
        try:
            await self.storage.own(run_dir)
        except OSError as exc:
            raise self._storage_error(exc, run_dir, "the run's lease could not be taken") from exc

    async def _disown(
        self, run_dir: str, end: FileEnd | None = None, closing: tuple[str, str, int] | None = None
    ) -> None:
        """Let go of the run for one session that staged up to `end` (and leaves by a close: `closing`): the
        last session's release waits for that upload, and for the closed session's state. At shutdown the
        leases are released after the last upload."""
        if not self._stopping:
            await self.storage.let_go(run_dir, [end] if end is not None else [], closing)

    async def _start_owned(
        self, request: pb.OpenSessionRequest, parts: list[str], record: SessionRecord | None, peer: str
    ) -> Session:
        session_id = request.session_id
        try:
            writer = await self.registry.acquire(parts, self.limits)
        except OSError as exc:
            raise self._storage_error(exc, "/".join(parts), "the run directory could not be opened") from exc
        # Another OpenSession of the same id may have won the race while the directory was opened.
        raced = self.sessions.get(session_id)
        if raced is not None:
            await self.registry.release(writer)
            # This call's count; the raced session holds its own.
            await self._disown(owned_run(writer.run_dir, request.worker))
            return raced
        # Counted again right before the session is added (no await in between): concurrent opens cannot overshoot.
        over = self._over_session_limits(peer)
        if over is not None:
            await self.registry.release(writer)
            raise LimitError(over)
        client = pb.ClientIdentity()
        client.CopyFrom(request.client)
        # A session the daemon has no record of (its state directory was lost, or it never wrote) continues the
        # client's numbering. One it has a record of resumes where the record stands, even when the client
        # claims more (the daemon lost staged events with its disk, a bucket's state is behind): the answer's
        # `last_sequence` tells the client to resend from there, rather than the gap being skipped.
        claimed = max(request.next_sequence - 1, 0)
        acked = record.last if record is not None else claimed
        if claimed > acked:
            log.warning(
                "session %s: its client has sequence numbers through %d acknowledged, the daemon holds %d; "
                "it resumes from %d",
                session_id,
                claimed,
                acked,
                acked + 1,
            )
        session = Session(
            session_id, writer, request.worker, request.world_size, client, self.lease, peer=peer, acked=acked
        )
        self.sessions.add(session)
        await self.aggregation.joined(session, request, parts)
        log.info(
            "session %s %s: run %s at sequence %d, client %s pid %d (%s %s)",
            session_id,
            "resumed" if record is not None else "opened",
            writer.run_dir,
            acked,
            client.host or "?",
            client.pid,
            client.framework or "?",
            client.version or "?",
        )
        return session

    def _track(self, session: Session, durable: int) -> None:
        """Follow the session's durable watermark from `durable` (what the bucket holds of it); whatever it
        holds beyond is staged here and durable once the run's staged file is uploaded up to its end now."""
        self.storage.track(session.session_id, session.run, session.acked, durable)

    def _over_session_limits(self, peer: str) -> str | None:
        """Why one more session from `peer` is too many, or None."""
        limits = self.limits
        if len(self.sessions) >= limits.max_sessions:
            return (
                f"the daemon holds {len(self.sessions)} live sessions, its limit (--max-sessions); close finished "
                "sessions or raise the limit"
            )
        from_peer = self.sessions.from_peer(peer)
        if from_peer >= limits.max_sessions_per_peer:
            return (
                f"{peer} holds {from_peer} live sessions, the limit per client address (--max-sessions-per-peer); "
                "close finished sessions or raise the limit"
            )
        return None

    # ---- writing ---------------------------------------------------------------------------------------

    async def write(self, session: Session, first: int, events: Sequence[bytes]) -> int:
        """Write a batch (see `Session.apply`); return the session's highest contiguous sequence number.

        Raises:
            SequenceGapError, SessionClosedError, SessionReleasedError, BatchRefusedError: from `Session.apply`.
            StorageError: the batch was not written.
        """
        try:
            acked = await self._complete(session.apply(first, events))
        except OSError as exc:
            raise self._storage_error(exc, session.run.run_dir, "the batch was not written") from exc
        if events:
            self.storage.staged(session.session_id, session.run, session.acked)
        return acked

    async def flush(self, session: Session, durable: bool) -> int:
        """The session's highest contiguous sequence number, all of it on disk when `durable` (for a bucket
        logdir: uploaded).

        Raises:
            StorageError: fsync failed.
        """
        session.touch()
        uploaded = session.run.end
        acked = await self._complete(self._flush(session, durable))
        if durable:
            await self._uploaded(uploaded)
        return acked

    async def _uploaded(self, end: FileEnd | None) -> None:
        """A bucket logdir: wait until the staged bytes up to `end` are uploaded (sealed now). Not carried out
        to its end when the call is cancelled: the bytes are staged and journaled already, and a bucket that
        fails would hold the call (and shutdown) forever; the client's deadline ends the wait."""
        if end is not None:
            try:
                await self.storage.upload_through(end)
            except OSError as exc:  # the run's lease was lost: the new owner takes the resend
                raise self._storage_error(exc, end[0], "the events were not uploaded") from exc

    async def _flush(self, session: Session, durable: bool) -> int:
        async with session.lock:
            # Writes go straight to the OS, so acknowledged events are visible already; durable adds fsync.
            if durable:
                await self._sync(session.run, "fsync failed")
            return session.acked

    async def put_file(self, session: Session, file_parts: list[str], path: str, content: bytes) -> None:
        """Write the file `path` (checked, split into `file_parts`) beside the session's event files.

        Raises:
            RunPathError: a directory on the way is a symlink or a file, or the path names a directory.
            StorageError: the file was not written.
        """
        session.touch()
        run_dir, logdir_fd = session.run.run_dir, self.registry.logdir_fd

        def put() -> None:
            run_files.put_file(logdir_fd, run_dir.split("/"), file_parts, content)

        try:
            await self._complete(run_to_completion(self.registry.executor, put))
            # A bucket logdir: the file goes up whole before the answer.
            await self._complete(self.storage.file_written(run_dir, path, content))
        except IsADirectoryError:
            raise RunPathError(f"file path {path!r} names a directory of the run") from None
        except OSError as exc:
            raise self._storage_error(exc, run_dir, f"the file {path!r} was not written") from exc
        session.file_written()

    # ---- leaving ---------------------------------------------------------------------------------------

    async def expire_idle(self) -> None:
        """Release every session not heard from (no batch, no heartbeat) within its lease.

        Its file is synced and closed once no other session holds it; the session itself stays resumable.
        """
        now = time.monotonic()
        for session in self.sessions:
            if session.expired(now):
                await self._complete(self._release(session, now))

    async def release_lost(self) -> None:
        """Release the sessions of each run the storage stops owning (another daemon took it over), as it
        happens, runs side by side; returns when the storage says no more will come (a local logdir: at once)."""
        releasing: set[asyncio.Task[None]] = set()
        try:
            async for run_dir in self.storage.lost_runs():
                task = asyncio.ensure_future(self._release_lost(run_dir))
                releasing.add(task)
                task.add_done_callback(releasing.discard)
        finally:
            for task in list(releasing):  # the releases themselves run to their end (`_complete`)
                task.cancel()

    async def _release_lost(self, run_dir: str) -> None:
        try:
            await self.release_run(run_dir)
        except Exception:
            log.exception("run %s: ending its sessions after the lease was lost failed", run_dir)

    async def release_run(self, run_dir: str) -> None:
        """Release every live session of the run `run_dir` (another daemon took the run over: every worker); they
        stay resumable, and their clients, opening them again, are sent to the new owner."""
        for session in self.sessions:
            if owned_run(session.run.run_dir, session.worker) == run_dir:
                await self._complete(self._release(session, None))

    async def close_all(self) -> None:
        """Release every session and close every file (shutdown); clients resume their sessions later."""
        self._stopping = True
        for session in self.sessions:
            await self._complete(self._release(session, None))
        await self._record_closed(await self.aggregation.close_all())
        closed = await self.registry.close_all()
        if closed:
            await self._record([], closed, sync=True)

    async def close(self, session_id: str) -> tuple[int, int]:
        """Close a session for good: its events are on disk; return its last sequence number and the events
        it wrote while live (0 for a session that was not live).

        Raises:
            SessionUnknownError: the daemon does not know the session.
            StorageError: fsync failed; the session stays open.
        """
        session = self.sessions.get(session_id)
        if session is None:
            return await self._complete(self._close_record(session_id)), 0
        uploaded = session.run.end
        if await self._complete(self._leave(session, "closed")):
            await self._uploaded(uploaded)
            # Everything uploaded: a bucket's state says closed.
            await self.storage.closed(session.session_id, session.run.run_dir, session.acked)
            log.info(
                "session %s closed: run %s, %d events written, %d duplicates dropped",
                session.session_id,
                session.run.run_dir,
                session.events_written,
                session.duplicates_dropped,
            )
        elif session.ending == "released":  # released while the close waited: close what the store holds
            await self._complete(self._close_record(session_id))
        return session.acked, session.events_written

    async def _release(self, session: Session, expired_at: float | None) -> None:
        if not await self._leave(session, "released", expired_at):
            return
        for task in list(session.streams):
            task.cancel()
        if expired_at is not None:
            log.info(
                "session %s released after %.0fs without a batch or heartbeat: run %s, client pid %d, "
                "%d events written",
                session.session_id,
                session.allowed_idle,
                session.run.run_dir,
                session.client.pid,
                session.events_written,
            )

    async def _leave(self, session: Session, ending: Ending, expired_at: float | None = None) -> bool:
        """End a live session (`closed`: after its file is synced); False when it had ended already, or (a
        release at `expired_at`) was heard from meanwhile.

        The session leaves the table last, once the store holds where it stood, so that a resume always finds
        it. The last session to let go of its run closes the run's file: the file's sequence numbers go into
        the same store append, and the store is synced once for both.

        Raises:
            StorageError: (a close) fsync failed; the session stays open.
        """
        async with session.lock:
            if session.ending is not None:
                return False
            if expired_at is not None and not session.expired(expired_at):
                return False  # a batch or heartbeat arrived meanwhile
            closing = ending == "closed"
            if closing:
                await self._sync(session.run, "fsync failed; the session stays open")
            end = session.run.end
            closed = await self.registry.release(session.run)
            # A closed flag is synced with the run's last close; until then the file's journal, just synced,
            # holds the session's sequence numbers.
            last = session.run.sessions == 0
            # Released having written nothing, it is not remembered: a resume starts where its client says.
            record = None
            if closing or session.wrote or self.store.get(session.session_id) is not None:
                record = SessionRecord(session.session_id, session.run.run_dir, session.acked, closed=closing)
            await self._record(
                [record] if record is not None else [], [closed] if closed else [], sync=closing and last
            )
            self.sessions.remove(session, ending)
            await self._disown(
                owned_run(session.run.run_dir, session.worker),
                end,
                (session.session_id, session.run.run_dir, session.acked) if closing else None,
            )
            others = self.sessions.of_worker(session)  # the worker's other live sessions, not every session
            await self._record_closed(await self.aggregation.left(session, others, self._stopping))
        return True

    async def _close_record(self, session_id: str) -> int:
        """Close a session that is not live (released, or closed already); return its last sequence number.

        Raises:
            SessionUnknownError: the store never saw it.
            StorageError: fsync failed; the session stays open.
        """
        record = self.store.get(session_id)
        if record is None:
            raise SessionUnknownError(session_id)
        if not record.closed:
            held = [run for run in self.registry.runs if run.run_dir == record.run_dir]
            for run in held:
                await self._sync(run, "fsync failed; the session stays open")  # other sessions keep it open
            closed = SessionRecord(session_id, record.run_dir, record.last, closed=True)
            try:
                # While the run is held, its last close syncs the store (the journal has the numbers).
                await run_to_completion(self.registry.executor, lambda: self._record_blocking([closed], [], not held))
            except OSError as exc:
                raise self._storage_error(exc, record.run_dir, "fsync failed; the session stays open") from exc
        return record.last

    # ---- the session store -----------------------------------------------------------------------------

    async def _record_closed(self, closed: list[ClosedFile]) -> None:
        """The records of files closed outside a session's end (the aggregate runs'), synced."""
        if closed:
            await self._record([], closed, sync=True)

    async def _record(self, records: list[SessionRecord], closed: list[ClosedFile], *, sync: bool) -> None:
        """Write `records` and the marks of `closed` files; a failure is logged (the journals stay)."""
        if not (records or closed):
            return
        try:
            await run_to_completion(self.registry.executor, lambda: self._record_blocking(records, closed, sync))
        except OSError:
            log.exception(
                "the session store could not be written (sessions %s)",
                ", ".join(r.session_id for r in records) or "of closed files",
            )

    def _record_blocking(self, records: list[SessionRecord], closed: Sequence[ClosedFile], sync: bool) -> None:
        """The one writer of the session store while the daemon serves: `records`, then the marks of the files
        just `closed`, in one append; synced when asked and whenever files closed, whose journals are deleted
        once it is. A mark repeats what its session's record says, unless writing that record failed; the
        repeated line also outlives damage to the earlier one.

        Blocking: runs on the executor. Raises the store's OSError; the closed files' journals then stay.
        """
        marks = [mark for file in closed for mark in file.records()]
        try:
            self.store.record([*records, *marks], sync=sync or bool(closed))
        except OSError:
            for file in closed:
                _finish(file, recorded=False)
            raise
        for file in closed:
            _finish(file, recorded=True)

    # ---- file errors -----------------------------------------------------------------------------------

    async def _sync(self, run: RunWriter, what: str) -> None:
        try:
            await run.sync()
        except OSError as exc:
            raise self._storage_error(exc, run.run_dir, what) from exc

    @staticmethod
    def _storage_error(exc: OSError, run_dir: str, what: str) -> StorageError:
        error = StorageError.of(exc, run_dir, what)
        if not isinstance(error, DiskFullError):  # a full disk is logged with every RESOURCE_EXHAUSTED (`refusals`)
            _write_failures.warning(f"errno {exc.errno}", "run %s: %s: %s", run_dir, what, exc)
        return error


def _finish(file: ClosedFile, *, recorded: bool) -> None:
    try:
        file.finish(recorded)
    except OSError:
        log.exception(
            "run %s: the journal of %s could not be deleted; the next start-up recovers it", file.run_dir, file.name
        )


class SessionCollector:
    """Figures read from the sessions at scrape time: live sessions, open files and dropped duplicates."""

    def __init__(self, lifecycle: SessionLifecycle) -> None:
        self._lifecycle = lifecycle

    def collect(self) -> Iterator[Metric]:
        sessions = self._lifecycle.sessions
        live = list(sessions)
        yield GaugeMetricFamily("summaryd_sessions", "Live sessions.", value=len(live))
        open_files = sum(1 for run in self._lifecycle.registry.runs if run.file is not None)
        yield GaugeMetricFamily("summaryd_open_files", "Event files open for writing.", value=open_files)
        duplicates = sessions.ended_duplicates + sum(s.duplicates_dropped for s in live)
        yield CounterMetricFamily(
            "summaryd_duplicates_dropped", "Events dropped because the daemon already held them.", value=duplicates
        )
