"""The relay's `Summaries` servicer (`summaryd serve --upstream`): what its clients call, forwarded to the
upstream daemon that holds each session's run.

Unary calls go upstream as they came, with their client's token. A client's write stream is one session among
many on the relay's `Relay` stream to that daemon (`UpstreamLink`); its acks come back as the upstream gave
them, so the client keeps every batch until the daemon that writes it acknowledged it. A redirect (the run is
written by another daemon) is followed only to an address of `--upstream`: a token goes only where the user
pointed the relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, cast

import grpc
from grpc import aio

from summaryd.server.relay.upstream import Ended, UpstreamLink
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import OWNER_ADDRESS_KEY, REFUSED_SEQUENCE_KEY, address_key

log = logging.getLogger(__name__)

Context = aio.ServicerContext[Any, Any]
Answer = TypeVar("Answer")

RPC_TIMEOUT = 30.0
"""The longest a forwarded unary call waits for the upstream when its client set no deadline."""


class Upstreams:
    """The daemons of `--upstream`, a link to each (made when first used), and where each session went."""

    def __init__(self, addresses: tuple[str, ...]) -> None:
        if not addresses:
            raise ValueError("a relay needs at least one --upstream address")
        self.addresses = addresses
        self._links: dict[str, UpstreamLink] = {}
        self.session_homes: dict[str, str] = {}  # session id -> address: in memory only, re-learnt at each open
        self.run_homes: dict[str, str] = {}  # run -> the address that took its last session

    def link(self, address: str) -> UpstreamLink:
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = UpstreamLink(address)
        return link

    def given(self, address: str) -> str | None:
        """`address` when it is one of `--upstream` (a redirect goes nowhere else)."""
        wanted = address_key(address)
        return next((a for a in self.addresses if address_key(a) == wanted), None)

    def after(self, address: str) -> str:
        """The configured daemon after `address` (the first after the last)."""
        index = self.addresses.index(address) if address in self.addresses else -1
        return self.addresses[(index + 1) % len(self.addresses)]

    @property
    def messages(self) -> int:
        return sum(link.messages for link in self._links.values())

    async def close(self) -> None:
        for link in list(self._links.values()):
            await link.close()


def _metadata(context: Context) -> tuple[tuple[str, str], ...]:
    """What of a client's call metadata goes upstream: its token."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str):
            return (("authorization", value),)
    return ()


def _authorization(context: Context) -> str:
    return next((value for _, value in _metadata(context)), "")


