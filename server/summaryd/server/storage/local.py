"""A logdir on local disk: the run writers' files are the logdir, so nothing lies beyond them (`backend`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from summaryd.server.storage.backend import SharedRecord
from summaryd.server.storage.runs import FileEnd, RunRegistry, RunWriter
from summaryd.server.storage.session_store import SessionRecord
from summaryd.v1 import summaryd_pb2 as pb


class LocalStorage:
    """`backend.Storage` of a local logdir: an ack is final, no run is owned, nothing is uploaded."""

    durable_acks = False

    def __init__(self, runs: RunRegistry) -> None:
        self._runs = runs

    @property
    def runs(self) -> RunRegistry:
        return self._runs

    @property
    def logdir(self) -> str:
        return self._runs.logdir

    def durable(self, session_id: str) -> int:
        return 0

    async def stored(self, session_id: str) -> SharedRecord | None:
        return None

    async def own(self, run: str) -> None:
        pass

    async def let_go(self, run: str, ends: Sequence[FileEnd] = (), closing: tuple[str, str, int] | None = None) -> None:
        pass

    async def settle(
        self, session_id: str, run_dir: str, record: SessionRecord | None, shared: SharedRecord | None
    ) -> tuple[SessionRecord | None, int]:
        return record, 0

    def track(self, session_id: str, run: RunWriter, acked: int, durable: int) -> None:
        pass

    def staged(self, session_id: str, run: RunWriter, acked: int) -> None:
        pass

    async def upload_through(self, end: FileEnd) -> None:
        pass

    async def file_written(self, run_dir: str, path: str, content: bytes) -> None:
        pass

    async def closed(self, session_id: str, run_dir: str, acked: int) -> None:
        pass

    async def lost_runs(self) -> AsyncIterator[str]:
        return
        yield

    async def published(self, run_dir: str) -> AsyncIterator[bytes]:
        return
        yield

    def describe(self, status: pb.RunStatus) -> None:
        pass
