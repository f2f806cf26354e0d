"""The `summaryd.v1.Summaries` servicer: validation and authorization at the edge, one status per failure.

Each method checks what the request says (`request_checks`, run and file paths, a batch's size) and what the
caller's token reaches, then hands the request to the session lifecycle (`sessions.lifecycle`). What the inner
layers refuse they raise as the errors of `errors`; `STATUS` is the one table from those to gRPC statuses, and
`_answered` the one place that applies it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, cast

import grpc
from grpc import aio

from summaryd.server.errors import (
    BatchRefusedError,
    DiskFullError,
    LimitError,
    OwnerUnknownError,
    ResumeRefusedError,
    RunMismatchError,
    RunOwnedElsewhereError,
    RunPathError,
    SequenceGapError,
    SessionClosedError,
    SessionReleasedError,
    SessionUnknownError,
    StorageError,
)
from summaryd.server.operations.metrics import Metrics, WriteCounts
from summaryd.server.records.scalar_events import EventBatch
from summaryd.server.records.scalar_records import ScalarRecords
from summaryd.server.security.auth import UNAUTHENTICATED_MESSAGE, Grant, RelayCallers, current_caller
from summaryd.server.security.refusals import WRITE_METHOD, Unparsed, unparsed_problem
from summaryd.server.security.request_checks import counted_write_problem, open_problem, session_id_problem
from summaryd.server.sessions.lifecycle import SessionLifecycle
from summaryd.server.sessions.live import Session
from summaryd.server.sessions.pacing import Pacer
from summaryd.server.sessions.streams import WriteStreams
from summaryd.server.storage import run_files
from summaryd.server.storage.runpath import run_dir_parts
from summaryd.server.watch import Watch
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import REFUSED_SEQUENCE_KEY, VERSION

log = logging.getLogger(__name__)

Context = aio.ServicerContext[Any, Any]

# One answer for a session id the caller's token may not reach and for one the daemon does not know, so that a
# token cannot learn which session ids exist on runs beyond its prefixes.
_NOT_ITS_SESSION = (
    "the session is unknown or on a run outside this token's prefixes; open a session with a new id on a run "
    "the token may write"
)

STATUS: dict[type[Exception], grpc.StatusCode] = {
    # What the client sent cannot be taken as it is.
    RunPathError: grpc.StatusCode.INVALID_ARGUMENT,
    BatchRefusedError: grpc.StatusCode.INVALID_ARGUMENT,
    # More than the daemon's limits or its disk allow.
    LimitError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DiskFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    # The session's state does not allow it.
    SessionClosedError: grpc.StatusCode.FAILED_PRECONDITION,
    RunMismatchError: grpc.StatusCode.FAILED_PRECONDITION,
    RunOwnedElsewhereError: grpc.StatusCode.FAILED_PRECONDITION,
    ResumeRefusedError: grpc.StatusCode.FAILED_PRECONDITION,
    SequenceGapError: grpc.StatusCode.FAILED_PRECONDITION,
    SessionUnknownError: grpc.StatusCode.NOT_FOUND,
    # Try again: resume the session, or wait for the disk.
    SessionReleasedError: grpc.StatusCode.UNAVAILABLE,
    StorageError: grpc.StatusCode.UNAVAILABLE,
    OwnerUnknownError: grpc.StatusCode.UNAVAILABLE,
}
"""The status of each error the inner layers raise (the most specific class listed wins)."""

_REFUSALS = tuple(STATUS)


def status_of(exc: Exception) -> grpc.StatusCode:
    """The status `STATUS` gives `exc`, by its most specific class listed."""
    for kind in type(exc).__mro__:
        code = STATUS.get(kind)
        if code is not None:
            return code
    raise LookupError(f"no status for {type(exc).__name__}")


@contextlib.asynccontextmanager
async def _answered(context: Context) -> AsyncIterator[None]:
    """Answer an error of the inner layers raised in the block with its status and its one-line message."""
    try:
        yield
    except _REFUSALS as exc:
        metadata = exc.trailing_metadata if isinstance(exc, (BatchRefusedError, RunOwnedElsewhereError)) else ()
        await context.abort(status_of(exc), str(exc), trailing_metadata=metadata)


def _batch_events(request: pb.WriteRequest) -> Sequence[bytes]:
    """A batch's events: its scalar columns, built into records when written, or its serialized events."""
    if request.HasField("scalars"):
        return ScalarRecords(request.scalars)
    # One list: every look at a repeated bytes field copies each element out of the message again.
    return EventBatch(request.events)


