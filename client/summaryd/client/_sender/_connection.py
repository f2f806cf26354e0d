"""The session with the daemon: opening (and resuming) it, the write stream, heartbeats, closing it."""

from __future__ import annotations

import os
import socket
import time

import grpc

from summaryd.client import _process
from summaryd.client._batch_fit import DaemonLimits
from summaryd.client._channel import open_channel
from summaryd.client._sender._spilling import Spilling
from summaryd.client._sender._state import log
from summaryd.client._stream import WriteStream
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import REFUSED_SEQUENCE_KEY, VERSION

# Statuses after which retrying the same request cannot succeed.
_PERMANENT = frozenset(
    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED}
)


class Connection(Spilling):
    """Keeps one session and write stream open to the daemon, and sends the log over it. Sender thread only."""

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
            session_started=self.session_started,
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
        if self._error_passing:  # overcome: not the error of what is now delivered
            self._last_error = None
            self._error_passing = False
            if self._warned.pop("daemon", None) is not None:
                # The user was told the daemon was away: say it is back, and what becomes of the spool.
                spooled = f"; sending the {self._spooled} spooled events" if self._spooled else ""
                log.warning("summaryd: daemon at %s answers again for run %r%s", self.address, self.run, spooled)

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

    def _on_stream_end(self, stream: WriteStream, error: grpc.RpcError | None) -> None:
        if error is None or (error.code() == grpc.StatusCode.CANCELLED and self._abandon.is_set()):
            self._wake.set()
            return
        self._note_error(error)
        if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
            sequence = refused_sequence(error)
            with self._cond:
                self._refused = error.details()
                self._refused_sequence = sequence
        self._wake.set()

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
            # Cut again to the daemon's limits: a spooled batch, or one made before they shrank, may be over them.
            first = batch.first
            for part in self._daemon_limits.split(events, batch.nbytes, self.session_id):
                stream.send(pb.WriteRequest(session_id=self.session_id, first_sequence=first, events=part))
                first += len(part)
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
            self._error_passing = True
            stream.call.cancel()
        elif now - self._last_sent >= self._heartbeat_interval():
            self._last_sent = now
            stream.send(pb.WriteRequest(session_id=self.session_id))

    def _heartbeat_interval(self) -> float:
        return min(self.heartbeat_secs, self._lease / 3)

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


def refused_sequence(error: grpc.RpcError) -> int | None:
    """The sequence number of the event a daemon refused, from the trailing metadata of its INVALID_ARGUMENT."""
    trailing = getattr(error, "trailing_metadata", None)
    for key, value in (trailing() if callable(trailing) else None) or ():
        if key == REFUSED_SEQUENCE_KEY:
            try:
                return int(value)
            except (TypeError, ValueError):
                return None
    return None
