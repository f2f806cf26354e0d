"""A relay's link to its upstream under load: batches that come while a message is being written upstream ride
in the next message, so the upstream never has more than one of the relay's messages waiting (it takes a
stream's messages one at a time) and its messages grow rather than queue.

The upstream here is a servicer of the test's own that holds each answer for a while: a slow owner (a disk
that stalls, a CPU taken by others) cannot be made on demand, and the test needs to see what arrives while
it is slow. Everything else is real: gRPC over loopback, the relay's `UpstreamLink`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc import aio

from summaryd.server.relay.upstream import MAX_UNANSWERED, Ended, UpstreamLink
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

SESSIONS = 8
BATCHES = 40  # per session
ANSWER_AFTER = 0.05  # seconds the slow upstream takes for each message


class SlowUpstream(pb_grpc.SummariesServicer):
    """Acks each batch of a `Relay` message after `ANSWER_AFTER`, and notes how many messages had arrived
    unanswered at once."""

    def __init__(self) -> None:
        self.messages: list[int] = []  # batches per message
        self.most_unanswered = 0
        self._unanswered = 0

    async def Relay(self, request_iterator: AsyncIterator[pb.RelayRequest], context: Any) -> AsyncIterator[pb.RelayAck]:
        pending: asyncio.Queue[pb.RelayRequest | None] = asyncio.Queue()

        async def read() -> None:  # reads ahead, to see every message the relay sent before an answer
            async for request in request_iterator:
                self._unanswered += 1
                self.most_unanswered = max(self.most_unanswered, self._unanswered)
                pending.put_nowait(request)
            pending.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (request := await pending.get()) is not None:
                await asyncio.sleep(ANSWER_AFTER)
                self.messages.append(len(request.batches))
                answer = pb.RelayAck()
                for batch in request.batches:
                    ack = answer.acks.add(session_id=batch.write.session_id)
                    ack.ack.acked_sequence = batch.write.first_sequence
                self._unanswered -= 1
                yield answer
        finally:
            reader.cancel()


async def test_batches_that_come_while_the_upstream_writes_ride_in_one_next_message() -> None:
    upstream = SlowUpstream()
    server = aio.server()
    pb_grpc.add_SummariesServicer_to_server(upstream, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    link = UpstreamLink(f"127.0.0.1:{port}")
    acked: dict[str, list[int]] = {f"s{i}": [] for i in range(SESSIONS)}
    ended: list[Ended] = []

    def delivery(session_id: str) -> Any:
        def deliver(item: pb.WriteAck | Ended) -> None:
            if isinstance(item, Ended):
                ended.append(item)
            else:
                acked[session_id].append(item.acked_sequence)

        return deliver

    try:
        for session_id in acked:
            link.attach(session_id, delivery(session_id))
        for sequence in range(1, BATCHES + 1):  # every session a batch each 10 ms: faster than it is answered
            for session_id in acked:
                link.send(session_id, pb.WriteRequest(session_id=session_id, first_sequence=sequence), "")
            await asyncio.sleep(0.01)
        async with asyncio.timeout(30):
            while sum(map(len, acked.values())) < SESSIONS * BATCHES and not ended:
                await asyncio.sleep(0.01)
        assert not ended, ended
    finally:
        await link.close()
        await server.stop(None)

    # Each session's batches answered once each, in order.
    assert all(sequences == list(range(1, BATCHES + 1)) for sequences in acked.values()), acked
    assert upstream.most_unanswered == MAX_UNANSWERED == 1
    # 320 batches sent over 0.4 s, a message answered each 50 ms: some ten messages, not one per 5 ms gathered.
    assert sum(upstream.messages) == SESSIONS * BATCHES
    assert len(upstream.messages) <= 15, upstream.messages
    assert max(upstream.messages) >= 3 * SESSIONS, upstream.messages


async def test_a_stream_that_ends_fails_its_sessions_with_a_status_to_resume_on() -> None:
    """A link whose upstream is gone ends each attached session with UNAVAILABLE (the client resumes)."""
    link = UpstreamLink("127.0.0.1:1")  # nothing listens on port 1
    ended: list[pb.WriteAck | Ended] = []
    try:
        link.attach("s", ended.append)
        link.send("s", pb.WriteRequest(session_id="s", first_sequence=1), "")
        async with asyncio.timeout(30):
            while not ended:
                await asyncio.sleep(0.01)
    finally:
        await link.close()
    [end] = ended
    assert isinstance(end, Ended) and end.code == grpc.StatusCode.UNAVAILABLE, end
