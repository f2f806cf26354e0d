"""The storage seam: what the session lifecycle (and aggregation) ask of where a logdir's bytes go.

Both kinds of logdir write through the same run writers (`runs.RunRegistry`: write, journal, then ack), on
local disk; what differs is what lies beyond that disk. A local logdir (`local.LocalStorage`) has nothing
beyond: an ack is final, no run is owned, nothing is uploaded. A bucket logdir (`bucket.backend.BucketStorage`)
stages the files and uploads them as segments, owns each run it writes through a lease, keeps each session's
state in the bucket and acknowledges as durable only what is uploaded. The lifecycle keeps the session rules
and asks a `Storage` for the rest; it never asks which kind it has.

A new backend implements `Storage` and is built in `server.Server._start`, with everything it needs passed to
its constructor. Errors it raises are `OSError`s (the lifecycle answers them as `StorageError`, saying what
was not done) or the errors of `errors` (`RunOwnedElsewhereError`, answered as they are).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from summaryd.server.storage.runs import FileEnd, RunRegistry, RunWriter
from summaryd.server.storage.session_store import SessionRecord
from summaryd.v1 import summaryd_pb2 as pb


def owned_run(run_dir: str, worker: str) -> str:
    """The run a session of `run_dir` holds (`Storage.own`): the run its client named (`run_dir` without the
    session's worker label), so that all the workers of a job land on one daemon."""
    return run_dir[: -len(worker) - 1] if worker and run_dir.endswith("/" + worker) else run_dir


@dataclass(frozen=True)
class SharedRecord:
    """A session as storage shared between daemons knows it: where it stands there (`record.last` is its
    durable watermark) and `since`, a mark the storage gives back to `Storage.settle` (opaque here)."""

    record: SessionRecord
    since: str = ""


class Storage(Protocol):
    """Where a logdir's bytes go beyond the run writers, as the session lifecycle and aggregation need it."""

    @property
    def runs(self) -> RunRegistry:
        """The run writers (one per run; every batch written, then journaled, then acknowledged)."""
        ...

    @property
    def logdir(self) -> str:
        """The logdir as its users name it (a bucket logdir's URL, not its staging directory)."""
        ...

    @property
    def durable_acks(self) -> bool:
        """Whether an ack means staged only, and clients keep batches until `durable` covers them."""
        ...

    def durable(self, session_id: str) -> int:
        """The session's highest sequence number that is durable beyond this daemon (0 when acks are final)."""
        ...

    async def stored(self, session_id: str) -> SharedRecord | None:
        """The session as storage shared between daemons knows it; None when there is none or it is unknown.

        Raises:
            OSError: the shared storage could not be read.
        """
        ...

    async def own(self, run: str) -> None:
        """Hold the run `run` (every worker's directory of it) for one more session or aggregator.

        Raises:
            RunOwnedElsewhereError, OwnerUnknownError: another daemon writes the run.
            OSError: ownership could not be taken.
        """
        ...

    async def let_go(self, run: str, ends: Sequence[FileEnd] = (), closing: tuple[str, str, int] | None = None) -> None:
        """Hold `run` for one fewer; the last one lets it go once the files are stored up to `ends`, and the
        session `closing` leaves by a close (its id, run directory and last sequence number) is recorded
        closed where daemons share (`closed`)."""
        ...

    async def settle(
        self, session_id: str, run_dir: str, record: SessionRecord | None, shared: SharedRecord | None
    ) -> tuple[SessionRecord | None, int]:
        """The run being owned: the session's record (`record`, from the local store or `shared`) made to
        count what the shared storage holds of it, and its durable watermark there.

        Raises:
            OSError: the shared storage could not be read or written.
        """
        ...

    def track(self, session_id: str, run: RunWriter, acked: int, durable: int) -> None:
        """Follow the durable watermark of a session that started at `durable` and has `acked` written."""
        ...

    def staged(self, session_id: str, run: RunWriter, acked: int) -> None:
        """The session's batches through `acked` are in its run's file, which ends at `run.end` now."""
        ...

    async def upload_through(self, end: FileEnd) -> None:
        """Return once the file is stored beyond this daemon up to `end` (at once when nothing is beyond).

        Raises:
            OSError: it never will be from here (the run's owner changed).
        """
        ...

    async def file_written(self, run_dir: str, path: str, content: bytes) -> None:
        """A file beside the run's event files (`PutFile`) was written whole; store it before the answer.

        Raises:
            OSError: it could not be stored (the client keeps it and tries again).
        """
        ...

    async def closed(self, session_id: str, run_dir: str, acked: int) -> None:
        """The session was closed for good with `acked` written, all of it stored: say so where daemons share."""
        ...

    def lost_runs(self) -> AsyncIterator[str]:
        """Each run this daemon stopped owning (another daemon took it over), as it happens; the lifecycle
        releases their sessions. Ends at once when runs are never lost."""
        ...

    def published(self, run_dir: str) -> AsyncIterator[bytes]:
        """The parts of `run_dir`'s event files stored only beyond this daemon's disk (a bucket's segments,
        their staged copies emptied), in order; nothing when there is nothing beyond."""
        ...

    def describe(self, status: pb.RunStatus) -> None:
        """Fill the columns of a run's `GetStatus` entry that only this storage knows (lease, backlog)."""
        ...
