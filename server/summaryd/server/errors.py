"""Errors the inner layers raise; the servicer turns each into one gRPC status at the edge (`service.STATUS`).

Each message is the one line the client reads: it says what happened and what to do.
"""

from __future__ import annotations

import errno
import os

from summaryd.v1.runpath import RunPathError
from summaryd.v1.wire import OWNER_ADDRESS_KEY, REFUSED_SEQUENCE_KEY

__all__ = [
    "REFUSED_SEQUENCE_KEY",
    "BatchRefusedError",
    "DiskFullError",
    "EventError",
    "LimitError",
    "OwnerUnknownError",
    "ResumeRefusedError",
    "RunMismatchError",
    "RunOwnedElsewhereError",
    "RunPathError",
    "SequenceGapError",
    "SessionClosedError",
    "SessionReleasedError",
    "SessionUnknownError",
    "StorageError",
]


class EventError(ValueError):
    """An event a client must not send: not an `Event`, or of a kind the daemon writes itself."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"event {index} of the batch {reason}")
        self.index = index


class LimitError(Exception):
    """A client asked for more than a configured limit allows (sessions, open runs); RESOURCE_EXHAUSTED."""


class BatchRefusedError(Exception):
    """A batch holding an event the daemon refuses (`EventError`); nothing of it was written. INVALID_ARGUMENT,
    with the refused event's sequence number in the trailing metadata (`REFUSED_SEQUENCE_KEY`)."""

    def __init__(self, first: int, sequence: int, reason: str) -> None:
        super().__init__(f"batch from sequence {first}: {reason}")
        self.sequence = sequence

    @property
    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((REFUSED_SEQUENCE_KEY, str(self.sequence)),)


class SequenceGapError(Exception):
    """A batch starts beyond the next sequence number the daemon expects; FAILED_PRECONDITION."""

    def __init__(self, held: int, first: int) -> None:
        super().__init__(
            f"sequence gap: the daemon holds up to {held}, the batch starts at {first}; resend from {held + 1}"
        )
        self.held = held
        self.first = first


class SessionUnknownError(Exception):
    """Neither live nor in the session store; NOT_FOUND."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"no session {session_id}; call OpenSession first")


class SessionClosedError(Exception):
    """The client closed the session: it is final; FAILED_PRECONDITION."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id} was closed; open a new session with a new id")


class SessionReleasedError(Exception):
    """The session was released (its lease ran out, or the daemon restarted): resumable; UNAVAILABLE."""

    def __init__(self, session_id: str, lease: float) -> None:
        super().__init__(
            f"session {session_id} was released (idle past its {lease:.0f}s lease, or the daemon restarted); "
            "call OpenSession again to resume it"
        )


class RunMismatchError(Exception):
    """The session id is bound to another run; FAILED_PRECONDITION."""

    def __init__(self, session_id: str, held: str, asked: str) -> None:
        super().__init__(
            f"session {session_id} writes to {held!r}, not {asked!r}; use a new session id for another run"
        )


class RunOwnedElsewhereError(Exception):
    """Another daemon holds the run's lease (a bucket logdir); FAILED_PRECONDITION, with that daemon's advertised
    address in the trailing metadata (`OWNER_ADDRESS_KEY`), which the client follows."""

    def __init__(self, run_dir: str, address: str) -> None:
        super().__init__(f"run {run_dir!r} is written by the daemon at {address}; open the session there")
        self.address = address

    @property
    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((OWNER_ADDRESS_KEY, self.address),)


class OwnerUnknownError(Exception):
    """The run's lease names an address that is not a daemon's (`--peers`); UNAVAILABLE, naming no address: the
    client tries again later, or its next daemon, and is sent nowhere."""

    def __init__(self, run_dir: str) -> None:
        super().__init__(
            f"run {run_dir!r} is leased to an address this daemon does not know for a daemon's (--peers); not "
            "sending you there: try again later, or another daemon"
        )


class ResumeRefusedError(Exception):
    """Resuming the session could write events twice (its record may be lost, or is beyond the sequence
    numbers the daemon takes); FAILED_PRECONDITION."""


class StorageError(Exception):
    """A file operation of the daemon failed; UNAVAILABLE (the client keeps its events and retries)."""

    def __init__(self, message: str, cause: OSError) -> None:
        super().__init__(message)
        self.cause = cause

    @classmethod
    def of(cls, exc: OSError, run_dir: str, what: str) -> StorageError:
        """The error for `exc` failing on run `run_dir`, where `what` says what did not happen.

        The client's message names the error by its errno alone: the text of `exc` (a store's answer with its
        URL and keys, a path of the state directory) is for the daemon's log, which the caller writes.
        """
        reason = os.strerror(exc.errno) if exc.errno else "an I/O error"
        if exc.errno in _DISK_FULL:
            return DiskFullError(
                f"the disk holding run {run_dir!r} is full ({reason}); {what}: keep the events and send them "
                "again once space is freed",
                exc,
            )
        return cls(f"the daemon cannot write run {run_dir!r} ({reason}); {what}", exc)


class DiskFullError(StorageError):
    """The disk holding the run is full; RESOURCE_EXHAUSTED."""


_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
