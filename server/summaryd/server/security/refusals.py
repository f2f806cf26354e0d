"""Requests the daemon refuses: each is answered with one clear status and logged, at a limited rate, in one line.

gRPC's aio server parses every request with its handler's `request_deserializer` before (unary calls) or
while (streams) the servicer runs; bytes that do not parse raise there, and gRPC answers `UNKNOWN` and logs an
ERROR traceback for every such message. `RefusalInterceptor`, the outermost interceptor, gives every handler a
deserializer that never raises (it returns `Unparsed` instead) and answers an `Unparsed` request with
`INVALID_ARGUMENT` before any inner layer (other interceptors, the servicer) sees it. It also logs what the
daemon refuses because of what a client sent (`INVALID_ARGUMENT`, `RESOURCE_EXHAUSTED`, `UNAUTHENTICATED`,
`PERMISSION_DENIED`) as one WARNING line per method and status at most every few seconds, saying how many more
were left out.

A raise the servicer does not answer itself would reach the client as gRPC's `UNKNOWN` with the exception's
text (`Unexpected <class ...>: ...`), which may name the store's URL, a bucket key or a path of the state
directory: the interceptor answers it `UNKNOWN` with one line naming only the exception's class, and the daemon's
log keeps the traceback.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from summaryd.server.operations.logs import Throttle

log = logging.getLogger("summaryd.server.refusals")  # the name log lines carry, kept across moves

# grpc-stubs type method handlers for the synchronous server only; the aio ones are used untyped.
Handler = Any
Context = aio.ServicerContext[Any, Any]

LOGGED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        # A caller without a valid token, or reaching beyond its prefixes: what an operator must be able to see.
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)
"""Statuses that say a client sent something the daemon will not take; each is logged (throttled)."""


class Unparsed:
    """A request whose bytes did not parse as the method's request message."""

    __slots__ = ("reason", "size")

    def __init__(self, size: int, reason: str) -> None:
        self.size = size
        self.reason = reason


def unparsed_problem(request: Unparsed, method: str, message: str) -> str:
    """The one line that refuses `request`, which did not parse as a `message` for `method`."""
    return (
        f"the {request.size}-byte request to {method} does not parse as a {message} ({request.reason}); "
        "send the request message of the summaryd.v1 protocol"
    )


WRITE_METHOD = "/summaryd.v1.Summaries/Write"
"""Checks its own requests for `Unparsed`, in its loop (`SummariesService.Write`): a layer here that every request
passes through would cost a generator step per message."""


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def parse(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as exc:  # DecodeError, invalid UTF-8 in a string field, ...
            return Unparsed(len(raw), type(exc).__name__)

    return parse


def _message_name(deserializer: Callable[[bytes], Any] | None) -> str:
    """`summaryd.v1.WriteRequest` for `WriteRequest.FromString`; a generic name otherwise."""
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", "request"))


@contextlib.asynccontextmanager
async def _contained(method: str, context: Context) -> AsyncIterator[None]:
    """Answer a raise of the block with a message that carries none of its text (the log has it)."""
    try:
        yield
    except aio.AbortError:
        raise
    except Exception as exc:
        log.exception("%s failed", method)
        await context.abort(
            grpc.StatusCode.UNKNOWN, f"the daemon failed this call ({type(exc).__name__}); its log says why"
        )


class RefusalInterceptor(aio.ServerInterceptor):  # type: ignore[type-arg]
    """Answers unparseable requests with INVALID_ARGUMENT and logs refusals; see the module docstring.

    Put it first in the server's interceptors, so that it wraps all the others.
    """

    def __init__(self, interval: float = 10.0) -> None:
        self.throttle = Throttle(log, interval)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]], details: grpc.HandlerCallDetails
    ) -> Handler:
        handler = await continuation(details)
        if handler is None:
            return handler
        method: str = details.method
        message = _message_name(handler.request_deserializer)
        kwargs = {
            "request_deserializer": _tolerant(handler.request_deserializer),
            "response_serializer": handler.response_serializer,
        }

        async def refuse(request: Unparsed, context: Context) -> None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, unparsed_problem(request, method, message))

        def noted(context: Context) -> None:
            code = context.code()
            if code in LOGGED:
                peer, reason = context.peer(), context.details()
                self.throttle.warning(
                    f"{method} {code.name}", "refused %s from %s: %s: %s", method, peer, code.name, reason
                )

        async def checked(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, Unparsed):
                    await refuse(request, context)
                yield request

        if handler.unary_unary and inspect.iscoroutinefunction(handler.unary_unary):
            inner_unary = handler.unary_unary

            async def unary_unary(request: Any, context: Context) -> Any:
                try:
                    if isinstance(request, Unparsed):
                        await refuse(request, context)
                    async with _contained(method, context):
                        return await inner_unary(request, context)
                finally:
                    noted(context)

            return grpc.unary_unary_rpc_method_handler(unary_unary, **kwargs)
        if handler.stream_stream and inspect.isasyncgenfunction(handler.stream_stream):
            inner_stream = handler.stream_stream

            async def stream_stream(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
                try:
                    async with _contained(method, context):
                        own = requests if method == WRITE_METHOD else checked(requests, context)
                        async for answer in inner_stream(own, context):
                            yield answer
                finally:
                    noted(context)

            return grpc.stream_stream_rpc_method_handler(stream_stream, **kwargs)
        if handler.unary_stream and inspect.isasyncgenfunction(handler.unary_stream):
            inner_out = handler.unary_stream

            async def unary_stream(request: Any, context: Context) -> AsyncIterator[Any]:
                try:
                    if isinstance(request, Unparsed):
                        await refuse(request, context)
                    async with _contained(method, context):
                        async for answer in inner_out(request, context):
                            yield answer
                finally:
                    noted(context)

            return grpc.unary_stream_rpc_method_handler(unary_stream, **kwargs)
        if handler.unary_stream and inspect.iscoroutinefunction(handler.unary_stream):
            inner_writer = handler.unary_stream  # writes its answers with context.write (health's Watch)

            async def unary_writer(request: Any, context: Context) -> None:
                try:
                    if isinstance(request, Unparsed):
                        await refuse(request, context)
                    async with _contained(method, context):
                        await inner_writer(request, context)
                finally:
                    noted(context)

            return grpc.unary_stream_rpc_method_handler(unary_writer, **kwargs)
        return handler  # a kind this daemon does not serve (synchronous handlers): left as it is