def _passed_on(exc: aio.AioRpcError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """An upstream's refusal as the relay answers its client: the same status and message; of the trailing
    metadata only the refused sequence number (a redirect was the relay's to follow)."""
    kept = tuple((k, str(v)) for k, v in _trailing(exc) if k == REFUSED_SEQUENCE_KEY)
    return exc.code(), exc.details() or "", kept


class RelayService(pb_grpc.SummariesServicer):
    """Forwards every call of the relay's clients to their runs' upstream daemons; holds nothing durable."""

    def __init__(self, upstreams: Upstreams) -> None:
        self.upstreams = upstreams
        self._draining = False

    def start_draining(self) -> None:
        self._draining = True

    async def OpenSession(self, request: pb.OpenSessionRequest, context: Context) -> pb.OpenSessionResponse:
        if self._draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the relay is shutting down; retry later")
        upstreams = self.upstreams
        address = upstreams.run_homes.get(request.run) or upstreams.addresses[0]
        metadata = _metadata(context)
        # Each configured daemon once, and a redirect to each: two daemons naming each other end here.
        for _ in range(2 * len(upstreams.addresses)):
            try:
                answer: pb.OpenSessionResponse = await upstreams.link(address).stub.OpenSession(
                    request, metadata=metadata, timeout=_timeout(context)
                )
            except aio.AioRpcError as exc:
                owner = _owner(exc)
                if owner is not None:
                    given = upstreams.given(owner)
                    if given is None:
                        log.warning(
                            "the daemon at %s sends run %r to %r, not an --upstream address: not followed",
                            address,
                            request.run,
                            owner[:200],
                        )
                        await context.abort(
                            grpc.StatusCode.UNAVAILABLE,
                            f"the daemon at {address} sends this run to {owner[:200]!r}, which is not one of the "
                            "relay's --upstream addresses: not followed, and no token sent there",
                        )
                    address = given
                    continue
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    address = upstreams.after(address)
                    continue
                await context.abort(*_passed_on(exc)[:2], trailing_metadata=_passed_on(exc)[2])
            upstreams.session_homes[request.session_id] = address
            upstreams.run_homes[request.run] = address
            return answer
        await context.abort(grpc.StatusCode.UNAVAILABLE, "no --upstream daemon of the relay takes the session now")
        raise AssertionError("abort raises")

    async def Write(
        self, request_iterator: AsyncIterator[pb.WriteRequest], context: Context
    ) -> AsyncIterator[pb.WriteAck]:
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None:
            return
        session_id = first.session_id
        address = self.upstreams.session_homes.get(session_id)
        if address is None:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the relay does not know this session: open it through the relay again"
            )
            return
        link = self.upstreams.link(address)
        inbox: asyncio.Queue[pb.WriteAck | Ended | None] = asyncio.Queue()
        deliver = inbox.put_nowait
        authorization = _authorization(context)
        unanswered = 0

        async def forward() -> None:
            nonlocal unanswered
            request: pb.WriteRequest | None = first
            try:
                while request is not None:
                    request.session_id = session_id
                    unanswered += 1
                    link.send(session_id, request, authorization)
                    request = await anext(requests, None)
            except Exception as exc:  # the client's stream broke: end ours
                inbox.put_nowait(Ended(grpc.StatusCode.CANCELLED, repr(exc)))
                return
            inbox.put_nowait(None)  # the client half-closed: end once every batch is answered

        link.attach(session_id, deliver)
        forwarder = asyncio.create_task(forward())
        half_closed = False
        try:
            while True:
                item = await inbox.get()
                if item is None:
                    half_closed = True
                elif isinstance(item, Ended):
                    await context.abort(item.code, item.message, trailing_metadata=item.metadata)
                else:
                    unanswered -= 1
                    yield item
                if half_closed and unanswered <= 0:
                    return
                if self._draining and unanswered <= 0:
                    return
        finally:
            forwarder.cancel()
            with contextlib.suppress(BaseException):
                await forwarder
            link.detach(session_id, deliver)

    async def Flush(self, request: pb.FlushRequest, context: Context) -> pb.FlushResponse:
        link = self._home(request.session_id)
        return await _forwarded(link.stub.Flush, request, context)

    async def CloseSession(self, request: pb.CloseSessionRequest, context: Context) -> pb.CloseSessionResponse:
        link = self._home(request.session_id)
        answer: pb.CloseSessionResponse = await _forwarded(link.stub.CloseSession, request, context)
        self.upstreams.session_homes.pop(request.session_id, None)
        return answer

    async def PutFile(self, request: pb.PutFileRequest, context: Context) -> pb.PutFileResponse:
        return await _forwarded(self._home(request.session_id).stub.PutFile, request, context)

    async def GetStatus(self, request: pb.GetStatusRequest, context: Context) -> pb.GetStatusResponse:
        """The status of the first upstream daemon (a relay has no runs of its own)."""
        return await _forwarded(self.upstreams.link(self.upstreams.addresses[0]).stub.GetStatus, request, context)

    def _home(self, session_id: str) -> UpstreamLink:
        upstreams = self.upstreams
        return upstreams.link(upstreams.session_homes.get(session_id) or upstreams.addresses[0])


async def _forwarded(call: Callable[..., Awaitable[Answer]], request: Any, context: Context) -> Answer:
    """`call` upstream with the client's token, its refusal passed on as the client's."""
    try:
        return await call(request, metadata=_metadata(context), timeout=_timeout(context))
    except aio.AioRpcError as exc:
        code, message, metadata = _passed_on(exc)
        await context.abort(code, message, trailing_metadata=metadata)
        raise AssertionError("abort raises") from None


def _timeout(context: Context) -> float:
    remaining = context.time_remaining()
    return RPC_TIMEOUT if remaining is None else max(0.0, remaining)


def _owner(exc: aio.AioRpcError) -> str | None:
    if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
        return None
    for key, value in _trailing(exc):
        if key == OWNER_ADDRESS_KEY:
            return str(value) or None
    return None


def _trailing(exc: aio.AioRpcError) -> list[tuple[str, str | bytes]]:
    return [(str(key), value) for key, value in cast(Any, exc.trailing_metadata() or ())]
