"""The background sender: a bounded queue the caller appends to, and one thread that ships it.

The caller's thread only appends to a deque (`submit`). A named daemon thread, started on the first event,
turns queued items into serialized events, numbers them in batches (sequence numbers 1, 2, ... without
gaps) and streams them to the daemon over one gRPC write stream; an ack thread reads the acknowledgements.

Every numbered batch stays in the sender's *log* until the daemon acknowledges it, and is sent again after a
reconnect; the daemon drops what it already holds (it remembers each session's last sequence number on disk,
also across its own restart), so nothing is written twice and nothing acknowledged is lost. A batch of the
log lives in memory or, *spilled*, in the session's spool on local disk (`_spool`): when the daemon has not
acknowledged anything for `spool_after` seconds, when memory runs over `max_queue_bytes` (policy `spill`),
and when `close()` runs out of time. Spilled batches are read back to be sent when the daemon returns; a
spool left at exit is delivered later by `summaryd replay`.

Nothing here raises into the caller: failures are counted, logged at a limited rate and reported by
`flush`/`close`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from summaryd.client import _grpc_import  # noqa: F401 - before gRPC is imported (its fork handlers)
from summaryd.client._batch_fit import DaemonLimits
from summaryd.client._channel import ChannelSettings, open_channel

# isort: split
import grpc

from summaryd.client import _process
from summaryd.client._courier import outbox_root
from summaryd.client._encoder import EventEncoder
from summaryd.client._environment import resolve_address
from summaryd.client._spool import Spool, SpoolIdentity, default_root
from summaryd.client._stream import WriteStream
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

log = logging.getLogger("summaryd.client")

VERSION = "0.1.0"

# An event to send: its serialized bytes, a scalar, or a function that builds them on the sender thread (so
# that no encoding, PNG or protobuf, runs on the caller's thread).
EventSource = bytes | Callable[[], bytes]

# What the queue holds: `(source, estimated bytes)`, or the plain values of a scalar or of a serialized summary
# that the sender thread turns into an event (see `_encoder`).
Queued = tuple[EventSource, int] | tuple[bytes, int, float, int] | tuple[str, float, int, float, int]

Overflow = Literal["spill", "drop_oldest", "block"]
OVERFLOW_POLICIES: tuple[Overflow, ...] = ("spill", "drop_oldest", "block")

# Trailing metadata of a refused batch: the sequence number of the event the daemon refused (see the proto).
REFUSED_SEQUENCE_KEY = "summaryd-refused-sequence"

# Statuses after which retrying the same request cannot succeed.
_PERMANENT = frozenset(
    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED}
)
_WARN_EVERY = 10.0
# Share of `close(timeout)` kept for spooling what the daemon did not acknowledge (at most a second).
_SPOOL_RESERVE = 0.2


@dataclass(frozen=True)
class DeliveryReport:
    """What became of the events a sender accepted, as `flush()` and `close()` return it."""

    delivered: int
    """Events the daemon acknowledged (written to the run's event file)."""
    undelivered: int
    """Events accepted but not acknowledged when the call returned (queued, in flight, or spooled)."""
    dropped: Mapping[str, int] = field(default_factory=dict)
    """Events given up, by reason: `queue_full`, `encode_error`, `rejected`, `closed`, `timeout`,
    `spool_failed`; and from `SummaryWriter`, `files` (projector files not uploaded)."""
    synced: bool = False
    """True when the daemon confirmed every delivered event is fsynced (after `close`)."""
    error: str | None = None
    """The last error the daemon or the connection reported, if any."""
    spooled: int = 0
    """Of `undelivered`, the events safe in the local spool: `summaryd replay <spool_path>` delivers them."""
    spool_path: str | None = None
    """The spool directory of this session, while it holds events."""

    @property
    def ok(self) -> bool:
        """Everything accepted was delivered and nothing was dropped."""
        return self.undelivered == 0 and not any(self.dropped.values())


@dataclass(eq=False)
class _Batch:
    """Numbered events `first .. first + count - 1`, in memory (`events`) or in the spool (`span`)."""

    first: int
    count: int
    nbytes: int
    events: list[bytes] | None
    span: tuple[int, int] | None = None
    done: int = 0  # leading events the daemon acknowledged already (an ack inside this batch)
    sent_at: float = 0.0
    settled: bool = False

    @property
    def last(self) -> int:
        return self.first + self.count - 1


class Sender:
    """Ships the events of one session (one run directory) to the daemon in the background.

    Args:
        run: run path under the daemon's logdir.
        address: `host:port` of the daemon; default `SUMMARYD_ADDRESS`, else `localhost:6065`.
        worker: worker label; the events land in `<run>/<worker>`. Empty for a single process.
        world_size: number of workers of the job (shown in status).
        max_queue_bytes: bound of the events held in memory (queued and unacknowledged), in estimated bytes.
        max_batch_events, max_batch_bytes: the largest batch sent at once.
        linger_secs: how long a partial batch waits for more events before it is sent.
        rpc_timeout: deadline of each call, and how long a sent batch may wait for its ack.
        max_in_flight: batches sent but not yet acknowledged.
        close_timeout: default of `close(timeout=...)`, also used at interpreter exit and on SIGTERM.
        overflow: what happens when memory runs over `max_queue_bytes`: `spill` the oldest events to the spool
            (the default; nothing is lost while the local disk takes it), `drop_oldest` queued events, or
            `block` the caller until there is room (at most `block_secs`, then the new event is dropped).
        spool_dir: spool root; default `SUMMARYD_SPOOL_DIR`, else `~/.cache/summaryd/spool`. None disables
            spooling when given as `spool=False`.
        spool: whether events may be spooled at all.
        spool_after: seconds without any acknowledgement (daemon away or stuck) after which unacknowledged
            events are moved to the spool, where they survive this process.
        heartbeat_secs: longest silence on the stream; the daemon releases sessions it does not hear from.
    """

    def __init__(
        self,
        run: str,
        *,
        address: str | None = None,
        worker: str = "",
        world_size: int = 1,
        framework: str = "summaryd",
        max_queue_bytes: int = 64 * 1024 * 1024,
        max_batch_events: int = 1024,
        max_batch_bytes: int = 1024 * 1024,
        linger_secs: float = 0.05,
        rpc_timeout: float = 10.0,
        max_in_flight: int = 8,
        backoff_secs: tuple[float, float] = (0.05, 2.0),
        close_timeout: float = 5.0,
        overflow: Overflow = "spill",
        block_secs: float | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        spool: bool = True,
        spool_after: float = 10.0,
        heartbeat_secs: float = 10.0,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ) -> None:
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow={overflow!r}: choose one of {', '.join(OVERFLOW_POLICIES)}")
        self.run = run
        self.address = resolve_address(address)
        # Token and TLS: arguments, else SUMMARYD_TOKEN / SUMMARYD_TLS_*; checked here, not on the sender thread.
        self.channel_settings = ChannelSettings.from_environment(
            token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
        )
        self.worker = worker
        self.world_size = world_size
        self.framework = framework
        self.max_queue_bytes = max_queue_bytes
        self.max_batch_events = max_batch_events
        self.max_batch_bytes = max_batch_bytes
        self.linger_secs = linger_secs
        self.rpc_timeout = rpc_timeout
        self.max_in_flight = max_in_flight
        self.backoff_secs = backoff_secs
        self.close_timeout = close_timeout
        self.overflow: Overflow = overflow if spool or overflow != "spill" else "drop_oldest"
        self.block_secs = block_secs
        self.spool_root = Path(spool_dir) if spool_dir is not None else default_root()
        self.spool_enabled = spool
        self.spool_after = spool_after
        self.heartbeat_secs = heartbeat_secs
        self._init_state()
        _process.register(self)

    def _init_state(self) -> None:
        """Everything that belongs to one process; a forked child builds it anew (never the parent's channel)."""
        self._pid = os.getpid()
        # In a child forked from a process that used gRPC: never use gRPC, write to an outbox instead.
        self._outbox_pid = _process.outbox_owner()
        self.session_id = str(uuid.uuid4())
        self.run_dir: str | None = None
        # Re-entrant: the SIGTERM handler may close the sender while the interrupted caller holds the lock.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._abandon = threading.Event()
        # Held while an event is encoded on the sender thread; a fork waits for it (see `_process`).
        self._encoding = threading.Lock()
        # The caller's side: events not yet numbered.
        self._queue: deque[Queued] = deque()
        self._encoder = EventEncoder()  # sender thread only
        self._queued_bytes = 0
        self._room_wanted = 0  # bytes a caller waits to queue (policies spill and block)
        self._queued_at = 0.0
        # The sender's side: numbered batches not yet acknowledged, oldest first; spilled ones form a prefix.
        self._log: deque[_Batch] = deque()
        self._held_bytes = 0
        self._held_events = 0
        self._next_sequence = 1
        self._acked = 0
        # The first `_in_flight` batches of the log were sent on the current stream (at most `max_in_flight`).
        self._in_flight = 0
        self._progress_at = time.monotonic()
        # Counters.
        self._accepted = 0
        self._settled = 0
        self._delivered = 0
        self._spooled = 0
        self._dropped: Counter[str] = Counter()
        # Lifecycle.
        self._closing = False
        self._closed = False
        self._spill_all = False
        self._synced = False
        self._failed: str | None = None
        self._last_error: str | None = None
        self._refused: str | None = None
        self._refused_sequence: int | None = None  # the event the daemon named, if it did
        self._warned: dict[str, float] = {}
        self._close_deadline = float("inf")
        self._thread: threading.Thread | None = None
        # Connection (sender thread only).
        self._channel: grpc.Channel | None = None
        self._stream: WriteStream | None = None
        self._opening: grpc.Future[pb.OpenSessionResponse] | None = None
        self._next_attempt = 0.0
        self._backoff = self.backoff_secs[0]
        self._connect_failed = False
        self._lease = float("inf")
        self._daemon_limits = DaemonLimits()
        self._last_sent = 0.0
        # Spool (sender thread only).
        self._spool: Spool | None = None
        self._spool_error: str | None = None
        self._told_spool = False

    # ---- process boundaries (see `_process`) -------------------------------------------------------------

    def owned_here(self) -> bool:
        return self._pid == _process.pid

    def pause_for_fork(self, timeout: float) -> bool:
        return self._encoding.acquire(timeout=timeout)

    def resume_after_fork(self) -> None:
        self._encoding.release()

    def forget_parent_after_fork(self) -> None:
        """In a forked child: leave the parent's session, stream and spool alone and start afresh."""
        if self.owned_here():
            return
        if self._spool is not None:
            self._spool.forget()
        _process.keep_forever(self._channel, self._stream, self._opening)
        self._init_state()

    # ---- the caller's side -------------------------------------------------------------------------------

    def submit(self, source: EventSource, nbytes: int = 64) -> bool:
        """Queue one event without blocking (unless `overflow="block"`); False when it was dropped (counted)."""
        return self.enqueue((source, nbytes))

    def enqueue(self, item: Queued) -> bool:
        """Queue `(source, estimated bytes)`, or the plain values of an event the sender thread builds (see
        `_encoder`). As `submit` otherwise."""
        # The caller's hot path: every call here is inlined where it could be (a Python call costs the caller
        # most right after its thread slept, the usual case in training).
        if self._pid != _process.pid:  # forked: see `_process`
            self.forget_parent_after_fork()
        # The condition's own lock, taken directly: `with self._cond` would add a Python-level call.
        with self._lock:
            if self._closing or self._failed is not None:
                self._dropped["closed" if self._closing else "rejected"] += 1
                return False
            nbytes: int = item[-1]
            over = self._queued_bytes + self._held_bytes + max(nbytes, self._room_wanted) > self.max_queue_bytes
            if over and not self._make_room(nbytes):
                self._dropped["queue_full"] += 1
                self._warn("queue_full", f"queue full ({self.max_queue_bytes} bytes): dropping events of {self.run!r}")
                return False
            # The first event of a new batch wakes the sender, which may be asleep for up to a heartbeat
            # interval, so that the batch leaves within `linger_secs` of it; later ones only when it is full.
            wake = not self._queue
            if wake:
                self._queued_at = time.monotonic()
                if not self._log:
                    self._progress_at = self._queued_at
            self._queue.append(item)
            before = self._queued_bytes
            self._queued_bytes = queued = before + nbytes
            self._accepted += 1
            # Wake it once as a batch fills up, not at every event after: a caller that outruns the sender
            # would otherwise pay for a wake-up (and a fight for the GIL) per event.
            wake = wake or len(self._queue) == self.max_batch_events
            wake = wake or before < self.max_batch_bytes <= queued
            held = self._held_bytes
            wake = wake or before + held <= self.max_queue_bytes < queued + held
        if self._thread is None:
            self._start()
        elif wake:
            self._wake.set()
        return True

    def _over_budget(self, nbytes: int = 0) -> bool:
        return self._queued_bytes + self._held_bytes + max(nbytes, self._room_wanted) > self.max_queue_bytes

    def _make_room(self, nbytes: int) -> bool:
        """Apply the overflow policy for an event of `nbytes`; False when it must be dropped. Holds the lock."""
        if not self._over_budget(nbytes):
            return True
        if self.overflow == "spill" and self._spool_error is None:
            # The sender thread spills to disk; only events it has not even serialized yet are waited for,
            # i.e. the caller slows down only when it outruns this machine's own encoding and disk.
            self._room_wanted = nbytes
            try:
                while self._queued_bytes + nbytes > self.max_queue_bytes and self._sender_alive():
                    self._wake.set()
                    self._cond.wait(0.05)
                    if self._spool_error is not None:
                        break
            finally:
                self._room_wanted = 0
            if self._spool_error is None:
                return True
        if self.overflow == "block":
            deadline = None if self.block_secs is None else time.monotonic() + self.block_secs
            self._room_wanted = nbytes
            try:
                while self._over_budget(nbytes) and self._sender_alive() and not self._closing:
                    remaining = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
                    if remaining <= 0:
                        return False
                    self._wake.set()
                    self._cond.wait(remaining)
            finally:
                self._room_wanted = 0
            return True
        # drop_oldest (also `spill` once the spool failed): make room from the head of the queue.
        dropped = 0
        while self._queue and self._over_budget(nbytes):
            self._queued_bytes -= self._queue.popleft()[-1]
            self._settled += 1
            dropped += 1
        if dropped:
            self._dropped["queue_full"] += dropped
            self._warn("queue_full", f"queue over {self.max_queue_bytes} bytes: dropping the oldest of {self.run!r}")
        return True

    def _sender_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _warn(self, reason: str, message: str) -> None:
        now = time.monotonic()
        if now - self._warned.get(reason, -_WARN_EVERY) >= _WARN_EVERY:
            self._warned[reason] = now
            log.warning("summaryd: %s", message)

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name=f"summaryd-sender[{self.run}]", daemon=True)
        _process.register_multiprocessing_exit()
        try:
            self._thread.start()
        except RuntimeError:  # the interpreter is shutting down
            with self._lock:
                self._failed = "the sender thread could not start (interpreter exiting)"

    def report(self) -> DeliveryReport:
        """The counts as of now."""
        with self._lock:
            return DeliveryReport(
                delivered=self._delivered,
                undelivered=self._accepted - self._settled,
                dropped=dict(self._dropped),
                synced=self._synced,
                error=self._failed or self._last_error,
                spooled=self._spooled,
                spool_path=str(self._spool.directory) if self._spool is not None and self._spooled else None,
            )

    def flush(self, timeout: float | None = None, *, durable: bool = False) -> DeliveryReport:
        """Wait until everything submitted so far is acknowledged (visible in the event file).

        With `durable`, also ask the daemon to fsync the run's file. Never raises; the report says what is
        still undelivered when the timeout ran out.
        """
        deadline = time.monotonic() + (self.rpc_timeout if timeout is None else timeout)
        with self._cond:
            target = self._accepted
            if self._thread is None and target > self._settled:
                return self.report()
        self._wake.set()
        with self._cond:
            while self._settled + (self._spooled if self._outbox_pid else 0) < target and self._failed is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._sender_alive():
                    break
                self._cond.wait(min(remaining, 0.1))
            done = self._settled >= target
        channel = self._channel
        if durable and done and channel is not None:
            try:
                pb_grpc.SummariesStub(channel).Flush(
                    pb.FlushRequest(session_id=self.session_id, durable=True),
                    timeout=max(0.01, deadline - time.monotonic()),
                )
            except (grpc.RpcError, ValueError) as exc:
                self._note_error(exc)
        return self.report()

    def begin_close(self, deadline: float) -> None:
        """Stop taking events and start delivering the rest; `close()` waits for it."""
        with self._cond:
            if not self._closing:
                self._closing = True
                self._close_deadline = deadline
            self._cond.notify_all()
        self._wake.set()

    def close(self, timeout: float | None = None) -> DeliveryReport:
        """Deliver what is queued, have the daemon fsync it and release the session; safe to call twice.

        Returns within about `timeout` seconds (default `close_timeout`) whatever the daemon does. What the
        daemon did not acknowledge by then is in the spool (`report.spooled`, `report.spool_path`) unless
        spooling is off or failed; the rest is counted as dropped (`timeout`).
        """
        if not self.owned_here():
            self.forget_parent_after_fork()
        timeout = self.close_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._closed:
                return self.report()
            deadline = min(deadline, self._close_deadline)
        self.begin_close(deadline)
        thread = self._thread
        if thread is not None:
            # Deliver until shortly before the deadline, then spool what is left, then stop.
            reserve = min(1.0, timeout * _SPOOL_RESERVE) if self._can_spool() else 0.0
            thread.join(max(0.0, deadline - reserve - time.monotonic()))
            if thread.is_alive():
                with self._cond:
                    self._spill_all = True
                self._wake.set()
                thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                self._abandon.set()
                self._wake.set()
                stream = self._stream
                if stream is not None:
                    stream.call.cancel()
                thread.join(1.0)
        return self._closed_report()

    def _closed_report(self) -> DeliveryReport:
        with self._cond:
            self._closed = True
            undelivered = self._accepted - self._settled
            unsafe = undelivered - self._spooled
            if unsafe > 0:
                self._dropped["timeout"] += unsafe
                self._settled += unsafe
                log.warning(
                    "summaryd: %d events for run %r were not delivered to %s (%s)",
                    unsafe,
                    self.run,
                    self.address,
                    self._failed or self._last_error or "timed out",
                )
            report = dataclasses.replace(self.report(), undelivered=undelivered)
        if report.spooled and self._outbox_pid is not None:
            log.debug("summaryd: %d events of run %r left to process %d", report.spooled, self.run, self._outbox_pid)
        elif report.spooled:
            log.warning(
                "summaryd: %d events of run %r were not delivered; they are in the spool %s (see `summaryd replay`)",
                report.spooled,
                self.run,
                report.spool_path,
            )
        _process.unregister(self)
        return report

    def _can_spool(self) -> bool:
        return (self.spool_enabled or self._outbox_pid is not None) and self._spool_error is None

    # ---- the sender thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self._send_loop():
                self._finish()
        except Exception as exc:  # a bug here must not go unnoticed, nor reach the training loop
            log.exception("summaryd sender for run %r failed", self.run)
            with self._cond:
                self._failed = f"sender failed: {exc!r}"
        finally:
            self._disconnect()
            if self._opening is not None:
                self._opening.cancel()
            if self._channel is not None:
                self._channel.close()
                self._channel = None
            self._put_spool_away()
            with self._cond:
                self._cond.notify_all()

    def _send_loop(self) -> bool:
        """Run until everything is acknowledged after a close (True), or until told to stop (False)."""
        while True:
            with self._cond:
                if self._failed is not None:
                    return False
                if self._closing and not self._queue and not self._log:
                    return True
                if self._outbox_pid is not None and self._closing and not self._queue and not self._held_events:
                    return False  # all in the outbox: the parent's courier delivers it
            if self._abandon.is_set():
                self._spill(everything=True)
                return False
            self._handle_refusal()
            self._discard_spool_when_acknowledged()
            self._poll_connection()
            self._take_batches()
            # Closing while the daemon is away: make everything safe on disk now, then keep trying to deliver
            # until close() runs out of time.
            self._spill(everything=self._spill_all or self._closing_while_unreachable())
            self._send_ready()
            self._keep_stream_alive()
            self._wake.wait(self._next_wakeup())
            self._wake.clear()

    # ---- connection ----

    def _poll_connection(self) -> None:
        """Open (or resume) the session and a write stream without blocking this thread."""
        if self._outbox_pid is not None or (self._stream is not None and not self._stream.ended):
            return
        if self._stream is not None:
            failed = self._stream.error is not None
            self._disconnect()
            if failed:  # a daemon that refuses writes (disk full) is not hammered with resends
                self._retry_later()
        if self._opening is not None:
            if not self._opening.done():
                return
            future, self._opening = self._opening, None
            try:
                answer = future.result()
            except grpc.RpcError as exc:
                self._connection_failed(exc)
                return
            except grpc.FutureCancelledError:
                return
            self._connected(answer)
            return
        if time.monotonic() < self._next_attempt:
            return
        if self._channel is None:
            _process.note_grpc_used()
            self._channel = open_channel(self.address, self.channel_settings)
        request = pb.OpenSessionRequest(
            session_id=self.session_id,
            run=self.run,
            worker=self.worker,
            world_size=self.world_size,
            client=pb.ClientIdentity(
                host=socket.gethostname(), pid=os.getpid(), framework=self.framework, version=VERSION
            ),
            next_sequence=self._acked + 1,
        )
        self._opening = pb_grpc.SummariesStub(self._channel).OpenSession.future(request, timeout=self.rpc_timeout)
        self._opening.add_done_callback(lambda _: self._wake.set())

    def _connected(self, answer: pb.OpenSessionResponse) -> None:
        assert self._channel is not None
        self.run_dir = answer.run_dir
        self._lease = answer.lease_seconds or float("inf")
        self._daemon_limits = DaemonLimits.of(answer)
        self._on_ack(answer.last_sequence)
        self._stream = WriteStream(pb_grpc.SummariesStub(self._channel), self._on_ack, self._on_stream_end)
        with self._lock:
            self._in_flight = 0
        self._last_sent = time.monotonic()
        self._connect_failed = False
        if self._spooled:
            log.info("summaryd: %s is back; sending %d spooled events of %r", self.address, self._spooled, self.run)

    def _connection_failed(self, exc: grpc.RpcError) -> None:
        self._note_error(exc)
        self._connect_failed = True
        if exc.code() in _PERMANENT or exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
            self._give_up(f"{exc.code().name}: {exc.details()}")
            return
        self._retry_later()

    def _retry_later(self) -> None:
        """Capped exponential backoff; it starts again from the bottom once the daemon acknowledges."""
        self._next_attempt = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.backoff_secs[1])

    def _disconnect(self) -> None:
        if self._stream is not None:
            self._stream.close(cancel=True, timeout=1.0)
            self._stream = None
        with self._lock:
            self._in_flight = 0

    def _closing_while_unreachable(self) -> bool:
        return self._closing and self._stream is None and self._connect_failed

    def _on_ack(self, acked: int) -> None:
        """Runs on the ack thread: settle every batch up to `acked`."""
        with self._cond:
            if acked <= self._acked:
                return
            self._acked = acked
            self._progress_at = time.monotonic()
            self._backoff = self.backoff_secs[0]
            while self._log and self._log[0].last <= acked:
                batch = self._log.popleft()
                batch.settled = True
                self._in_flight = max(0, self._in_flight - 1)
                self._count_delivered(batch, batch.count - batch.done)
                if batch.events is not None:
                    self._held_bytes -= batch.nbytes
            if self._log and self._log[0].first <= acked:
                head = self._log[0]
                newly = acked - head.first + 1 - head.done
                head.done += newly
                self._count_delivered(head, newly)
            self._cond.notify_all()
        self._wake.set()

    def _count_delivered(self, batch: _Batch, events: int) -> None:
        self._delivered += events
        self._settled += events
        if batch.events is None:
            self._spooled -= events
        else:
            self._held_events -= events

    def _on_stream_end(self, stream: WriteStream, error: grpc.RpcError | None) -> None:
        if error is None or (error.code() == grpc.StatusCode.CANCELLED and self._abandon.is_set()):
            self._wake.set()
            return
        self._note_error(error)
        if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
            sequence = _refused_sequence(error)
            with self._cond:
                self._refused = error.details()
                self._refused_sequence = sequence
        self._wake.set()

    def _handle_refusal(self) -> None:
        """The daemon refused the oldest unacknowledged batch and wrote none of it. When it named the event it
        refused, drop that event alone (the data itself is bad, a resend cannot help); otherwise the batch. Then
        number the rest on from the last acknowledged event and send it again."""
        with self._cond:
            reason, self._refused = self._refused, None
            sequence, self._refused_sequence = self._refused_sequence, None
            if reason is None:
                return
            if self._spooled:
                self._unspill()
            if self._log:
                head = self._log[0]
                if sequence is not None and head.events is not None and head.first + head.done <= sequence <= head.last:
                    self._drop_one(head, sequence - head.first)
                    log.error("summaryd: the daemon refused an event of run %r: %s", self.run, reason)
                else:
                    self._log.popleft()
                    head.settled = True
                    self._held_bytes -= head.nbytes
                    self._held_events -= head.count - head.done
                    self._dropped["rejected"] += head.count - head.done
                    self._settled += head.count - head.done
                    log.error("summaryd: the daemon refused %d events of run %r: %s", head.count, self.run, reason)
            sequence = self._acked + 1
            for batch in self._log:
                batch.first, batch.done = sequence, 0
                sequence += batch.count
            self._next_sequence = sequence
            self._cond.notify_all()

    def _drop_one(self, head: _Batch, index: int) -> None:
        """Take event `index` out of the in-memory batch `head`, with the events acknowledged already (they are
        counted); the batch keeps the rest, to be renumbered. Holds the lock."""
        assert head.events is not None
        kept = head.events[head.done : index] + head.events[index + 1 :]
        nbytes = sum(map(len, kept))
        self._held_bytes -= head.nbytes - nbytes
        self._held_events -= 1
        self._dropped["rejected"] += 1
        self._settled += 1
        head.events, head.count, head.nbytes, head.done = kept, len(kept), nbytes, 0
        if not kept:
            self._log.popleft()
            head.settled = True

    def _note_error(self, exc: BaseException) -> None:
        text = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.RpcError) else repr(exc)
        self._last_error = text
        self._warn("daemon", f"daemon at {self.address} for run {self.run!r}: {text}")

    def _give_up(self, reason: str) -> None:
        """A permanent refusal (bad run path, no permission): drop everything, report it on close."""
        log.error("summaryd: giving up on run %r: %s", self.run, reason)
        with self._cond:
            self._failed = reason
            dropped = len(self._queue) + sum(b.count - b.done for b in self._log)
            self._dropped["rejected"] += dropped
            self._settled += dropped
            self._queue.clear()
            self._queued_bytes = 0
            for batch in self._log:
                batch.settled = True
            self._log.clear()
            self._held_bytes = self._held_events = self._spooled = self._in_flight = 0
            self._cond.notify_all()
        if self._spool is not None:
            self._spool.discard()
            self._spool = None

    # ---- batches ----

    def _take_batches(self) -> None:
        """Number queued events into batches: as many as may be in flight, and all of them when spilling."""
        while True:
            with self._cond:
                if not self._queue:
                    return
                spilling = self._must_spill()
                if not spilling:
                    if self._stream is None or self._in_flight >= self.max_in_flight:
                        return
                    lingering = time.monotonic() - self._queued_at < self.linger_secs
                    small = len(self._queue) < self.max_batch_events and self._queued_bytes < self.max_batch_bytes
                    if lingering and small and not self._closing:
                        return
            batches = self._take_batch()
            if not batches:
                return
            if spilling:
                for batch in batches:
                    self._spill_batch(batch)

    def _take_batch(self) -> list[_Batch]:
        """Number the next queued events as batches: one, unless the daemon's limits cut it (see `_batch_fit`)."""
        events: list[bytes] = []
        nbytes = 0
        while len(events) < self.max_batch_events and nbytes < self.max_batch_bytes:
            with self._lock:
                items = self._take_run(self.max_batch_events - len(events), self.max_batch_bytes - nbytes)
            if not items:
                break
            for item in items:
                data = self._encode(item)
                if data is not None:
                    events.append(data)
                    nbytes += len(data)
        if not events:
            return []
        cuts, too_large = self._daemon_limits.fit(events, nbytes, self.session_id)
        if too_large:
            self._drop_too_large(too_large)
        batches = []
        with self._cond:
            for cut in cuts:
                size = nbytes if len(cuts) == 1 and not too_large else sum(map(len, cut))
                batch = _Batch(self._next_sequence, len(cut), size, cut)
                self._next_sequence += len(cut)
                self._log.append(batch)
                self._held_bytes += size
                self._held_events += len(cut)
                batches.append(batch)
            self._cond.notify_all()
        return batches

    def _drop_too_large(self, events: list[bytes]) -> None:
        """Events over the daemon's limits: no resend could deliver them (counted as rejected, and logged)."""
        limits = self._daemon_limits
        with self._cond:
            self._dropped["rejected"] += len(events)
            self._settled += len(events)
            self._cond.notify_all()
        log.error(
            "summaryd: dropped %d event(s) of run %r of up to %d bytes: the daemon at %s takes events of at most "
            "%d bytes (--max-event-bytes) in messages of at most %d bytes (--max-message-bytes)",
            len(events),
            self.run,
            max(map(len, events)),
            self.address,
            limits.max_event_bytes,
            limits.max_message_bytes,
        )

    def _take_run(self, max_events: int, max_bytes: int) -> list[Queued]:
        """Pop the next events of a batch (holding the lock): a run of those whose size is known, so that the
        lock the caller also takes is taken once per run, not per event; a function alone, since only encoding
        it tells its size."""
        queue = self._queue
        if not queue:
            return []
        first = queue.popleft()
        items = [first]
        room = max_bytes - first[-1]
        if _size_known(first):
            while queue and len(items) < max_events and room > 0:
                head = queue[0]
                if not _size_known(head):
                    break
                items.append(queue.popleft())
                room -= head[-1]
        self._queued_bytes -= max_bytes - room
        self._queued_at = time.monotonic()
        return items

    def _encode(self, item: Queued) -> bytes | None:
        """The bytes of a queued event; None (counted) when building it failed."""
        try:
            if len(item) == 5:
                return self._encoder.scalar(item)  # protobuf only: no lock a fork could inherit held
            if len(item) == 4:
                return self._encoder.summary(item)
            source = item[0]
            if isinstance(source, bytes):
                return source
            assert callable(source)
            with self._encoding:
                data: bytes = source()
                return data
        except Exception as exc:
            log.warning("summaryd: could not encode an event for run %r: %s", self.run, exc)
            with self._cond:
                self._dropped["encode_error"] += 1
                self._settled += 1
                self._cond.notify_all()
            return None

    def _send_ready(self) -> None:
        """Send unsent batches of the log, oldest first, while the in-flight window has room."""
        stream = self._stream
        if stream is None or stream.ended:
            return
        while True:
            with self._lock:
                # Sent batches are a prefix of the log, so the next one to send is right after them.
                if self._in_flight >= min(self.max_in_flight, len(self._log)):
                    return
                batch = self._log[self._in_flight]
                events, span = batch.events, batch.span
            if events is None:
                assert span is not None and self._spool is not None
                events = self._spool.read(span)
            batch.sent_at = self._last_sent = time.monotonic()
            stream.send(pb.WriteRequest(session_id=self.session_id, first_sequence=batch.first, events=events))
            with self._lock:
                if not batch.settled:
                    self._in_flight += 1

    def _keep_stream_alive(self) -> None:
        """Reconnect when an ack is overdue; send a heartbeat when the stream has been silent a while."""
        stream = self._stream
        if stream is None or stream.ended:
            return
        now = time.monotonic()
        with self._lock:
            head = self._log[0] if self._log and self._in_flight else None
        if head is not None and now - head.sent_at > self.rpc_timeout:
            self._last_error = f"no acknowledgement within {self.rpc_timeout}s; reconnecting"
            stream.call.cancel()
        elif now - self._last_sent >= self._heartbeat_interval():
            self._last_sent = now
            stream.send(pb.WriteRequest(session_id=self.session_id))

    def _heartbeat_interval(self) -> float:
        return min(self.heartbeat_secs, self._lease / 3)

    def _next_wakeup(self) -> float:
        now = time.monotonic()
        waits = [self._heartbeat_interval() - (now - self._last_sent), 1.0]
        with self._lock:
            if self._queue:
                waits.append(self.linger_secs - (now - self._queued_at))
            if self._queue or self._log:
                waits.append(self.spool_after - (now - self._progress_at))
                waits.append(0.1)  # acks, overdue batches and the in-flight window
        if self._stream is None and self._opening is None:
            waits.append(self._next_attempt - now)
        return max(0.001, min(waits))

    # ---- spool ----

    def _must_spill(self) -> bool:
        """Holding the lock: whether unacknowledged events should go to disk now."""
        if not self._can_spool():
            return False
        if self._spill_all or self._abandon.is_set() or self._outbox_pid is not None:
            return True
        if (self._queue or self._log) and time.monotonic() - self._progress_at >= self.spool_after:
            return True
        return self.overflow == "spill" and self._over_budget()

    def _spill(self, *, everything: bool) -> None:
        """Move every in-memory batch of the log to the spool, then number and spill the queue too, when
        spilling is due (or `everything` is asked for, at close)."""
        with self._lock:
            due = everything or self._must_spill()
            if not due or not self._can_spool():
                return
            # Spilled batches are a prefix of the log, the ones in memory the rest: take them from the end.
            pending: list[_Batch] = []
            for batch in reversed(self._log):
                if batch.events is None:
                    break
                pending.append(batch)
        for batch in reversed(pending):
            if not self._spill_batch(batch):
                return
        while True:
            with self._lock:
                if not self._queue or not (everything or self._must_spill()):
                    return
            taken = self._take_batch()
            if not taken or not all(self._spill_batch(batch) for batch in taken):
                return

    def _spill_batch(self, batch: _Batch) -> bool:
        """Write one in-memory batch to the spool and free its memory; False when the spool failed."""
        with self._lock:
            if batch.events is None or batch.settled:
                return True  # spilled already, or acknowledged meanwhile
            events = batch.events
        try:
            if self._spool is None:
                self._spool = self._open_spool(batch.first)
            span = self._spool.append(events)
        except OSError as exc:
            self._spool_failed(exc)
            return False
        with self._cond:
            if not batch.settled and batch.events is not None:
                batch.events, batch.span = None, span
                self._held_bytes -= batch.nbytes
                self._held_events -= batch.count - batch.done
                self._spooled += batch.count - batch.done
            self._cond.notify_all()
        return True

    def _open_spool(self, first_sequence: int) -> Spool:
        identity = SpoolIdentity(self.session_id, self.run, self.worker, self.world_size, self.address, self.framework)
        if self._outbox_pid is not None:
            return Spool(outbox_root(self.spool_root, self._outbox_pid), identity, first_sequence)
        spool = Spool(self.spool_root, identity, first_sequence)
        if not self._told_spool:
            self._told_spool = True
            if self._closing:
                why = "closing before the daemon acknowledged them"
            elif self._queued_bytes + self._held_bytes > self.max_queue_bytes:
                why = f"more than max_queue_bytes={self.max_queue_bytes} waiting"
            else:
                why = f"no acknowledgement from {self.address} for {self.spool_after:.0f}s"
            log.warning(
                "summaryd: spooling events of run %r to %s (%s); they are sent when the daemon answers, and any "
                "left when this process ends are delivered by: summaryd replay %s",
                self.run,
                spool.directory,
                why,
                spool.directory,
            )
        return spool

    def _spool_failed(self, exc: OSError) -> None:
        with self._cond:
            self._spool_error = f"{exc.strerror or exc}"
            self._cond.notify_all()
        log.error(
            "summaryd: cannot spool events of run %r to %s (%s); keeping them in memory up to max_queue_bytes",
            self.run,
            self.spool_root,
            self._spool_error,
        )

    def _unspill(self) -> None:
        """Holding the lock: read every spilled batch back into memory and delete the spool (renumbering)."""
        assert self._spool is not None
        for batch in self._log:
            if batch.events is None and batch.span is not None:
                events = self._spool.read(batch.span)[batch.done :]
                batch.first, batch.count, batch.done = batch.first + batch.done, len(events), 0
                batch.events, batch.span, batch.nbytes = events, None, sum(map(len, events))
                self._spooled -= len(events)
                self._held_events += len(events)
                self._held_bytes += batch.nbytes
        self._spool.discard()
        self._spool = None

    def _put_spool_away(self) -> None:
        """When the thread ends: delete a spool that is fully acknowledged, keep (sync) one that is not."""
        spool = self._spool
        if spool is None:
            return
        with self._lock:
            still_spooled = self._spooled > 0
        if still_spooled:
            spool.keep()
        else:
            spool.discard()
            with self._lock:
                self._spool = None

    def _discard_spool_when_acknowledged(self) -> None:
        if self._spool is None:
            return
        with self._lock:
            still_spooled = self._spooled > 0
        if not still_spooled:
            self._spool.discard()
            self._spool = None

    def _finish(self) -> None:
        """After the last ack of a closing sender: end the stream and close the session (the daemon fsyncs).

        A close that meets a restarting daemon is tried again until `close()`'s deadline: the daemon knows
        the session from its store, and a close is harmless to repeat.
        """
        self._discard_spool_when_acknowledged()
        if self._stream is not None:
            self._stream.close(cancel=False, timeout=max(0.0, self._close_deadline - time.monotonic()))
            self._stream = None
        backoff = self.backoff_secs[0]
        while self._channel is not None and not self._abandon.is_set():
            try:
                self._close_session()
                with self._cond:
                    self._synced = True
                return
            except grpc.RpcError as exc:
                self._note_error(exc)
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return
            except grpc.FutureCancelledError:
                return
            if self._abandon.wait(min(backoff, max(0.0, self._close_deadline - time.monotonic()))):
                return
            backoff = min(backoff * 2, self.backoff_secs[1])

    def _close_session(self) -> None:
        assert self._channel is not None
        future = pb_grpc.SummariesStub(self._channel).CloseSession.future(
            pb.CloseSessionRequest(session_id=self.session_id),
            timeout=max(0.01, min(self.rpc_timeout, self._close_deadline - time.monotonic())),
        )
        while not future.done():
            if self._abandon.wait(0.02):
                future.cancel()
        future.result()


def _size_known(item: Queued) -> bool:
    """Whether a queued event's estimated size is (about) its size: serialized bytes and plain values are;
    a function's estimate may be far off until it has run."""
    return len(item) != 2 or isinstance(item[0], bytes)


def _refused_sequence(error: grpc.RpcError) -> int | None:
    """The sequence number of the event a daemon refused, from the trailing metadata of its INVALID_ARGUMENT."""
    trailing = getattr(error, "trailing_metadata", None)
    for key, value in (trailing() if callable(trailing) else None) or ():
        if key == REFUSED_SEQUENCE_KEY:
            try:
                return int(value)
            except (TypeError, ValueError):
                return None
    return None