def _peer_host(peer: str) -> str:
    """A gRPC peer without its port: `ipv4:10.0.0.5:51234` is `ipv4:10.0.0.5`, `ipv6:[::1]:5123` is `ipv6:[::1]`."""
    if peer.startswith(("ipv4:", "ipv6:")):
        return urllib.parse.unquote(peer.rsplit(":", 1)[0])  # gRPC writes `ipv6:%5B::1%5D:5123`
    return peer  # unix sockets: every local client is one peer


class SummariesService(pb_grpc.SummariesServicer):
    """Sessions, the write stream, flush, close, files and status, over one session lifecycle."""

    def __init__(
        self,
        lifecycle: SessionLifecycle,
        watch: Watch | None = None,
        pacer: Pacer | None = None,
        board_status: Callable[[], pb.BoardStatus] | None = None,
        metrics: Metrics | None = None,
        streams: WriteStreams | None = None,
    ) -> None:
        self.lifecycle = lifecycle
        self.streams = streams or WriteStreams()
        self.watch = watch
        self.limits = lifecycle.limits
        self.pacer = pacer or Pacer()
        self._draining = False
        self.board_status = board_status  # with --board-listen: what `summaryd status` shows of the board
        self.metrics = metrics
        # Write handlers waiting for their client's next message: cancelled at once when draining.
        self._idle_streams: set[asyncio.Task[object]] = set()

    def start_draining(self) -> None:
        """Stop taking new sessions and end every write stream that is not in the middle of a batch."""
        self._draining = True
        for task in list(self._idle_streams):
            task.cancel()

    # ---- OpenSession -----------------------------------------------------------------------------------

    async def OpenSession(self, request: pb.OpenSessionRequest, context: Context) -> pb.OpenSessionResponse:
        if self._draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the daemon is shutting down; retry later")
        session_id = request.session_id
        problem = open_problem(request)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        limits = self.limits
        async with _answered(context):
            parts = run_dir_parts(request.run, request.worker, limits.max_run_path_bytes, limits.max_run_depth)
            run_dir = "/".join(parts)
            await self._authorize_run(run_dir, context)
            await self._authorize_session(session_id, context, opening=True)
            try:
                session = await self.lifecycle.open(request, parts, _peer_host(context.peer() or ""))
            except RunMismatchError:
                # Held on a run opened meanwhile, which may be beyond the token: checked before it is named.
                await self._authorize_session(session_id, context)
                raise
        return pb.OpenSessionResponse(
            run_dir=run_dir,
            last_sequence=session.acked,
            lease_seconds=self.lifecycle.lease,
            max_message_bytes=limits.max_message_bytes,
            max_event_bytes=limits.max_event_bytes,
            max_batch_events=limits.max_batch_events,
            takes_scalar_columns=True,
            takes_fixed_steps=True,
            durable_acks=self.lifecycle.durable_acks,
            durable_sequence=self.lifecycle.durable(session.session_id),
            pacing=self.pacer.pacing,
        )

    # ---- Write -----------------------------------------------------------------------------------------

    async def Write(
        self, request_iterator: AsyncIterator[pb.WriteRequest], context: Context
    ) -> AsyncIterator[pb.WriteAck]:
        task = asyncio.current_task()
        assert task is not None
        session: Session | None = None
        requests = aiter(request_iterator)
        limit = self.limits.stream_idle_timeout
        # One timer for the stream, looking only at the waits for the client's next message (`_IdleLimit`).
        idle = _IdleLimit(task, limit)
        pacer, streams = self.pacer, self.streams
        pacer.opened()
        streams.open += 1
        told = -1  # the pacing version this stream's client was told: the first ack tells it
        # The per-message work of the layers around the stream is done here, in its loop: the request that did not
        # parse (`refusals`), the counts (`WriteCounts`); a layer of its own would cost a generator step per message.
        counts = WriteCounts(self.metrics)
        try:
            async with _answered(context):
                try:
                    while True:
                        self._idle_streams.add(task)
                        idle.waiting()
                        try:
                            request = await anext(requests, None)
                        finally:
                            idle.waited()
                            self._idle_streams.discard(task)
                        if request is None:
                            return
                        if isinstance(request, Unparsed):
                            await context.abort(
                                grpc.StatusCode.INVALID_ARGUMENT,
                                unparsed_problem(request, WRITE_METHOD, "summaryd.v1.WriteRequest"),
                            )
                        if session is None:
                            await self._authorize_session(request.session_id, context)
                            session = await self._live_session(request.session_id, context)
                            session.attach(task)
                        else:
                            if request.session_id and request.session_id != session.session_id:
                                await context.abort(
                                    grpc.StatusCode.INVALID_ARGUMENT,
                                    "a write stream carries one session; open another stream",
                                )
                            # Every batch: a token removed or narrowed by a re-read token file stops here. Without a
                            # token file there is no caller to check (`_grant`): no two coroutines a batch for it.
                            if current_caller() is not None:
                                await self._authorize_run(session.run.run_dir, context)
                        size = request.ByteSize()  # computed by serializing: once, for the counts and the check
                        counts.received(request, session.run.run_dir, size)
                        await self._check_batch(request, context, size)
                        streams.waiting += 1
                        try:
                            acked = await self.lifecycle.write(session, request.first_sequence, _batch_events(request))
                        finally:
                            streams.waiting -= 1
                        pacer.took()
                        ack = pb.WriteAck(
                            acked_sequence=acked, durable_sequence=self.lifecycle.durable(session.session_id)
                        )
                        if told != pacer.version:
                            told = pacer.version
                            ack.pacing.CopyFrom(pacer.pacing)
                        counts.acked()
                        yield ack
                        if self._draining:
                            return
                except asyncio.CancelledError:
                    if not idle.timed_out():
                        raise
                    await context.abort(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"the write stream sent nothing for {limit:g}s, the limit (--stream-idle-timeout); send "
                        "heartbeats (empty batches) or reconnect",
                    )
        except BaseException:
            counts.failed(context)
            raise
        finally:
            idle.close()
            pacer.closed()
            streams.open -= 1
            log.debug("write stream of session %s ended", session.session_id if session else "?")
            if session is not None:
                session.detach(task)

    # ---- Relay -----------------------------------------------------------------------------------------

    async def Relay(
        self, request_iterator: AsyncIterator[pb.RelayRequest], context: Context
    ) -> AsyncIterator[pb.RelayAck]:
        """A node relay's sessions on one stream: each batch is checked and written as `Write` would, each
        session refused alone (`_SessionRefusedError`); the sessions of a message are written side by side, each
        session's batches in order, and the message answered with one `RelayAck`."""
        task = asyncio.current_task()
        assert task is not None
        callers = RelayCallers()
        told: dict[str, int] = {}  # the pacing version each session's client was told (-1: none yet)
        requests = aiter(request_iterator)
        pacer, streams = self.pacer, self.streams
        pacer.opened()
        streams.open += 1
        try:
            while True:
                self._idle_streams.add(task)
                try:
                    request = await anext(requests, None)
                finally:
                    self._idle_streams.discard(task)
                if request is None:
                    return
                by_session: dict[str, list[pb.RelayBatch]] = {}
                for batch in request.batches:
                    by_session.setdefault(batch.write.session_id, []).append(batch)
                for session_id in by_session.keys() - told.keys():
                    pacer.opened()  # each relayed session is a client the pacing is for, as its own stream would be
                    told[session_id] = -1
                answer = pb.RelayAck()
                streams.waiting += 1  # the stream's one message, however many sessions' batches it carries
                streams.relayed += 1
                try:
                    written = await asyncio.gather(
                        *(self._relayed(batches, context, callers, told) for batches in by_session.values())
                    )
                finally:
                    streams.waiting -= 1
                    streams.relayed -= 1
                for acks in written:
                    answer.acks.extend(acks)
                pacer.took(len(request.batches))  # the owner's cost is per batch, however many a message carries
                yield answer
                if self._draining:
                    return
        finally:
            streams.open -= 1
            for _ in range(len(told) + 1):
                pacer.closed()

    async def _relayed(
        self, batches: list[pb.RelayBatch], context: Context, callers: RelayCallers, told: dict[str, int]
    ) -> list[pb.RelaySessionAck]:
        """One session's batches of a relay message, in order; a refusal ends them there (the rest go
        unanswered: the session has left the stream)."""
        session_id = batches[0].write.session_id
        relayed = cast(Context, _RelayedContext(context))
        counts = WriteCounts(self.metrics)  # counted as a `Write` stream counts its batches
        acks = []
        try:
            for batch in batches:
                request = batch.write
                if not callers.serve_as(session_id, batch.authorization):
                    raise _SessionRefusedError(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
                await self._authorize_session(session_id, relayed)
                async with _answered(relayed):
                    session = await self._live_session(session_id, relayed)
                    await self._authorize_run(session.run.run_dir, relayed)
                    size = request.ByteSize()
                    counts.received(request, session.run.run_dir, size)
                    await self._check_batch(request, relayed, size)
                    acked = await self.lifecycle.write(session, request.first_sequence, _batch_events(request))
                ack = pb.RelaySessionAck(session_id=session_id)
                ack.ack.acked_sequence = acked
                ack.ack.durable_sequence = self.lifecycle.durable(session_id)
                if told.get(session_id) != self.pacer.version:
                    told[session_id] = self.pacer.version
                    ack.ack.pacing.CopyFrom(self.pacer.pacing)
                counts.acked()
                acks.append(ack)
        except _SessionRefusedError as refused:
            callers.forget(session_id)
            if told.pop(session_id, None) is not None:
                self.pacer.closed()
            acks.append(refused.ack(session_id))
        return acks

    async def _check_batch(self, request: pb.WriteRequest, context: Context, size: int) -> None:
        """Refuse a batch whose numbering or shape is wrong, or over the limits; `size` is its `ByteSize()`."""
        problem, count = counted_write_problem(request)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        if size > self.limits.max_message_bytes:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"batch from sequence {request.first_sequence} is a {size}-byte message, over the limit of "
                f"{self.limits.max_message_bytes} bytes (--max-message-bytes); send smaller batches",
            )
        if count > self.limits.max_batch_events:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"batch from sequence {request.first_sequence} has {count} events, over the limit of "
                f"{self.limits.max_batch_events} events per batch (--max-batch-events); send smaller batches",
            )

    # ---- Flush, CloseSession ---------------------------------------------------------------------------

    async def Flush(self, request: pb.FlushRequest, context: Context) -> pb.FlushResponse:
        await self._authorize_session(request.session_id, context)
        async with _answered(context):
            session = await self._live_session(request.session_id, context)
            acked = await self.lifecycle.flush(session, request.durable)
        return pb.FlushResponse(acked_sequence=acked)

    async def CloseSession(self, request: pb.CloseSessionRequest, context: Context) -> pb.CloseSessionResponse:
        problem = session_id_problem(request.session_id)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        await self._authorize_session(request.session_id, context)
        async with _answered(context):
            acked, written = await self.lifecycle.close(request.session_id)
        return pb.CloseSessionResponse(acked_sequence=acked, events_written=written)

    # ---- PutFile ---------------------------------------------------------------------------------------

    async def PutFile(self, request: pb.PutFileRequest, context: Context) -> pb.PutFileResponse:
        """Write a file beside the session's event files (the projector's data); see `run_files`."""
        await self._authorize_session(request.session_id, context)
        async with _answered(context):
            file_parts = run_files.validate_file_path(request.path)
            session = await self._live_session(request.session_id, context)
            await self.lifecycle.put_file(session, file_parts, request.path, request.content)
        return pb.PutFileResponse()

    # ---- GetStatus -------------------------------------------------------------------------------------

    async def GetStatus(self, request: pb.GetStatusRequest, context: Context) -> pb.GetStatusResponse:
        """The open runs and live sessions the caller's token reaches (all of them without a token file)."""
        grant = await self._grant(context)
        now = time.monotonic()
        storage = self.lifecycle.storage
        registry = storage.runs
        response = pb.GetStatusResponse(logdir=storage.logdir, version=VERSION)
        for run in registry.runs:
            if grant is not None and not grant.allows(run.run_dir):
                continue
            status = response.runs.add(
                run_dir=run.run_dir,
                event_file=run.file.name if run.file else "",
                events_written=run.events_written,
                bytes_written=run.bytes_written,
                sessions=run.sessions,
            )
            storage.describe(status)  # a bucket logdir: its lease holder, staged bytes and last upload
        aggregation = self.lifecycle.aggregation
        for s in self.lifecycle.sessions:
            if grant is not None and not grant.allows(s.run.run_dir):
                continue
            lag = aggregation.lag(s)
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
                aggregated=lag is not None,
                lag_steps=lag or 0,
            )
        if self.watch is not None:
            after = request.changes_after if request.HasField("changes_after") else None
            self._watch_status(response, after, grant)
        if self.board_status is not None:
            response.board.CopyFrom(self.board_status())
        return response

    def _watch_status(self, response: pb.GetStatusResponse, after: int | None, grant: Grant | None) -> None:
        """The findings firing and, from `after` on, the changes (of the runs the caller's token reaches)."""
        assert self.watch is not None
        response.watching = True
        book = self.watch.book
        response.changes_through = book.sequence
        for findings, into in (
            (self.watch.firing(), response.findings),
            (book.since(after) if after is not None else [], response.changes),
        ):
            for f in findings:
                if grant is None or grant.allows(f.run):
                    into.add(
                        rule=f.rule,
                        run=f.run,
                        rank=f.rank,
                        step=f.step,
                        value=f.value,
                        subject=f.subject,
                        state=f.state,
                        summary=f.summary,
                        fired_unix=f.fired_unix,
                        resolved_unix=f.resolved_unix,
                        sequence=f.sequence,
                    )

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
        run_dir = self.lifecycle.run_of(session_id)
        if run_dir is None and opening:
            return
        if run_dir is None or not grant.allows(run_dir):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, _NOT_ITS_SESSION)

    # ---- sessions by id --------------------------------------------------------------------------------

    async def _live_session(self, session_id: str, context: Context) -> Session:
        """The live session `session_id`; a session that is not live raises why (`SessionLifecycle.live`)."""
        if not session_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "session_id is empty; open a session first")
        problem = session_id_problem(session_id)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        return self.lifecycle.live(session_id)


