"""What the sender needs of a connection to a daemon, whatever carries it (`_grpc_transport`, or a fake).

The sender thread opens a session (without blocking: it polls an `Opening`), then writes numbered events on a
stream whose acknowledgements arrive on another thread, sends heartbeats on it, and finally closes the
session. Everything that can go wrong arrives as a `TransportError` of a few kinds that say what the sender
should do about it, so that the sender knows nothing of gRPC status codes.

Failing over across `ClientOptions.addresses` (and following a redirect to a run's owner) is the transport's
own affair: the sender only sees `away` and opens the session again. Room left for what is to come: a second
kind of payload (a columnar batch of scalars) is another `Stream` method beside `write`; a second, durable
acknowledgement is another field of `Ack`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from summaryd.client._sender._batch_fit import DaemonLimits
from summaryd.client._sender._columns import ScalarRun
from summaryd.client._spool import SpoolIdentity

# away: the daemon is unreachable or too slow (retry; passes once it answers). cancelled: the call was
# cancelled (by us, mostly). refused: the daemon refused the request's content (INVALID_ARGUMENT). denied: it
# refuses this caller or this run for good (auth, a run it cannot write). failed: anything else (retry).
ErrorKind = Literal["away", "cancelled", "refused", "denied", "failed"]


class TransportError(Exception):
    """A call failed; `text` says how (`CODE: details` for gRPC), `details` what the daemon said, and
    `refused_sequence` names the event it refused, if it did."""

    def __init__(
        self,
        kind: ErrorKind,
        text: str,
        *,
        details: str | None = None,
        refused_sequence: int | None = None,
        redirected: bool = False,
        answered: bool = False,
    ) -> None:
        super().__init__(text)
        self.redirected = redirected
        """The daemon named the run's owner and the transport moved there: try at once, it is no outage."""
        self.answered = answered or redirected
        """The daemon answered (it named the run's owner, followed or not): `text` says what, not "no daemon
        answers"."""
        self.kind: ErrorKind = kind
        self.text = text
        self.details = text if details is None else details
        self.refused_sequence = refused_sequence

    @property
    def passing(self) -> bool:
        """A failure that a later successful call overcomes: the daemon was away, restarting or slow."""
        return self.kind in ("away", "cancelled")

    @property
    def permanent(self) -> bool:
        """Retrying the same request cannot succeed."""
        return self.kind in ("refused", "denied")


@dataclass(frozen=True)
class Hello:
    """What opening (or resuming) a session tells the daemon."""

    identity: SpoolIdentity
    next_sequence: int


@dataclass(frozen=True)
class Opened:
    """The daemon's answer to a session opened: where the run is, what it holds, its lease and limits."""

    run_dir: str
    last_sequence: int
    lease_seconds: float
    limits: DaemonLimits
    durable_acks: bool = False
    """The daemon's logdir is on object storage: an ack means staged there, `Ack.durable` means uploaded."""
    durable_sequence: int = 0
    pacing: tuple[float, int] | None = None
    """The daemon's pacing (linger seconds, batches in flight; 0: the client's own), see `_pacing`."""


@dataclass(frozen=True)
class Ack:
    """The daemon wrote every event of the session up to `sequence` to the run's file."""

    sequence: int
    durable: int = 0
    """Every event up to here is uploaded (a daemon with `Opened.durable_acks`)."""
    pacing: tuple[float, int] | None = None
    """The daemon's pacing, when it changed (as `Opened.pacing`)."""


class Opening(Protocol):
    """A session being opened."""

    def done(self) -> bool: ...

    def result(self) -> Opened | None:
        """The answer (None when the opening was cancelled); raises `TransportError`."""
        ...

    def cancel(self) -> None: ...


class Stream(Protocol):
    """One write stream of a session. `on_ack` and `on_end` (given to `Transport.open_stream`) run on a thread
    of the stream's own."""

    @property
    def ended(self) -> bool: ...

    @property
    def failed(self) -> bool:
        """It ended with an error (not by a close)."""
        ...

    def write(self, first_sequence: int, events: Sequence[bytes]) -> None: ...

    def write_scalars(self, first_sequence: int, scalars: ScalarRun, fixed_steps: bool = False) -> None:
        """A batch of scalars as columns (only to a daemon that said it takes them); `fixed_steps`: their steps
        in `fixed_step` (only to one that said it takes those)."""
        ...

    def heartbeat(self) -> None: ...

    def cancel(self) -> None: ...

    def close(self, *, cancel: bool, timeout: float) -> None:
        """End the stream (half-close, or cancel) and wait for its acknowledgements (at most `timeout`)."""
        ...


class Transport(Protocol):
    """A connection to the daemon of one session's sender."""

    @property
    def address(self) -> str:
        """The daemon it talks to (for messages)."""
        ...

    def open_session(self, hello: Hello, on_done: Callable[[], None]) -> Opening: ...

    def open_stream(
        self,
        session_id: str,
        on_ack: Callable[[Ack], None],
        on_end: Callable[[TransportError | None], None],
    ) -> Stream: ...

    def close_session(self, session_id: str, timeout: float, stop: Callable[[float], bool]) -> bool:
        """Ask the daemon to sync and release the session; False when `stop(seconds)` (which waits) said to give
        up meanwhile (the sender was abandoned). Raises `TransportError`."""
        ...

    def flush(self, session_id: str, timeout: float) -> int:
        """Ask the daemon to fsync the run's file (a bucket logdir: upload it) when a session was opened; the
        sequence number through which it holds the session's events so (0: no session). Raises
        `TransportError`."""
        ...

    def close(self) -> None:
        """Release the connection (the sender thread ends)."""
        ...

    def leave_to_parent(self) -> None:
        """In a forked child: never touch (nor free) what the parent process still uses."""
        ...
