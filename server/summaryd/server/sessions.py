"""The session table: each client session's run, identity and the sequence numbers it has written."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from summaryd.server.runs import RunWriter
from summaryd.v1 import summaryd_pb2 as pb


@dataclass(eq=False)
class Session:
    """One client session. `acked` is the highest contiguous sequence number written to the event file."""

    session_id: str
    run: RunWriter
    worker: str
    world_size: int
    client: pb.ClientIdentity
    acked: int = 0
    events_written: int = 0
    duplicates_dropped: int = 0
    streams: int = 0
    closed: bool = False
    last_seen: float = field(default_factory=time.monotonic)
    # Serialises the sequence check and the write, so two streams of one session cannot interleave.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def touch(self) -> None:
        self.last_seen = time.monotonic()


class SessionTable:
    """Live sessions by id, plus a bounded memory of closed ids so that a late resend is refused clearly."""

    def __init__(self, remember_closed: int = 65536) -> None:
        self._live: dict[str, Session] = {}
        self._closed: OrderedDict[str, int] = OrderedDict()
        self._remember_closed = remember_closed

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._live.values()))

    def get(self, session_id: str) -> Session | None:
        return self._live.get(session_id)

    def closed_at(self, session_id: str) -> int | None:
        """The last sequence number of a session closed earlier, or None when it was never closed."""
        return self._closed.get(session_id)

    def add(self, session: Session) -> None:
        self._live[session.session_id] = session

    def remove(self, session: Session) -> None:
        session.closed = True
        self._live.pop(session.session_id, None)
        self._closed[session.session_id] = session.acked
        while len(self._closed) > self._remember_closed:
            self._closed.popitem(last=False)