class _IdleLimit:
    """A write stream's limit on its waits for the client's next message: the stream's task is cancelled once
    one wait has lasted `limit` seconds (`timed_out` then tells that cancellation from any other).

    One timer for the whole stream, moved on only when it comes due during a later wait than the one it was set
    for: a timer set and cancelled around every wait (`asyncio.timeout` rescheduled) cost some 4 µs a message.
    """

    __slots__ = ("_cancelling", "_expired", "_limit", "_loop", "_since", "_task", "_timer")

    def __init__(self, task: asyncio.Task[Any], limit: float) -> None:
        self._task = task
        self._limit = limit
        self._loop = asyncio.get_running_loop()
        self._since: float | None = None  # when the wait under way began; None between waits
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False
        self._cancelling = task.cancelling()  # cancellations already asked for are not this limit's

    def waiting(self) -> None:
        """A wait for the next message begins."""
        self._since = now = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_at(now + self._limit, self._due)

    def waited(self) -> None:
        """The wait ended (a message, the stream's end, or a cancellation)."""
        self._since = None

    def _due(self) -> None:
        self._timer = None
        since = self._since
        if since is None or self._expired:  # between waits: the next wait sets the timer again
            return
        if self._loop.time() >= since + self._limit:
            self._expired = True
            self._task.cancel()
        else:  # set for an earlier wait: this one's limit is later
            self._timer = self._loop.call_at(since + self._limit, self._due)

    def timed_out(self) -> bool:
        """Whether the cancellation being raised is this limit's, and no other's (as `asyncio.timeout` tells)."""
        return self._expired and self._task.uncancel() <= self._cancelling

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _SessionRefusedError(Exception):
    """A batch of a relay stream refused: it ends that session on the stream, not the stream."""

    def __init__(self, code: grpc.StatusCode, message: str, metadata: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.metadata = metadata

    def ack(self, session_id: str) -> pb.RelaySessionAck:
        refused = dict(self.metadata).get(REFUSED_SEQUENCE_KEY)
        return pb.RelaySessionAck(
            session_id=session_id,
            code=self.code.value[0],
            message=self.message,
            refused_sequence=int(refused) if refused else 0,
        )


class _RelayedContext:
    """The context the checks of one session of a relay stream abort through: what would end a `Write`
    stream raises `_SessionRefusedError` instead."""

    def __init__(self, context: Context) -> None:
        self._context = context

    def peer(self) -> str:
        return str(self._context.peer())

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Sequence[tuple[str, str]] = ()
    ) -> None:
        raise _SessionRefusedError(code, details, trailing_metadata)
