"""The background sender: a bounded queue the caller appends to, and one thread that ships it.

The caller's thread only appends to a deque (`submit`). A named daemon thread, started on the first event,
turns queued items into serialized events, batches them by size and time, numbers them, and streams them to
the daemon over one gRPC write stream; an ack thread reads the daemon's acknowledgements. Unacknowledged
batches are kept and resent after a reconnect (capped exponential backoff); the daemon drops what it already
holds, so nothing is written twice. Nothing here raises into the caller: failures are counted, logged at a
limited rate and reported by `flush`/`close`.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import socket
import threading
import time
import uuid
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import grpc

from summaryd.client._environment import resolve_address
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

log = logging.getLogger("summaryd.client")

VERSION = "0.1.0"

# An event to send: its serialized bytes, or a function that builds them on the sender thread (so that
# expensive encodings such as PNG never run on the caller's thread).
EventSource = bytes | Callable[[], bytes]

# Statuses after which retrying the same request cannot succeed.
_PERMANENT = frozenset(
    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED}
)


@dataclass(frozen=True)
class DeliveryReport:
    """What became of the events a sender accepted, as `flush()` and `close()` return it."""

    delivered: int
    """Events the daemon acknowledged (written to the run's event file)."""
    undelivered: int
    """Events accepted but not acknowledged when the call returned (still queued or in flight)."""
    dropped: Mapping[str, int] = field(default_factory=dict)
    """Events given up, by reason: `queue_full`, `encode_error`, `rejected`, `closed`, `timeout`."""
    synced: bool = False
    """True when the daemon confirmed every delivered event is fsynced (after `close`)."""
    error: str | None = None
    """The last error the daemon or the connection reported, if any."""

    @property
    def ok(self) -> bool:
        """Everything accepted was delivered and nothing was dropped."""
        return self.undelivered == 0 and not any(self.dropped.values())


@dataclass(eq=False)
class _Batch:
    first: int
    events: list[bytes]
    nbytes: int
    sent_at: float = 0.0

    @property
    def last(self) -> int:
        return self.first + len(self.events) - 1


class _Stream:
    """One `Write` stream: requests go through a queue that gRPC consumes; a thread reads the acks."""

    def __init__(
        self,
        stub: pb_grpc.SummariesStub,
        on_ack: Callable[[int], None],
        on_end: Callable[[_Stream, grpc.RpcError | None], None],
    ) -> None:
        self._outgoing: queue.SimpleQueue[pb.WriteRequest | None] = queue.SimpleQueue()
        self._on_ack = on_ack
        self._on_end = on_end
        self.error: grpc.RpcError | None = None
        self.ended = False
        self.call = stub.Write(self._requests())
        self._reader = threading.Thread(target=self._read, name="summaryd-acks", daemon=True)
        self._reader.start()

    def _requests(self) -> Iterator[pb.WriteRequest]:
        while (request := self._outgoing.get()) is not None:
            yield request

    def send(self, request: pb.WriteRequest) -> None:
        self._outgoing.put(request)

    def _read(self) -> None:
        error: grpc.RpcError | None = None
        try:
            for ack in self.call:
                self._on_ack(ack.acked_sequence)
        except grpc.RpcError as exc:
            error = exc
        self.error = error
        self.ended = True
        self._on_end(self, error)

    def close(self, *, cancel: bool, timeout: float) -> None:
        """End the stream (half-close, or cancel) and wait for the ack thread."""
        self._outgoing.put(None)
        if cancel:
            self.call.cancel()
        self._reader.join(timeout)
        if self._reader.is_alive():
            self.call.cancel()
            self._reader.join(1.0)


_live_senders: weakref.WeakSet[Sender] = weakref.WeakSet()


class Sender:
    """Ships the events of one session (one run directory) to the daemon in the background.

    Args:
        run: run path under the daemon's logdir.
        address: `host:port` of the daemon; default `SUMMARYD_ADDRESS`, else `localhost:6065`.
        worker: worker label; the events land in `<run>/<worker>`. Empty for a single process.
        world_size: number of workers of the job (shown in status).
        max_queue_bytes: bound of the queue, in (estimated) bytes; beyond it new events are dropped and counted.
        max_batch_events, max_batch_bytes: the largest batch sent at once.
        linger_secs: how long a partial batch waits for more events before it is sent.
        rpc_timeout: deadline of each call, and how long a sent batch may wait for its ack.
        max_in_flight: batches sent but not yet acknowledged.
        close_timeout: default of `close(timeout=...)`, also used at interpreter exit.
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
    ) -> None:
        self.run = run
        self.address = resolve_address(address)
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
        self._init_state()
        _live_senders.add(self)

    def _init_state(self) -> None:
        """Everything that belongs to one process; a forked child builds it anew (never the parent's channel)."""
        self._pid = os.getpid()
        self.session_id = str(uuid.uuid4())
        self.run_dir: str | None = None
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._abandon = threading.Event()
        self._queue: deque[tuple[EventSource, int]] = deque()
        self._queued_bytes = 0
        self._accepted = 0
        self._settled = 0
        self._delivered = 0
        self._dropped: Counter[str] = Counter()
        self._unacked: deque[_Batch] = deque()
        self._next_sequence = 1
        self._acked = 0
        self._closing = False
        self._closed = False
        self._synced = False
        self._failed: str | None = None
        self._last_error: str | None = None
        self._last_warning = 0.0
        self._thread: threading.Thread | None = None
        self._channel: grpc.Channel | None = None
        self._stream: _Stream | None = None
        self._close_deadline = float("inf")

    # ---- the caller's side -------------------------------------------------------------------------------

    def submit(self, source: EventSource, nbytes: int = 64) -> bool:
        """Queue one event without blocking; False when it was dropped (counted and reported)."""
        if self._pid != os.getpid():
            self._init_state()
        with self._lock:
            if self._closing or self._failed is not None:
                self._dropped["closed" if self._closing else "rejected"] += 1
                return False
            if self._queued_bytes + nbytes > self.max_queue_bytes:
                self._dropped["queue_full"] += 1
                self._warn(f"queue full ({self.max_queue_bytes} bytes): dropping new events for run {self.run!r}")
                return False
            self._queue.append((source, nbytes))
            self._queued_bytes += nbytes
            self._accepted += 1
            full = len(self._queue) >= self.max_batch_events or self._queued_bytes >= self.max_batch_bytes
        if self._thread is None:
            self._start()
        elif full:
            self._wake.set()
        return True

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_warning > 10.0:
            self._last_warning = now
            log.warning(message)

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name=f"summaryd-sender[{self.run}]", daemon=True)
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
                return self._report_locked()
        self._wake.set()
        with self._cond:
            while self._settled < target and self._failed is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self._thread is not None and not self._thread.is_alive()):
                    break
                self._cond.wait(min(remaining, 0.1))
            done = self._settled >= target
        if durable and done and self._channel is not None:
            try:
                pb_grpc.SummariesStub(self._channel).Flush(
                    pb.FlushRequest(session_id=self.session_id, durable=True),
                    timeout=max(0.01, deadline - time.monotonic()),
                )
            except (grpc.RpcError, ValueError) as exc:
                self._note_error(exc)
        return self.report()

    def _report_locked(self) -> DeliveryReport:
        return DeliveryReport(
            delivered=self._delivered,
            undelivered=self._accepted - self._settled,
            dropped=dict(self._dropped),
            synced=self._synced,
            error=self._failed or self._last_error,
        )

    def close(self, timeout: float | None = None) -> DeliveryReport:
        """Deliver what is queued, have the daemon fsync it and release the session; safe to call twice.

        Returns within about `timeout` seconds (default `close_timeout`) whatever the daemon does; the report
        counts the events that could not be delivered.
        """
        if self._pid != os.getpid():
            self._init_state()
        timeout = self.close_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._closed:
                return self._report_locked()
            self._closing = True
            self._close_deadline = deadline
            thread = self._thread
            self._cond.notify_all()
        self._wake.set()
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                self._abandon.set()
                self._wake.set()
                if self._stream is not None:
                    self._stream.call.cancel()
                thread.join(1.0)
        with self._cond:
            self._closed = True
            undelivered = self._accepted - self._settled
            if undelivered:
                self._dropped["timeout"] += undelivered
                self._settled = self._accepted
                log.warning(
                    "summaryd: %d events for run %r were not delivered to %s (%s)",
                    undelivered,
                    self.run,
                    self.address,
                    self._failed or self._last_error or "timed out",
                )
            report = DeliveryReport(
                delivered=self._delivered,
                undelivered=undelivered,
                dropped=dict(self._dropped),
                synced=self._synced,
                error=self._failed or self._last_error,
            )
        _live_senders.discard(self)
        return report

    # ---- the sender thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._send_loop()
            self._finish()
        except Exception as exc:  # a bug here must not go unnoticed, nor reach the training loop
            log.exception("summaryd sender for run %r failed", self.run)
            with self._cond:
                self._failed = f"sender failed: {exc!r}"
        finally:
            if self._stream is not None:
                self._stream.close(cancel=True, timeout=1.0)
                self._stream = None
            if self._channel is not None:
                self._channel.close()
                self._channel = None
            with self._cond:
                self._cond.notify_all()

    def _send_loop(self) -> None:
        backoff = self.backoff_secs[0]
        while not self._abandon.is_set():
            with self._cond:
                if self._failed is not None:
                    return
                if self._closing and not self._queue and not self._unacked:
                    return
            if self._stream is None or self._stream.ended:
                if not self._connect():
                    self._abandon.wait(backoff)
                    backoff = min(backoff * 2, self.backoff_secs[1])
                    continue
                backoff = self.backoff_secs[0]
            stream = self._stream
            assert stream is not None
            with self._cond:
                waiting = len(self._queue) < self.max_batch_events and not self._closing
            if waiting:
                self._wake.wait(self.linger_secs)
                self._wake.clear()
            batch = self._take_batch()
            if batch is not None:
                batch.sent_at = time.monotonic()
                with self._cond:
                    self._unacked.append(batch)
                stream.send(
                    pb.WriteRequest(session_id=self.session_id, first_sequence=batch.first, events=batch.events)
                )
            with self._cond:
                while len(self._unacked) >= self.max_in_flight and not stream.ended and not self._abandon.is_set():
                    self._cond.wait(0.1)
                overdue = bool(self._unacked) and time.monotonic() - self._unacked[0].sent_at > self.rpc_timeout
            if overdue and not stream.ended:
                self._last_error = f"no acknowledgement within {self.rpc_timeout}s; reconnecting"
                stream.call.cancel()

    def _take_batch(self) -> _Batch | None:
        events: list[bytes] = []
        nbytes = 0
        while len(events) < self.max_batch_events and nbytes < self.max_batch_bytes:
            with self._lock:
                if not self._queue:
                    break
                source, estimate = self._queue.popleft()
                self._queued_bytes -= estimate
            if isinstance(source, bytes):
                data = source
            else:
                try:
                    data = source()
                except Exception as exc:
                    log.warning("summaryd: could not encode an event for run %r: %s", self.run, exc)
                    with self._cond:
                        self._dropped["encode_error"] += 1
                        self._settled += 1
                        self._cond.notify_all()
                    continue
            events.append(data)
            nbytes += len(data)
        if not events:
            return None
        with self._lock:
            batch = _Batch(self._next_sequence, events, nbytes)
            self._next_sequence += len(events)
        return batch

    def _connect(self) -> bool:
        """Open (or resume) the session and a new write stream, then resend what is unacknowledged."""
        if self._stream is not None:
            self._stream.close(cancel=True, timeout=1.0)
            self._stream = None
        if self._channel is None:
            self._channel = grpc.insecure_channel(
                self.address, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]
            )
        stub = pb_grpc.SummariesStub(self._channel)
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
        try:
            # A future, so that an abandoning close() is not held up by a daemon that never answers.
            future = stub.OpenSession.future(request, timeout=self.rpc_timeout)
            while not future.done():
                if self._abandon.wait(0.05):
                    future.cancel()
                    return False
            answer = future.result()
        except grpc.FutureCancelledError:
            return False
        except grpc.RpcError as exc:
            self._note_error(exc)
            if exc.code() in _PERMANENT or exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                self._give_up(f"{exc.code().name}: {exc.details()}")
            return False
        self.run_dir = answer.run_dir
        self._on_ack(answer.last_sequence)
        self._stream = _Stream(stub, self._on_ack, self._on_stream_end)
        with self._cond:
            pending = list(self._unacked)
        now = time.monotonic()
        for batch in pending:
            batch.sent_at = now
            self._stream.send(
                pb.WriteRequest(session_id=self.session_id, first_sequence=batch.first, events=batch.events)
            )
        return True

    def _on_ack(self, acked: int) -> None:
        with self._cond:
            if acked <= self._acked:
                return
            self._acked = acked
            while self._unacked and self._unacked[0].last <= acked:
                batch = self._unacked.popleft()
                self._delivered += len(batch.events)
                self._settled += len(batch.events)
            if self._unacked and self._unacked[0].first <= acked:
                # The daemon holds the head of this batch already (it was cut short before).
                batch = self._unacked[0]
                done = acked - batch.first + 1
                del batch.events[:done]
                batch.first = acked + 1
                self._delivered += done
                self._settled += done
            self._cond.notify_all()

    def _on_stream_end(self, stream: _Stream, error: grpc.RpcError | None) -> None:
        if error is None or (error.code() == grpc.StatusCode.CANCELLED and self._abandon.is_set()):
            self._wake.set()
            return
        self._note_error(error)
        if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
            # The daemon refused the oldest unacknowledged batch and wrote none of it: drop it (the data
            # itself is bad, a resend cannot help) and number the rest on from the last acknowledged event.
            with self._cond:
                if self._unacked:
                    bad = self._unacked.popleft()
                    self._dropped["rejected"] += len(bad.events)
                    self._settled += len(bad.events)
                    log.error(
                        "summaryd: the daemon refused %d events of run %r: %s",
                        len(bad.events),
                        self.run,
                        error.details(),
                    )
                sequence = self._acked + 1
                for batch in self._unacked:
                    batch.first = sequence
                    sequence += len(batch.events)
                self._next_sequence = sequence
                self._cond.notify_all()
        self._wake.set()

    def _note_error(self, exc: BaseException) -> None:
        if isinstance(exc, grpc.RpcError):
            code = exc.code()
            text = f"{code.name}: {exc.details()}"
        else:
            text = repr(exc)
        self._last_error = text
        self._warn(f"summaryd: daemon at {self.address} for run {self.run!r}: {text}")

    def _give_up(self, reason: str) -> None:
        """A permanent refusal (bad run path, no permission): drop everything, report it on close."""
        log.error("summaryd: giving up on run %r: %s", self.run, reason)
        with self._cond:
            self._failed = reason
            dropped = len(self._queue) + sum(len(b.events) for b in self._unacked)
            self._dropped["rejected"] += dropped
            self._settled += dropped
            self._queue.clear()
            self._queued_bytes = 0
            self._unacked.clear()
            self._cond.notify_all()

    def _finish(self) -> None:
        """After the last ack of a closing sender: end the stream and close the session (the daemon fsyncs)."""
        if not self._closing or self._failed is not None or self._abandon.is_set():
            return
        if self._stream is not None:
            self._stream.close(cancel=False, timeout=max(0.0, self._close_deadline - time.monotonic()))
            self._stream = None
        if self._channel is None:
            return
        try:
            pb_grpc.SummariesStub(self._channel).CloseSession(
                pb.CloseSessionRequest(session_id=self.session_id),
                timeout=max(0.01, self._close_deadline - time.monotonic()),
            )
            with self._cond:
                self._synced = True
        except grpc.RpcError as exc:
            self._note_error(exc)


@atexit.register
def _close_at_exit() -> None:
    """Deliver what was logged when the program ends without `close()`."""
    for sender in list(_live_senders):
        if sender._pid == os.getpid():
            sender.close()
