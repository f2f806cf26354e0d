"""The gRPC `Transport`: one channel to the daemon of the moment, a `Write` stream per connection, unary calls
otherwise.

Of several daemons (`ClientOptions.addresses`) it talks to one at a time: a session that cannot be opened
because the daemon is away moves it to the next, and a daemon that refuses the session because another daemon
writes the run (FAILED_PRECONDITION with `OWNER_ADDRESS_KEY`) moves it there, when that is an address the
client was given (`DaemonTargets`); a redirect anywhere else is refused, reported, and the next configured
daemon tried instead. Either way the sender opens the same session again at once (the `away` it is told),
resuming from what the daemon holds.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence

import grpc

from summaryd.client._channel import open_channel
from summaryd.client._options import ClientOptions
from summaryd.client._process import _fork
from summaryd.client._sender._batch_fit import DaemonLimits
from summaryd.client._sender._columns import ScalarRun
from summaryd.client._sender._stream import WriteStream
from summaryd.client._sender._targets import DaemonTargets, RedirectRefusedError
from summaryd.client._sender._transport import Ack, ErrorKind, Hello, Opened, TransportError
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import OWNER_ADDRESS_KEY, REFUSED_SEQUENCE_KEY, VERSION

# Trailing metadata of a refused batch: the sequence number of the event the daemon refused (see the proto).

_KINDS: dict[grpc.StatusCode, ErrorKind] = {
    grpc.StatusCode.UNAVAILABLE: "away",
    grpc.StatusCode.DEADLINE_EXCEEDED: "away",
    grpc.StatusCode.CANCELLED: "cancelled",
    grpc.StatusCode.INVALID_ARGUMENT: "refused",
    grpc.StatusCode.PERMISSION_DENIED: "denied",
    grpc.StatusCode.UNAUTHENTICATED: "denied",
    grpc.StatusCode.FAILED_PRECONDITION: "denied",
}


def transport_error(exc: grpc.RpcError) -> TransportError:
    """What a failed call means to the sender."""
    kind = _KINDS.get(exc.code(), "failed")
    sequence = refused_sequence(exc) if kind == "refused" else None
    details = exc.details() or ""
    return TransportError(kind, f"{exc.code().name}: {details}", details=details, refused_sequence=sequence)


def refused_sequence(error: grpc.RpcError) -> int | None:
    """The sequence number of the event a daemon refused, from the trailing metadata of its INVALID_ARGUMENT."""
    value = _trailing(error, REFUSED_SEQUENCE_KEY)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def owner_address(error: grpc.RpcError) -> str | None:
    """Where the run's owner is, from the trailing metadata of an OpenSession refused for that reason."""
    if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
        return None
    return _trailing(error, OWNER_ADDRESS_KEY) or None


def _trailing(error: grpc.RpcError, wanted: str) -> str | None:
    trailing = getattr(error, "trailing_metadata", None)
    for key, value in (trailing() if callable(trailing) else None) or ():
        if key == wanted:
            return str(value)
    return None


class _Opening:
    def __init__(
        self,
        future: grpc.Future[pb.OpenSessionResponse],
        on_error: Callable[[grpc.RpcError], TransportError],
    ) -> None:
        self._future = future
        self._on_error = on_error

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> Opened | None:
        try:
            answer = self._future.result()
        except grpc.RpcError as exc:
            raise self._on_error(exc) from None
        except grpc.FutureCancelledError:
            return None
        return Opened(
            answer.run_dir,
            answer.last_sequence,
            answer.lease_seconds,
            DaemonLimits.of(answer),
            durable_acks=answer.durable_acks,
            durable_sequence=answer.durable_sequence,
            pacing=(answer.pacing.linger_seconds, answer.pacing.max_in_flight),
        )

    def cancel(self) -> None:
        self._future.cancel()


class _Stream:
    def __init__(
        self,
        stub: pb_grpc.SummariesStub,
        session_id: str,
        on_ack: Callable[[Ack], None],
        on_end: Callable[[TransportError | None], None],
    ) -> None:
        self._session_id = session_id
        self._on_ack = on_ack
        self._on_end = on_end
        self._stream = WriteStream(stub, self._acked, self._ended)

    def _acked(self, ack: pb.WriteAck) -> None:
        pacing = (ack.pacing.linger_seconds, ack.pacing.max_in_flight) if ack.HasField("pacing") else None
        self._on_ack(Ack(ack.acked_sequence, ack.durable_sequence, pacing))

    def _ended(self, _: WriteStream, error: grpc.RpcError | None) -> None:
        self._on_end(None if error is None else transport_error(error))

    @property
    def ended(self) -> bool:
        return self._stream.ended

    @property
    def failed(self) -> bool:
        return self._stream.error is not None

    def write(self, first_sequence: int, events: Sequence[bytes]) -> None:
        self._stream.send(pb.WriteRequest(session_id=self._session_id, first_sequence=first_sequence, events=events))

    def write_scalars(self, first_sequence: int, scalars: ScalarRun, fixed_steps: bool = False) -> None:
        request = pb.WriteRequest(session_id=self._session_id, first_sequence=first_sequence)
        scalars.fill(request.scalars, fixed_steps)
        self._stream.send(request)

    def heartbeat(self) -> None:
        self._stream.send(pb.WriteRequest(session_id=self._session_id))

    def cancel(self) -> None:
        self._stream.call.cancel()

    def close(self, *, cancel: bool, timeout: float) -> None:
        self._stream.close(cancel=cancel, timeout=timeout)


