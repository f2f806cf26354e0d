"""A logdir in a bucket, behind the storage seam (`storage.backend.Storage`).

The run writers write into the staging directory as on a local disk; the shipper uploads their files as
segments (`segments`); a run is written by the daemon that holds its lease (`run_ownership`); each session's
state is kept in the bucket (`sessions`) with its durable watermark: the highest sequence number whose events
are uploaded (`durable_marks`), written to the session's state after the segment that holds them, and only
then acknowledged as durable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import functools
import logging
import time
from collections.abc import AsyncIterator, Sequence

from summaryd.server.storage.backend import SharedRecord
from summaryd.server.storage.bucket.durable_marks import DurableMarks
from summaryd.server.storage.bucket.run_ownership import RunOwnership
from summaryd.server.storage.bucket.segments import SegmentIndex, SegmentShipper, parse_segment, segment_key
from summaryd.server.storage.bucket.sessions import BucketSessions, DurableSession
from summaryd.server.storage.bucket.store import BucketError
from summaryd.server.storage.runs import FileEnd, RunRegistry, RunWriter
from summaryd.server.storage.session_store import SessionRecord
from summaryd.v1 import summaryd_pb2 as pb

log = logging.getLogger("summaryd.server.session_lifecycle")  # the name these lines had, kept across moves


def _io_error(exc: BucketError) -> OSError:
    return OSError(errno.EIO, str(exc))


class DurableWatermarks:
    """Each session's durable watermark, written to its state in the bucket as uploads cover its batches.

    The shipper tells it of every upload (`uploaded`, given to `SegmentShipper` at its construction).
    """

    def __init__(self, sessions: BucketSessions, ownership: RunOwnership) -> None:
        self.sessions = sessions
        self._ownership = ownership
        self.marks = DurableMarks()
        self._through: dict[str, str] = {}  # per run: a key after every segment uploaded (and marked) here
        self._published: dict[str, int] = {}  # per session: the watermark the bucket's state holds
        self._publishing: dict[str, asyncio.Task[None]] = {}

    def durable(self, session_id: str) -> int:
        """The session's highest sequence number uploaded and recorded in the bucket."""
        return self._published.get(session_id, 0)

    def uploaded(self, run_dir: str, name: str, end: int) -> None:
        """The staged file `name` of `run_dir` is uploaded up to `end`: publish the watermarks that moved."""
        self._through[run_dir] = segment_key(run_dir, name, end)
        for session_id, _ in self.marks.uploaded(run_dir, name, end):
            if session_id not in self._publishing:
                task = asyncio.create_task(self.publish(session_id, run_dir))
                self._publishing[session_id] = task
                task.add_done_callback(functools.partial(self._published_by, session_id))

    def _published_by(self, session_id: str, _: asyncio.Task[None]) -> None:
        self._publishing.pop(session_id, None)

    async def publish(self, session_id: str, run_dir: str, closed: bool = False) -> None:
        """Write the session's watermark to its state in the bucket, until it holds the latest; only then is
        it acknowledged as durable (a daemon resuming the session elsewhere starts from that state)."""
        while (durable := self.marks.durable(session_id)) > self._published.get(session_id, 0) or closed:
            if not self._ownership.valid(run_dir):
                # The lease may have passed to another daemon: its state is that daemon's to write now.
                log.warning("session %s: its state is not written, the run's lease is not live here", session_id)
                return
            # Read with `durable`, no await between: every segment before it is counted in `durable`.
            since = self._through.get(run_dir, "")
            try:
                await self.sessions.put(DurableSession(session_id, run_dir, durable, closed, since))
            except BucketError as exc:  # written again after the next upload
                log.warning("session %s: its state could not be written to the bucket: %s", session_id, exc)
                return
            self._published[session_id] = max(durable, self._published.get(session_id, 0))
            closed = False

    def track(self, session_id: str, run: RunWriter, acked: int, durable: int) -> None:
        self.marks.start(session_id, run.run_dir, durable)
        self._published[session_id] = max(durable, self._published.get(session_id, 0))
        self.staged(session_id, run, acked)

    def staged(self, session_id: str, run: RunWriter, acked: int) -> None:
        end = run.end
        if end is not None:
            self.marks.staged(session_id, end[1], end[2], acked)


