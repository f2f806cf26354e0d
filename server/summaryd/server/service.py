"""The `summaryd.v1.Summaries` servicer: validation at the edge, one clear status per failure."""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc import aio

from summaryd.server.errors import EventError, RunPathError
from summaryd.server.runpath import validate_run, validate_worker
from summaryd.server.runs import RunRegistry
from summaryd.server.sessions import Session, SessionTable
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

Context = aio.ServicerContext[Any, Any]

VERSION = "0.1.0"
_MAX_SESSION_ID = 128


class SummariesService(pb_grpc.SummariesServicer):
    """Sessions, the write stream, flush, close and status over one run registry."""

    def __init__(self, registry: RunRegistry) -> None:
        self.registry = registry
        self.sessions = SessionTable()
        self._draining = False
        # Write handlers waiting for their client's next message: cancelled at once when draining.
        self._idle_streams: set[asyncio.Task[object]] = set()
        # Batches, flushes and closes being carried out; shutdown waits for these, not for idle clients.
        self._busy = 0
        self._quiet = asyncio.Event()
        self._quiet.set()

    def start_draining(self) -> None:
        """Stop taking new sessions and end every write stream that is not in the middle of a batch."""
        self._draining = True
        for task in list(self._idle_streams):
            task.cancel()

    def _enter(self) -> None:
        self._busy += 1
        self._quiet.clear()

    def _leave(self) -> None:
        self._busy -= 1
        if self._busy == 0:
            self._quiet.set()

    async def wait_quiet(self) -> None:
        """Return once no batch, flush or close is being carried out."""
        await self._quiet.wait()

    async def _session(self, session_id: str, context: Context) -> Session:
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        if not session_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "session_id is empty; open a session first")
        if self.sessions.closed_at(session_id) is not None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"session {session_id} was closed; open a new session with a new id",
            )
        await context.abort(grpc.StatusCode.NOT_FOUND, f"no session {session_id}; call OpenSession first")
        raise AssertionError("unreachable")  # abort() raises

    async def OpenSession(self, request: pb.OpenSessionRequest, context: Context) -> pb.OpenSessionResponse:
        if self._draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the daemon is shutting down; retry later")
        session_id = request.session_id
        if not session_id or len(session_id) > _MAX_SESSION_ID or not session_id.isprintable():
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"session_id must be 1..{_MAX_SESSION_ID} printable characters (a UUID)",
            )
        try:
            parts = validate_run(request.run)
            if request.worker:
                validate_worker(request.worker)
                parts = [*parts, request.worker]
        except RunPathError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        run_dir = "/".join(parts)
        session = self.sessions.get(session_id)
        if session is not None:
            if session.run.run_dir != run_dir:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"session {session_id} writes to {session.run.run_dir!r}, not {run_dir!r}; "
                    "use a new session id for another run",
                )
            session.touch()
            return pb.OpenSessionResponse(run_dir=run_dir, last_sequence=session.acked)
        if self.sessions.closed_at(session_id) is not None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"session {session_id} was closed; open a new session with a new id",
            )
        try:
            writer = await self.registry.acquire(parts)
        except RunPathError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except OSError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot create run directory {run_dir!r}: {exc.strerror}")
        # Another OpenSession of the same id may have won the race while the directory was opened.
        raced = self.sessions.get(session_id)
        if raced is not None:
            await self.registry.release(writer)
            return pb.OpenSessionResponse(run_dir=run_dir, last_sequence=raced.acked)
        client = pb.ClientIdentity()
        client.CopyFrom(request.client)
        session = Session(session_id, writer, request.worker, request.world_size, client)
        # A client resuming a session this daemon never saw (it restarted) continues its numbering.
        session.acked = max(request.next_sequence, 1) - 1
        self.sessions.add(session)
        log.info(
            "session %s opened: run %s, client %s pid %d (%s %s)",
            session_id,
            run_dir,
            client.host or "?",
            client.pid,
            client.framework or "?",
            client.version or "?",
        )
        return pb.OpenSessionResponse(run_dir=run_dir, last_sequence=session.acked)

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
                    request = await anext(aiter(request_iterator), None)
                finally:
                    self._idle_streams.discard(task)
                if request is None:
                    return
                if session is None:
                    session = await self._session(request.session_id, context)
                    session.streams += 1
                elif request.session_id and request.session_id != session.session_id:
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT, "a write stream carries one session; open another stream"
                    )
                self._enter()
                try:
                    acked = await self._write(session, request, context)
                finally:
                    self._leave()
                yield pb.WriteAck(acked_sequence=acked)
                if self._draining:
                    return
        finally:
            log.debug("write stream of session %s ended", session.session_id if session else "?")
            if session is not None:
                session.streams -= 1

    async def _write(self, session: Session, request: pb.WriteRequest, context: Context) -> int:
        count = len(request.events)
        first = request.first_sequence
        async with session.lock:
            session.touch()
            if session.closed:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"session {session.session_id} was closed; open a new session with a new id",
                )
            if count == 0:
                return session.acked
            if first < 1:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first_sequence starts at 1")
            last = first + count - 1
            if last <= session.acked:
                session.duplicates_dropped += count
                return session.acked
            if first > session.acked + 1:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"sequence gap: the daemon holds up to {session.acked}, the batch starts at {first}; "
                    f"resend from {session.acked + 1}",
                )
            skip = session.acked + 1 - first
            session.duplicates_dropped += skip
            events = request.events[skip:] if skip else request.events
            try:
                await session.run.write(events)
            except EventError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"batch from sequence {first}: {exc}")
            except OSError as exc:
                log.error("run %s: write failed: %s", session.run.run_dir, exc)
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED if exc.errno == errno.ENOSPC else grpc.StatusCode.UNAVAILABLE,
                    f"the daemon could not write run {session.run.run_dir!r}: {exc.strerror}; "
                    "the batch was not written",
                )
            session.events_written += len(events)
            session.acked = last
            return last

    async def Flush(self, request: pb.FlushRequest, context: Context) -> pb.FlushResponse:
        session = await self._session(request.session_id, context)
        session.touch()
        self._enter()
        try:
            return await self._flush(session, request.durable, context)
        finally:
            self._leave()

    async def _flush(self, session: Session, durable: bool, context: Context) -> pb.FlushResponse:
        async with session.lock:
            # Writes go straight to the OS, so acknowledged events are visible already; durable adds fsync.
            if durable:
                await self._sync(session, context)
            return pb.FlushResponse(acked_sequence=session.acked)

    async def _sync(self, session: Session, context: Context) -> None:
        try:
            await session.run.sync()
        except OSError as exc:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"fsync of run {session.run.run_dir!r} failed: {exc.strerror}"
            )

    async def CloseSession(self, request: pb.CloseSessionRequest, context: Context) -> pb.CloseSessionResponse:
        session = self.sessions.get(request.session_id)
        if session is None:
            acked = self.sessions.closed_at(request.session_id)
            if acked is not None:  # a retried close: it already succeeded
                return pb.CloseSessionResponse(acked_sequence=acked)
            session = await self._session(request.session_id, context)
        self._enter()
        try:
            return await self._close(session, context)
        finally:
            self._leave()

    async def _close(self, session: Session, context: Context) -> pb.CloseSessionResponse:
        async with session.lock:
            if session.closed:
                return pb.CloseSessionResponse(acked_sequence=session.acked, events_written=session.events_written)
            await self._sync(session, context)
            self.sessions.remove(session)
        await self.registry.release(session.run)
        log.info(
            "session %s closed: run %s, %d events written, %d duplicates dropped",
            session.session_id,
            session.run.run_dir,
            session.events_written,
            session.duplicates_dropped,
        )
        return pb.CloseSessionResponse(acked_sequence=session.acked, events_written=session.events_written)

    async def GetStatus(self, request: pb.GetStatusRequest, context: Context) -> pb.GetStatusResponse:
        now = time.monotonic()
        response = pb.GetStatusResponse(logdir=self.registry.logdir, version=VERSION)
        for run in self.registry.runs:
            response.runs.add(
                run_dir=run.run_dir,
                event_file=run.file.name if run.file else "",
                events_written=run.events_written,
                bytes_written=run.bytes_written,
                sessions=run.sessions,
            )
        for s in self.sessions:
            response.sessions.add(
                session_id=s.session_id,
                run_dir=s.run.run_dir,
                worker=s.worker,
                client=s.client,
                acked_sequence=s.acked,
                events_written=s.events_written,
                duplicates_dropped=s.duplicates_dropped,
                idle_seconds=now - s.last_seen,
                streaming=s.streams > 0,
            )
        return response

    async def close_all_sessions(self) -> None:
        """Release every session (shutdown); the registry then syncs and closes the files."""
        for session in self.sessions:
            self.sessions.remove(session)