class GrpcTransport:
    """Talks to one daemon of the options at a time over one channel, opened on first use."""

    def __init__(self, options: ClientOptions) -> None:
        self._options = options
        self._targets = DaemonTargets(options.addresses, options.redirect_allow)
        self._channel: grpc.Channel | None = None
        # The calls under way, which a forked child must never free (they belong to the parent's channel).
        self._opening: grpc.Future[pb.OpenSessionResponse] | None = None
        self._stream: _Stream | None = None

    @property
    def address(self) -> str:
        return self._targets.current

    def _stub(self) -> pb_grpc.SummariesStub:
        if self._channel is None:
            _fork.note_grpc_used()
            self._channel = open_channel(self._targets.current, self._options.channel)
        return pb_grpc.SummariesStub(self._channel)

    def _open_failed(self, exc: grpc.RpcError) -> TransportError:
        """Sender thread: what a refused or failed OpenSession means, having moved to another daemon if that
        is the answer (the sender opens the session again at once; no stream is open meanwhile)."""
        error, left = transport_error(exc), self._targets.current
        owner = owner_address(exc)
        if owner is not None:
            try:
                moved = self._targets.redirect(owner)
            except RedirectRefusedError as refused:
                # Reported (the connection warns at a limited rate, and it is the report's error while it
                # explains what is not delivered); the configured daemons are tried on, this one again last.
                if self._targets.move_on():
                    self._drop_channel()
                return TransportError(
                    "away",
                    f"{refused}; going on with the configured daemons ({self._targets.current} next)",
                    answered=True,
                )
            if moved:
                self._drop_channel()
            text = f"the daemon at {left} says the run is written by {owner}; moving there"
            return TransportError("away", text, redirected=moved, answered=True)
        if error.kind == "away" and self._targets.move_on():
            self._drop_channel()
            return TransportError("away", f"{error.text} (at {left}); moving to {self._targets.current}")
        return error

    def _drop_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def open_session(self, hello: Hello, on_done: Callable[[], None]) -> _Opening:
        identity = hello.identity
        request = pb.OpenSessionRequest(
            session_id=identity.session_id,
            run=identity.run,
            worker=identity.worker,
            world_size=identity.world_size,
            client=pb.ClientIdentity(
                host=socket.gethostname(), pid=os.getpid(), framework=identity.framework, version=VERSION
            ),
            next_sequence=hello.next_sequence,
            session_started=identity.session_started,
            aggregate_off=identity.aggregate is False,
            aggregate_tags=identity.aggregate if isinstance(identity.aggregate, tuple) else (),
        )
        future = self._stub().OpenSession.future(request, timeout=self._options.rpc_timeout)
        self._opening = future
        future.add_done_callback(lambda _: on_done())
        return _Opening(future, self._open_failed)

    def open_stream(
        self,
        session_id: str,
        on_ack: Callable[[Ack], None],
        on_end: Callable[[TransportError | None], None],
    ) -> _Stream:
        stream = _Stream(self._stub(), session_id, on_ack, on_end)
        self._stream = stream
        return stream

    def close_session(self, session_id: str, timeout: float, stop: Callable[[float], bool]) -> bool:
        future = self._stub().CloseSession.future(pb.CloseSessionRequest(session_id=session_id), timeout=timeout)
        while not future.done():
            if stop(0.02):
                future.cancel()
        try:
            future.result()
        except grpc.RpcError as exc:
            raise transport_error(exc) from None
        except grpc.FutureCancelledError:
            return False
        return True

    def flush(self, session_id: str, timeout: float) -> int:
        channel = self._channel
        if channel is None:
            return 0
        try:
            answer = pb_grpc.SummariesStub(channel).Flush(
                pb.FlushRequest(session_id=session_id, durable=True), timeout=timeout
            )
            return int(answer.acked_sequence)
        except grpc.RpcError as exc:
            raise transport_error(exc) from None
        except ValueError as exc:  # the channel was closed meanwhile
            raise TransportError("failed", repr(exc)) from None

    def close(self) -> None:
        self._opening = self._stream = None
        self._drop_channel()

    def leave_to_parent(self) -> None:
        _fork.keep_forever(self._channel, self._stream, self._opening)
