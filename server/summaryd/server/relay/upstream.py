"""The relay's streams to its upstream daemons: one `Relay` stream per daemon carries the batches of every
session the relay sends there, many sessions' batches in one message, and hands each ack to its session.

Nothing here is durable: a batch is the client's until the upstream acks it, and a stream that ends fails every
session on it (their clients resume them, resending what was not acked, exactly once by sequence numbers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc import aio

from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import REFUSED_SEQUENCE_KEY

log = logging.getLogger(__name__)

GATHER_SECONDS = 0.005
"""How long a message to the upstream waits for more batches once one is there: a few milliseconds against a
client's linger of 50 ms or more, for many sessions' batches in one message (the daemon's cost is per message)."""

MAX_UNANSWERED = 1
"""Messages sent upstream and not yet answered, at most. The daemon takes a stream's messages one at a time
(each session's batches in order), so a message sent while another is being written only waits behind it: the
batches that come meanwhile go as one message once it is answered. Under load the messages grow rather than
queue, and a message costs the daemon one pass however many batches it holds."""

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""A message to the upstream is sent once its batches reach this many bytes (its limit is 64 MiB by default)."""

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


@dataclass(frozen=True)
class Ended:
    """What ends a relayed session's stream: the upstream's status for it, and its trailing metadata."""

    code: grpc.StatusCode
    message: str
    metadata: tuple[tuple[str, str], ...] = ()


Delivery = Callable[["pb.WriteAck | Ended"], None]
"""Where a session's acks go, and finally why its stream ended."""

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class UpstreamLink:
    """One upstream daemon: its channel and the `Relay` stream over it (opened when a session first needs it,
    again after it ended), the batches waiting to go, and the sessions whose acks it hands on."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = pb_grpc.SummariesStub(self.channel)
        self._sessions: dict[str, Delivery] = {}
        self._introduced: set[str] = set()  # sessions whose token the current stream has had
        self._waiting: list[pb.RelayBatch] = []
        self._waiting_bytes = 0
        self._ready = asyncio.Event()
        self._unanswered = 0  # messages of the current stream sent and not yet answered
        self._task: asyncio.Task[None] | None = None
        self.messages = 0  # messages sent upstream, for the benchmark and status

    def attach(self, session_id: str, deliver: Delivery) -> None:
        """Send the session's acks to `deliver` from now on (a client's newer stream replaces an older one)."""
        old = self._sessions.get(session_id)
        self._sessions[session_id] = deliver
        if old is not None and old is not deliver:
            old(Ended(grpc.StatusCode.CANCELLED, "a newer stream of the session took over"))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    def detach(self, session_id: str, deliver: Delivery) -> None:
        if self._sessions.get(session_id) is deliver:
            del self._sessions[session_id]

    def send(self, session_id: str, request: pb.WriteRequest, authorization: str) -> None:
        """Queue one batch of an attached session for the next message; its token goes with its first batch
        on the stream."""
        batch = pb.RelayBatch(write=request)
        if session_id not in self._introduced:
            self._introduced.add(session_id)
            batch.authorization = authorization
        self._waiting.append(batch)
        self._waiting_bytes += request.ByteSize()
        self._ready.set()

    async def _run(self) -> None:
        """Keep the stream while sessions are attached; when it ends, end each of them with its reason."""
        reason = Ended(grpc.StatusCode.UNAVAILABLE, f"the relay lost its stream to {self.address}; resume")
        call = self.stub.Relay()
        self._introduced.clear()
        self._unanswered = 0
        reader = asyncio.create_task(self._read(call))
        reader.add_done_callback(lambda _: self._ready.set())
        try:
            while True:
                await self._ready.wait()
                if reader.done():
                    break
                if self._unanswered >= MAX_UNANSWERED:
                    self._ready.clear()  # an answer sets it again
                    continue
                if self._waiting_bytes < MAX_MESSAGE_BYTES:
                    await asyncio.sleep(GATHER_SECONDS)
                batches, self._waiting, self._waiting_bytes = self._waiting, [], 0
                self._ready.clear()
                if batches:
                    self._unanswered += 1
                    await call.write(pb.RelayRequest(batches=batches))
                    self.messages += 1
        except grpc.RpcError as exc:
            reason = _ended(exc, self.address)
        except asyncio.CancelledError:
            reason = Ended(grpc.StatusCode.UNAVAILABLE, "the relay is shutting down; resume")
            raise
        except Exception:
            log.exception("relay stream to %s failed", self.address)
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            call.cancel()
            self._fail_all(reader_reason(reader) or reason)

    async def _read(self, call: aio.StreamStreamCall[pb.RelayRequest, pb.RelayAck]) -> None:
        async for answer in call:
            self._unanswered = max(0, self._unanswered - 1)
            if self._waiting:
                self._ready.set()
            for ack in answer.acks:
                deliver = self._sessions.get(ack.session_id)
                if deliver is None:
                    continue
                if ack.code:
                    self._introduced.discard(ack.session_id)
                    metadata = ((REFUSED_SEQUENCE_KEY, str(ack.refused_sequence)),) if ack.refused_sequence else ()
                    deliver(Ended(_CODES.get(ack.code, grpc.StatusCode.UNKNOWN), ack.message, metadata))
                else:
                    deliver(ack.ack)
        raise _StreamEndedError(Ended(grpc.StatusCode.UNAVAILABLE, f"the daemon at {self.address} ended the stream"))

    def _fail_all(self, reason: Ended) -> None:
        sessions, self._sessions = self._sessions, {}
        self._waiting, self._waiting_bytes = [], 0
        self._ready.clear()
        for deliver in sessions.values():
            deliver(reason)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.channel.close(None)


class _StreamEndedError(Exception):
    def __init__(self, reason: Ended) -> None:
        super().__init__(reason.message)
        self.reason = reason


def reader_reason(reader: asyncio.Task[None]) -> Ended | None:
    """Why the reader of a stream stopped, when it did: the end the upstream gave."""
    if not reader.done() or reader.cancelled():
        return None
    exc = reader.exception()
    if isinstance(exc, _StreamEndedError):
        return exc.reason
    if isinstance(exc, aio.AioRpcError):
        return _ended(exc, "")
    return None


def _ended(exc: grpc.RpcError, address: str) -> Ended:
    code = exc.code() if isinstance(exc, aio.AioRpcError) else grpc.StatusCode.UNAVAILABLE
    if code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
        code = grpc.StatusCode.UNAVAILABLE  # the stream broke: the client resumes
    details = exc.details() if isinstance(exc, aio.AioRpcError) else str(exc)
    return Ended(code, f"upstream {address}: {details}".replace("upstream : ", "upstream: "))
