"""The `summaryd.v1.Summaries` servicer: validation at the edge, one clear status per failure.

Everything that changes a session or a file (a batch, a flush, a close, a release) runs to its end even if
the RPC that asked for it is cancelled (`_complete`): a client that hangs up half-way must not leave a batch
written but not counted, which would write it twice when the client sends it again.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Coroutine
from typing import Any, NoReturn, TypeVar

import grpc
from grpc import aio

from summaryd.server.auth import Grant, current_caller
from summaryd.server.errors import REFUSED_SEQUENCE_KEY, EventError, LimitError, RunPathError
from summaryd.server.limits import DEFAULT, Limits
from summaryd.server.logs import Throttle
from summaryd.server.request_checks import MAX_SEQUENCE, open_problem, session_id_problem, write_problem
from summaryd.server.runpath import run_dir_parts
from summaryd.server.runs import RunRegistry, run_to_completion
from summaryd.server.session_store import SessionRecord, SessionStore
from summaryd.server.sessions import Ending, SequenceGapError, Session, SessionEndedError, SessionTable
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.version import VERSION

log = logging.getLogger(__name__)

Context = aio.ServicerContext[Any, Any]
T = TypeVar("T")

_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
# One answer for a session id the caller's token may not reach and for one the daemon does not know, so that a
# token cannot learn which session ids exist on runs beyond its prefixes.
_NOT_ITS_SESSION = (
    "the session is unknown or on a run outside this token's prefixes; open a session with a new id on a run "
    "the token may write"
)


# What the daemon fails to write is logged at a limited rate: a client retrying into a broken disk must not flood.
_write_failures = Throttle(log)


def _io_status(exc: OSError, run_dir: str, what: str) -> tuple[grpc.StatusCode, str]:
    """The status for a failed file operation: a full disk is RESOURCE_EXHAUSTED, anything else UNAVAILABLE."""
    if exc.errno in _DISK_FULL:  # logged with every other RESOURCE_EXHAUSTED (`refusals`)
        return grpc.StatusCode.RESOURCE_EXHAUSTED, (
            f"the disk holding run {run_dir!r} is full ({exc.strerror}); {what}: keep the events and send them "
            "again once space is freed"
        )
    _write_failures.warning(f"errno {exc.errno}", "run %s: %s: %s", run_dir, what, exc)
    return grpc.StatusCode.UNAVAILABLE, f"the daemon cannot write run {run_dir!r} ({exc.strerror}); {what}"


def _peer_host(peer: str) -> str:
    """A gRPC peer without its port: `ipv4:10.0.0.5:51234` is `ipv4:10.0.0.5`, `ipv6:[::1]:5123` is `ipv6:[::1]`."""
    if peer.startswith(("ipv4:", "ipv6:")):
        return urllib.parse.unquote(peer.rsplit(":", 1)[0])  # gRPC writes `ipv6:%5B::1%5D:5123`
    return peer  # unix sockets: every local client is one peer


def _retrieve(task: asyncio.Task[Any]) -> None:
    # An RPC cancelled while its work went on no longer awaits the result; its error is logged, not lost.
    if not task.cancelled() and task.exception() is not None:
        log.debug("work of a cancelled call failed: %r", task.exception())


class SummariesService(pb_grpc.SummariesServicer):
    """Sessions, the write stream, flush, close and status over one run registry and session store."""

    def __init__(self, registry: RunRegistry, store: SessionStore, lease: float, limits: Limits = DEFAULT) -> None:
        self.registry = registry
        self.store = store
        self.lease = lease
        self.limits = limits
        self.sessions = SessionTable()
        self._draining = False
        # Write handlers waiting for their client's next message: cancelled at once when draining.
        self._idle_streams: set[asyncio.Task[object]] = set()
        # Batches, flushes and closes being carried out; shutdown waits for these, not for idle clients.
        self._busy = 0
        self._quiet = asyncio.Event()
        self._quiet.set()

    # ---- lifecycle -------------------------------------------------------------------------------------

    def start_draining(self) -> None:
        """Stop taking new sessions and end every write stream that is not in the middle of a batch."""
        self._draining = True
        for task in list(self._idle_streams):
            task.cancel()

    async def wait_quiet(self) -> None:
        """Return once no batch, flush or close is being carried out."""
        await self._quiet.wait()

    async def _complete(self, work: Coroutine[Any, Any, T]) -> T:
        """Carry `work` out to its end even if the calling RPC is cancelled; shutdown waits for it."""
        self._busy += 1
        self._quiet.clear()

        async def tracked() -> T:
            try:
                return await work
            finally:
                self._busy -= 1
                if self._busy == 0:
                    self._quiet.set()

        task = asyncio.ensure_future(tracked())
        task.add_done_callback(_retrieve)
        return await asyncio.shield(task)

    async def expire_idle_sessions(self) -> None:
        """Release every session not heard from (no batch, no heartbeat) within the lease.

        Its file is synced and closed once no other session holds it; the session itself stays resumable.
        """
        now = time.monotonic()
        for session in self.sessions:
            if session.idle_for(now) > self._lease_of(session):
                await self._complete(self._release(session, now))

    def _lease_of(self, session: Session) -> float:
        """The lease, or half of it for a session never heard from since it opened: a client heartbeats at a
        third of the lease at most, so only one that opened a session and walked away is released early."""
        return self.lease if session.heard else self.lease / 2

    async def release_all(self) -> None:
        """Release every session (shutdown); clients resume them when the daemon is back."""
        for session in self.sessions:
            await self._complete(self._release(session, None))

    async def _release(self, session: Session, expired_at: float | None) -> None:
        async with session.lock:
            if session.ending is not None:
                return
            lease = self._lease_of(session)
            if expired_at is not None and session.idle_for(expired_at) <= lease:
                return  # a batch or heartbeat arrived meanwhile
            # Into the store before leaving the table, so that a resume always finds where it stood.
            await self._remember(session, closed=False)
            self.sessions.remove(session, "released")
        for task in list(session.streams):
            task.cancel()
        await self.registry.release(session.run)
        if expired_at is not None:
            log.info(
                "session %s released after %.0fs without a batch or heartbeat: run %s, client pid %d, "
                "%d events written",
                session.session_id,
                lease,
                session.run.run_dir,
                session.client.pid,
                session.events_written,
            )

    async def _remember(self, session: Session, *, closed: bool) -> None:
        if not (closed or session.wrote or self.store.get(session.session_id)):
            return  # released having written nothing: a resume starts where its client says, as now
        record = SessionRecord(session.session_id, session.run.run_dir, session.acked, closed=closed)
        try:
            await run_to_completion(self.registry.executor, lambda: self.store.record([record], sync=closed))
        except OSError:
            log.exception("session %s: the session store could not be written", session.session_id)

    # ---- OpenSession -----------------------------------------------------------------------------------

    async def OpenSession(self, request: pb.OpenSessionRequest, context: Context) -> pb.OpenSessionResponse:
        if self._draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the daemon is shutting down; retry later")
        session_id = request.session_id
        problem = open_problem(request)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        parts = await self._run_parts(request, context)
        run_dir = "/".join(parts)
        await self._authorize_run(run_dir, context)
        await self._authorize_session(session_id, context, opening=True)
        session = self.sessions.get(session_id)
        if session is None:
            record = self.store.get(session_id)
            if record is not None and record.closed:
                await self._abort_closed(session_id, context)
            if record is not None and record.run_dir != run_dir:
                await self._abort_run_switch(session_id, record.run_dir, run_dir, context)
            if record is not None and record.last > MAX_SEQUENCE:  # kept by a daemon that did not bound them
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"session {session_id} holds sequence numbers beyond {MAX_SEQUENCE}; open a new session",
                )
            if (record is not None and record.doubtful) or (
                record is None and self.store.may_have_lost(request.next_sequence, request.session_started)
            ):
                await self._abort_lost(session_id, run_dir, context)
            try:
                peer = _peer_host(context.peer() or "")
                session = await self._complete(self._start_session(request, parts, record, peer))
            except RunPathError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except LimitError as exc:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            except OSError as exc:
                await context.abort(*_io_status(exc, run_dir, "the run directory could not be opened"))
        if session.run.run_dir != run_dir:  # held already, or opened meanwhile by a racing call of the same id
            await self._authorize_session(session_id, context)
            await self._abort_run_switch(session_id, session.run.run_dir, run_dir, context)
        session.touch()
        return pb.OpenSessionResponse(
            run_dir=run_dir,
            last_sequence=session.acked,
            lease_seconds=self.lease,
            max_message_bytes=self.limits.max_message_bytes,
            max_event_bytes=self.limits.max_event_bytes,
            max_batch_events=self.limits.max_batch_events,
        )

    async def _run_parts(self, request: pb.OpenSessionRequest, context: Context) -> list[str]:
        try:
            return run_dir_parts(request.run, request.worker, self.limits.max_run_path_bytes, self.limits.max_run_depth)
        except RunPathError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def _start_session(
        self, request: pb.OpenSessionRequest, parts: list[str], record: SessionRecord | None, peer: str
    ) -> Session:
        """A session this daemon does not hold live: new, or resumed where the session store says it stands.

        Raises:
            LimitError: the session would exceed `--max-sessions`, `--max-sessions-per-peer` or `--max-open-runs`.
        """
        session_id = request.session_id
        over = self._over_session_limits(peer)
        if over is not None:  # before any directory is made
            raise LimitError(over)
        writer = await self.registry.acquire(parts, self.limits)
        # Another OpenSession of the same id may have won the race while the directory was opened.
        raced = self.sessions.get(session_id)
        if raced is not None:
            await self.registry.release(writer)
            return raced
        # Counted again right before the session is added (no await in between): concurrent opens cannot overshoot.
        over = self._over_session_limits(peer)
        if over is not None:
            await self.registry.release(writer)
            raise LimitError(over)
        client = pb.ClientIdentity()
        client.CopyFrom(request.client)
        session = Session(session_id, writer, request.worker, request.world_size, client, peer)
        # A client that saw more acknowledged than the store remembers (the state directory was lost)
        # continues its own numbering rather than being stuck.
        session.acked = max(record.last if record else 0, request.next_sequence - 1, 0)
        self.sessions.add(session)
        log.info(
            "session %s %s: run %s at sequence %d, client %s pid %d (%s %s)",
            session_id,
            "resumed" if record is not None else "opened",
            writer.run_dir,
            session.acked,
            client.host or "?",
            client.pid,
            client.framework or "?",
            client.version or "?",
        )
        return session

    def _over_session_limits(self, peer: str) -> str | None:
        """Why one more session from `peer` is too many, or None."""
        limits = self.limits
        if len(self.sessions) >= limits.max_sessions:
            return (
                f"the daemon holds {len(self.sessions)} live sessions, its limit (--max-sessions); close finished "
                "sessions or raise the limit"
            )
        from_peer = sum(1 for s in self.sessions if s.peer == peer)
        if from_peer >= limits.max_sessions_per_peer:
            return (
                f"{peer} holds {from_peer} live sessions, the limit per client address (--max-sessions-per-peer); "
                "close finished sessions or raise the limit"
            )
        return None

    # ---- Write -----------------------------------------------------------------------------------------

    async def Write(
        self, request_iterator: AsyncIterator[pb.WriteRequest], context: Context
    ) -> AsyncIterator[pb.WriteAck]:
        task = asyncio.current_task()
        assert task is not None
        session: Session | None = None
        try:
            while True:
                self._idle_streams.add(task)
                try:
                    async with asyncio.timeout(self.limits.stream_idle_timeout):
                        request = await anext(aiter(request_iterator), None)
                except TimeoutError:
                    await context.abort(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"the write stream sent nothing for {self.limits.stream_idle_timeout:g}s, the limit "
                        "(--stream-idle-timeout); send heartbeats (empty batches) or reconnect",
                    )
                finally:
                    self._idle_streams.discard(task)
                if request is None:
                    return
                if session is None:
                    await self._authorize_session(request.session_id, context)
                    session = await self._live_session(request.session_id, context)
                    session.streams.add(task)
                else:
                    if request.session_id and request.session_id != session.session_id:
                        await context.abort(
                            grpc.StatusCode.INVALID_ARGUMENT, "a write stream carries one session; open another stream"
                        )
                    # Every batch: a token removed or narrowed by a re-read token file stops here.
                    await self._authorize_run(session.run.run_dir, context)
                acked = await self._write_batch(session, request, context)
                yield pb.WriteAck(acked_sequence=acked)
                if self._draining:
                    return
        finally:
            log.debug("write stream of session %s ended", session.session_id if session else "?")
            if session is not None:
                session.streams.discard(task)

    async def _write_batch(self, session: Session, request: pb.WriteRequest, context: Context) -> int:
        problem = write_problem(request)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        size = request.ByteSize()
        if size > self.limits.max_message_bytes:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"batch from sequence {request.first_sequence} is a {size}-byte message, over the limit of "
                f"{self.limits.max_message_bytes} bytes (--max-message-bytes); send smaller batches",
            )
        if len(request.events) > self.limits.max_batch_events:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"batch from sequence {request.first_sequence} has {len(request.events)} events, over the limit of "
                f"{self.limits.max_batch_events} events per batch (--max-batch-events); send smaller batches",
            )
        try:
            # One list: every look at a repeated bytes field copies each element out of the message again.
            return await self._complete(session.apply(request.first_sequence, list(request.events)))
        except EventError as exc:
            first = request.first_sequence
            where = () if exc.sequence is None else ((REFUSED_SEQUENCE_KEY, str(exc.sequence)),)
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"batch from sequence {first}: {exc}", trailing_metadata=where
            )
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except SequenceGapError as exc:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"sequence gap: the daemon holds up to {exc.held}, the batch starts at {exc.first}; "
                f"resend from {exc.held + 1}",
            )
        except SessionEndedError as exc:
            await self._abort_ended(exc.session_id, exc.ending, context)
        except OSError as exc:
            await context.abort(*_io_status(exc, session.run.run_dir, "the batch was not written"))
        raise AssertionError("unreachable")  # abort() raises

    # ---- Flush, CloseSession ---------------------------------------------------------------------------

    async def Flush(self, request: pb.FlushRequest, context: Context) -> pb.FlushResponse:
        await self._authorize_session(request.session_id, context)
        session = await self._live_session(request.session_id, context)
        session.touch()
        try:
            acked = await self._complete(self._flush(session, request.durable))
        except OSError as exc:
            await context.abort(*_io_status(exc, session.run.run_dir, "fsync failed"))
        return pb.FlushResponse(acked_sequence=acked)

    async def _flush(self, session: Session, durable: bool) -> int:
        async with session.lock:
            # Writes go straight to the OS, so acknowledged events are visible already; durable adds fsync.
            if durable:
                await session.run.sync()
            return session.acked

    async def CloseSession(self, request: pb.CloseSessionRequest, context: Context) -> pb.CloseSessionResponse:
        problem = session_id_problem(request.session_id)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        await self._authorize_session(request.session_id, context)
        session = self.sessions.get(request.session_id)
        try:
            if session is not None:
                acked, written = await self._complete(self._close(session))
                return pb.CloseSessionResponse(acked_sequence=acked, events_written=written)
            closed_at = await self._complete(self._close_record(request.session_id))
        except OSError as exc:
            run_dir = session.run.run_dir if session else "?"
            await context.abort(*_io_status(exc, run_dir, "fsync failed; the session stays open"))
        if closed_at is None:
            await self._live_session(request.session_id, context)  # aborts with the reason
        return pb.CloseSessionResponse(acked_sequence=closed_at)

    async def _close(self, session: Session) -> tuple[int, int]:
        async with session.lock:
            ending = session.ending
            if ending is None:
                await session.run.sync()
                await self._remember(session, closed=True)
                self.sessions.remove(session, "closed")
        if ending is None:
            await self.registry.release(session.run)
            log.info(
                "session %s closed: run %s, %d events written, %d duplicates dropped",
                session.session_id,
                session.run.run_dir,
                session.events_written,
                session.duplicates_dropped,
            )
        elif ending == "released":  # released while the close waited: close what the store holds
            await self._close_record(session.session_id)
        return session.acked, session.events_written

    async def _close_record(self, session_id: str) -> int | None:
        """Close a session that is not live (released, or closed already); None when the store never saw it."""
        record = self.store.get(session_id)
        if record is None:
            return None
        if not record.closed:
            for run in self.registry.runs:
                if run.run_dir == record.run_dir:
                    await run.sync()  # its file may still be open for other sessions
            closed = SessionRecord(session_id, record.run_dir, record.last, closed=True)
            await run_to_completion(self.registry.executor, lambda: self.store.record([closed], sync=True))
        return record.last

    # ---- PutFile -------------------------------------------------------------------------------------------

    async def PutFile(self, request: pb.PutFileRequest, context: Context) -> pb.PutFileResponse:
        """Write a file beside the session's event files (the projector's data); see `run_files`."""
        from summaryd.server import run_files

        await self._authorize_session(request.session_id, context)
        try:
            file_parts = run_files.validate_file_path(request.path)
        except RunPathError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        session = await self._live_session(request.session_id, context)
        session.touch()
        run_parts, logdir_fd = session.run.run_dir.split("/"), self.registry.logdir_fd

        def put() -> None:
            run_files.put_file(logdir_fd, run_parts, file_parts, request.content)

        try:
            await self._complete(run_to_completion(self.registry.executor, put))
            if self.registry.sink is not None:  # a bucket logdir: the file goes up whole before the answer
                await self._complete(
                    self.registry.sink.file_written(session.run.run_dir, request.path, request.content)
                )
            session.files_written += 1
        except RunPathError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except IsADirectoryError:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"file path {request.path!r} names a directory of the run"
            )
        except OSError as exc:
            await context.abort(*_io_status(exc, session.run.run_dir, f"the file {request.path!r} was not written"))
        return pb.PutFileResponse()

    # ---- GetStatus -------------------------------------------------------------------------------------

    async def GetStatus(self, request: pb.GetStatusRequest, context: Context) -> pb.GetStatusResponse:
        """The open runs and live sessions the caller's token reaches (all of them without a token file)."""
        grant = await self._grant(context)
        now = time.monotonic()
        response = pb.GetStatusResponse(logdir=self.registry.logdir, version=VERSION)
        for run in self.registry.runs:
            if grant is not None and not grant.allows(run.run_dir):
                continue
            response.runs.add(
                run_dir=run.run_dir,
                event_file=run.file.name if run.file else "",
                events_written=run.events_written,
                bytes_written=run.bytes_written,
                sessions=run.sessions,
            )
        for s in self.sessions:
            if grant is not None and not grant.allows(s.run.run_dir):
                continue
            response.sessions.add(
                session_id=s.session_id,
                run_dir=s.run.run_dir,
                worker=s.worker,
                client=s.client,
                acked_sequence=s.acked,
                events_written=s.events_written,
                duplicates_dropped=s.duplicates_dropped,
                idle_seconds=s.idle_for(now),
                streaming=bool(s.streams),
            )
        return response

    # ---- authorization ---------------------------------------------------------------------------------

    async def _grant(self, context: Context) -> Grant | None:
        """What the caller's token may do now; None when the daemon has no token file (anyone may do all).

        The token table may have been re-read since the call began: a removed token is refused here.
        """
        caller = current_caller()
        if caller is None:
            return None
        grant = caller.grant()
        if grant is None:
            log.info("token %s is no longer in the token file: its call under way is refused", caller.fingerprint)
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "the token is no longer accepted (the daemon re-read its token file); ask for a current token",
            )
        return grant

    async def _authorize_run(self, run_dir: str, context: Context) -> None:
        """Refuse a caller whose token's prefixes do not cover `run_dir`."""
        grant = await self._grant(context)
        if grant is not None and not grant.allows(run_dir):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"this token may not write run {run_dir!r}; ask for a token whose prefixes cover it",
            )

    async def _authorize_session(self, session_id: str, context: Context, *, opening: bool = False) -> None:
        """Refuse a caller whose token may not reach the session's run, before anything about it is told or changed.

        The run comes from the live session or, once it was released (a lease ran out, the daemon restarted),
        from the durable session store, so the rule holds across restarts. A session id the daemon does not
        know gets the same refusal from a token that does not reach every run, unless it is being opened.
        """
        grant = await self._grant(context)
        if grant is None or grant.reaches_all or not session_id:  # an empty id is refused as invalid later
            return
        session = self.sessions.get(session_id)
        if session is not None:
            run_dir: str | None = session.run.run_dir
        else:
            record = self.store.get(session_id)
            run_dir = record.run_dir if record is not None else None
        if run_dir is None and opening:
            return
        if run_dir is None or not grant.allows(run_dir):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, _NOT_ITS_SESSION)

    # ---- statuses --------------------------------------------------------------------------------------

    async def _live_session(self, session_id: str, context: Context) -> Session:
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        if not session_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "session_id is empty; open a session first")
        problem = session_id_problem(session_id)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        record = self.store.get(session_id)
        if record is not None and record.closed:
            await self._abort_closed(session_id, context)
        if record is not None:
            await self._abort_ended(session_id, "released", context)
        await context.abort(grpc.StatusCode.NOT_FOUND, f"no session {session_id}; call OpenSession first")
        raise AssertionError("unreachable")  # abort() raises

    async def _abort_closed(self, session_id: str, context: Context) -> NoReturn:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"session {session_id} was closed; open a new session with a new id",
        )
        raise AssertionError("unreachable")

    async def _abort_lost(self, session_id: str, run_dir: str, context: Context) -> NoReturn:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"session {session_id} cannot be resumed: the daemon's record of it may have been lost with damaged "
            f"state (see the daemon's log), and resuming could write its events twice; check run {run_dir!r} for "
            "what arrived and log the rest in a new session",
        )
        raise AssertionError("unreachable")

    async def _abort_ended(self, session_id: str, ending: Ending, context: Context) -> NoReturn:
        if ending == "closed":
            await self._abort_closed(session_id, context)
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"session {session_id} was released (idle past its {self.lease:.0f}s lease, or the daemon restarted); "
            "call OpenSession again to resume it",
        )
        raise AssertionError("unreachable")

    async def _abort_run_switch(self, session_id: str, held: str, asked: str, context: Context) -> NoReturn:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"session {session_id} writes to {held!r}, not {asked!r}; use a new session id for another run",
        )
        raise AssertionError("unreachable")