class BucketStorage:
    """`storage.backend.Storage` of a bucket logdir: staged run files, their shipper, the run leases and the
    sessions' state and durable watermarks in the bucket."""

    durable_acks = True

    def __init__(
        self, runs: RunRegistry, shipper: SegmentShipper, ownership: RunOwnership, watermarks: DurableWatermarks
    ) -> None:
        self._runs = runs
        self._shipper = shipper
        self._ownership = ownership
        self._watermarks = watermarks
        self._sessions = watermarks.sessions
        self._segments = SegmentIndex(shipper.bucket)
        self._closing: dict[str, asyncio.Task[None]] = {}  # per session closing: the write of its closed state

    @property
    def runs(self) -> RunRegistry:
        return self._runs

    @property
    def logdir(self) -> str:
        return self._shipper.bucket.url

    def durable(self, session_id: str) -> int:
        return self._watermarks.durable(session_id)

    async def stored(self, session_id: str) -> SharedRecord | None:
        try:
            state = await self._sessions.get(session_id)
        except BucketError as exc:
            raise _io_error(exc) from exc
        if state is None:
            return None
        return SharedRecord(SessionRecord(session_id, state.run_dir, state.durable, closed=state.closed), state.since)

    async def own(self, run: str) -> None:
        await self._ownership.take(run)

    async def let_go(self, run: str, ends: Sequence[FileEnd] = (), closing: tuple[str, str, int] | None = None) -> None:
        uploads = [functools.partial(self._shipper.upload_through, *end) for end in ends]

        async def settled() -> None:
            await asyncio.gather(*(upload() for upload in uploads))
            if closing is not None:  # written only under a live lease: the lease is kept until it is
                await asyncio.shield(self._closed_state(*closing))

        await self._ownership.let_go(run, settled if uploads or closing else None)

    async def settle(
        self, session_id: str, run_dir: str, record: SessionRecord | None, shared: SharedRecord | None
    ) -> tuple[SessionRecord | None, int]:
        """A session new to the bucket gets its state first (before any segment can hold its events); a known
        one is counted through the run's segments newer than its state, which a daemon lost between an upload
        and the state's write leaves uncounted (`segment_sessions`)."""
        try:
            if shared is None:
                # New: nothing of it is in the run's segments so far. Known here only (it opened before sessions
                # got a state at their start): its events may be in any segment, so every one is searched.
                since = "" if record is not None else await self._segments.end_key(run_dir)
                await self._sessions.put(DurableSession(session_id, run_dir, 0, False, since))
                return record, 0
            held = await self._segments.held(run_dir, session_id, shared.since)
        except BucketError as exc:
            raise _io_error(exc) from exc
        state = shared.record
        if held > state.last:
            log.info(
                "session %s: the run's segments hold it through sequence %d, its state in the bucket only %d",
                session_id,
                held,
                state.last,
            )
        durable = max(state.last, held)
        if record is not None and durable > record.last:
            record = dataclasses.replace(record, last=durable)
        return record, durable

    def track(self, session_id: str, run: RunWriter, acked: int, durable: int) -> None:
        self._watermarks.track(session_id, run, acked, durable)

    def staged(self, session_id: str, run: RunWriter, acked: int) -> None:
        self._watermarks.staged(session_id, run, acked)

    async def upload_through(self, end: FileEnd) -> None:
        await self._shipper.upload_through(*end)

    async def file_written(self, run_dir: str, path: str, content: bytes) -> None:
        await self._shipper.file_written(run_dir, path, content)

    async def closed(self, session_id: str, run_dir: str, acked: int) -> None:
        try:
            await asyncio.shield(self._closed_state(session_id, run_dir, acked))
        finally:
            self._closing.pop(session_id, None)

    def _closed_state(self, session_id: str, run_dir: str, acked: int) -> asyncio.Task[None]:
        """The one write of a closed session's state, begun by whichever comes first: the release of the run's
        lease, which waits for it (the state is written only under a live lease), or the close itself."""
        task = self._closing.get(session_id)
        if task is None:
            task = self._closing[session_id] = asyncio.ensure_future(self._write_closed(session_id, run_dir, acked))
        return task

    async def _write_closed(self, session_id: str, run_dir: str, acked: int) -> None:
        marks = self._watermarks.marks
        marks.start(session_id, run_dir, acked)
        await self._watermarks.publish(session_id, run_dir, closed=True)
        marks.forget(session_id)

    def lost_runs(self) -> AsyncIterator[str]:
        return self._ownership.lost()

    async def published(self, run_dir: str) -> AsyncIterator[bytes]:
        bucket = self._shipper.bucket
        for info in await bucket.list(run_dir + "/"):
            found = parse_segment(info.key)
            got = await bucket.get(info.key) if found is not None and found[0] == run_dir else None
            if got is not None:
                yield got[0]

    def describe(self, status: pb.RunStatus) -> None:
        if self._ownership.holds(status.run_dir):
            status.lease_holder = self._ownership.address
        status.staged_bytes, last_upload = self._shipper.backlog(status.run_dir)
        if last_upload is not None:
            status.last_upload_unix = last_upload
            status.last_upload_age_seconds = max(0.0, time.time() - last_upload)
