"""Live sessions: each client session's run, identity, and the sequence numbers it has written.

A session lives from `OpenSession` until it is closed by its client, released after its lease ran out, or
released at shutdown. Only a close is final; a released session resumes when its client opens it again (the
session store remembers where it stood, also across a restart).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from summaryd.server.errors import (
    BatchRefusedError,
    EventError,
    SequenceGapError,
    SessionClosedError,
    SessionReleasedError,
)
from summaryd.server.storage.runs import RunWriter
from summaryd.v1 import summaryd_pb2 as pb

Ending = Literal["closed", "released"]


@dataclass(eq=False)
class Session:
    """One live client session. `acked` is the highest contiguous sequence number written (and journaled)."""

    session_id: str
    run: RunWriter
    worker: str
    world_size: int
    client: pb.ClientIdentity
    # Seconds without a batch or heartbeat after which the session is released.
    lease: float
    # The client's address without its port (what `--max-sessions-per-peer` counts by).
    peer: str = ""
    acked: int = 0
    events_written: int = 0
    duplicates_dropped: int = 0
    files_written: int = 0
    # Whether any batch or heartbeat came since OpenSession: a session never heard from is released sooner.
    heard: bool = False
    ending: Ending | None = None
    last_seen: float = field(default_factory=time.monotonic)
    # The write streams of this session (a reconnecting client may briefly have two).
    streams: set[asyncio.Task[object]] = field(default_factory=set)
    # Serialises the sequence check and the write, so two streams of one session cannot interleave.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def touch(self) -> None:
        self.last_seen = time.monotonic()

    def idle_for(self, now: float) -> float:
        return now - self.last_seen

    @property
    def allowed_idle(self) -> float:
        """The lease, or half of it for a session never heard from since it opened: a client heartbeats at a
        third of the lease at most, so only one that opened a session and walked away is released early."""
        return self.lease if self.heard else self.lease / 2

    def expired(self, now: float) -> bool:
        """Whether the session was not heard from (no batch, no heartbeat) within `allowed_idle`."""
        return self.idle_for(now) > self.allowed_idle

    def ended_error(self) -> SessionClosedError | SessionReleasedError:
        """What a request on this session, now ended, is answered."""
        if self.ending == "closed":
            return SessionClosedError(self.session_id)
        return SessionReleasedError(self.session_id, self.lease)

    def attach(self, stream: asyncio.Task[object]) -> None:
        """Count `stream` as one of the session's write streams (ended when the session is released)."""
        self.streams.add(stream)

    def detach(self, stream: asyncio.Task[object]) -> None:
        self.streams.discard(stream)

    def file_written(self) -> None:
        """Count a file written beside the run's event files (`PutFile`)."""
        self.files_written += 1

    @property
    def wrote(self) -> bool:
        """Whether the session wrote anything (events or files): only then is it worth remembering."""
        return self.events_written > 0 or self.files_written > 0

    async def apply(self, first: int, events: Sequence[bytes]) -> int:
        """Write what is new in a batch whose first event has sequence `first`; return the new `acked`.

        A batch the daemon holds already is dropped, one that overlaps is cut to its new part; an empty batch
        is a heartbeat that only renews the lease. The caller must not cancel this half-way (the service
        runs it to completion): the file write and `acked` move together.

        The request checks (`request_checks.write_problem`) have made sure that a non-empty batch starts at 1
        or later.

        Raises:
            SequenceGapError: the batch starts beyond `acked + 1`.
            SessionClosedError, SessionReleasedError: the session ended meanwhile.
            BatchRefusedError: the run writer refused an event; nothing of the batch was written.
            OSError: from the run writer; nothing of the batch was written.
        """
        async with self.lock:
            self.touch()
            self.heard = True
            if self.ending is not None:
                raise self.ended_error()
            if not events:
                return self.acked
            last = first + len(events) - 1
            if last <= self.acked:
                self.duplicates_dropped += len(events)
                return self.acked
            if first > self.acked + 1:
                raise SequenceGapError(self.acked, first)
            skip = self.acked + 1 - first
            self.duplicates_dropped += skip
            new = events[skip:] if skip else events
            try:
                await self.run.write(self.session_id, last, new)
            except EventError as exc:
                raise BatchRefusedError(first, first + skip + exc.index, str(exc)) from None
            self.events_written += len(new)
            self.acked = last
            self.touch()
            return last


class SessionTable:
    """Live sessions by id, counted by client address and grouped by run and worker: the limit per address and
    a departure's look for the worker's other sessions cost the same with 16 sessions or 16,384 (a scan of every
    session on each open and close cost a big job's daemon time quadratic in its ranks)."""

    def __init__(self) -> None:
        self._live: dict[str, Session] = {}
        self._per_peer: Counter[str] = Counter()
        self._by_worker: dict[tuple[str, str], dict[str, Session]] = {}
        # Counts of sessions that have ended, so that totals (metrics) never go backwards.
        self.ended_duplicates = 0
        self.ended_events = 0

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._live.values()))

    def get(self, session_id: str) -> Session | None:
        return self._live.get(session_id)

    def _unindex(self, session: Session) -> None:
        self._per_peer[session.peer] -= 1
        if not self._per_peer[session.peer]:
            del self._per_peer[session.peer]
        key = _worker_key(session)
        group = self._by_worker[key]
        del group[session.session_id]
        if not group:
            del self._by_worker[key]

    def from_peer(self, peer: str) -> int:
        """Live sessions opened from the client address `peer`."""
        return self._per_peer[peer]

    def of_worker(self, session: Session) -> list[Session]:
        """The live sessions of `session`'s run and worker (itself too while it is live)."""
        return list(self._by_worker.get(_worker_key(session), {}).values())

    def add(self, session: Session) -> None:
        replaced = self._live.get(session.session_id)
        if replaced is not None:  # not expected (an open checks first), but never counted twice
            self._unindex(replaced)
        self._live[session.session_id] = session
        self._per_peer[session.peer] += 1
        self._by_worker.setdefault(_worker_key(session), {})[session.session_id] = session

    def remove(self, session: Session, ending: Ending) -> None:
        session.ending = ending
        if self._live.get(session.session_id) is session:
            del self._live[session.session_id]
            self._unindex(session)
            self.ended_duplicates += session.duplicates_dropped
            self.ended_events += session.events_written


def _worker_key(session: Session) -> tuple[str, str]:
    return session.run.run_dir, session.worker
