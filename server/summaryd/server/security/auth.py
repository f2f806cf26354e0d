"""Bearer tokens and the run prefixes each may reach, read from `--token-file` (re-read on SIGHUP).

The file holds one token a line, followed by the run prefixes it may reach (`*` for every run)::

    # token                              prefixes
    9f2c1e0d7a5b4c3e8f1a2b3c4d5e6f70     team-a/ shared/eval
    4b1d9e8f7c6a5b4c3d2e1f0a9b8c7d6e     *

This module only authenticates: `AuthInterceptor` turns a call's token into a `Caller` that the servicer reads
with `current_caller()`. The servicer authorizes, because only it knows which run a session id belongs to (from
the live session, or from the durable session store after a restart).

Tokens are compared in constant time and never logged; logs name a token by a short fingerprint.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from summaryd.server.errors import RunPathError
from summaryd.v1.runpath import validate_run

MIN_TOKEN_LENGTH = 16


@dataclass(frozen=True)
class Grant:
    """What one token may do: write, read and see the runs under its prefixes."""

    fingerprint: str
    prefixes: tuple[str, ...]

    @property
    def reaches_all(self) -> bool:
        """True for a `*` token, which may know of every run and session."""
        return "*" in self.prefixes

    def allows(self, run_dir: str) -> bool:
        """True when `run_dir` is one of the prefixes or lies below one (`a/` and `a` both cover `a/b`, not `ab`)."""
        for prefix in self.prefixes:
            if prefix == "*":
                return True
            bare = prefix.rstrip("/")
            if run_dir == bare or run_dir.startswith(bare + "/"):
                return True
        return False


def _prefix_problem(prefix: str) -> str | None:
    """Why `prefix` can never match a run as meant, or None: a prefix that matches nothing denies silently."""
    if prefix == "*":
        return None
    if "*" in prefix:
        return "prefixes are not patterns; '*' alone means every run, otherwise give a run path like 'team-a/'"
    try:
        validate_run(prefix)
    except RunPathError as exc:
        return f"prefixes are run paths relative to the logdir, like 'team-a/' ({exc})"
    return None


def fingerprint(token: str) -> str:
    """A short, non-reversible name for a token, safe to log."""
    return hashlib.sha256(token.encode()).hexdigest()[:10]


class TokenTable:
    """The tokens the daemon accepts."""

    def __init__(self, entries: Iterable[tuple[str, Sequence[str]]]) -> None:
        self._entries = [(token.encode(), Grant(fingerprint(token), tuple(prefixes))) for token, prefixes in entries]

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def load(cls, path: str | Path) -> TokenTable:
        """Parse a token file.

        Raises:
            ValueError: naming the line that is malformed (never quoting the token).
        """
        entries = []
        for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) < 2:
                raise ValueError(f"{path}:{number}: a token needs at least one run prefix (or '*')")
            token, prefixes = words[0], words[1:]
            if len(token) < MIN_TOKEN_LENGTH:
                raise ValueError(f"{path}:{number}: tokens must be at least {MIN_TOKEN_LENGTH} characters")
            for prefix in prefixes:
                problem = _prefix_problem(prefix)
                if problem:
                    raise ValueError(f"{path}:{number}: prefix {prefix!r}: {problem}")
            entries.append((token, prefixes))
        if not entries:
            raise ValueError(f"{path}: no tokens; every client would be refused")
        return cls(entries)

    def grant_for(self, authorization: str | None) -> Grant | None:
        """The grant of an `authorization: Bearer <token>` value, or None when it is missing or wrong."""
        if not authorization or not authorization.startswith("Bearer "):
            return None
        offered = authorization[len("Bearer ") :].strip().encode()
        found: Grant | None = None
        # Compare with every token, so the time taken does not tell which one (or how much of one) matched.
        for token, grant in self._entries:
            if hmac.compare_digest(token, offered):
                found = grant
        return found


_SERVICE = "/summaryd.v1.Summaries/"
# grpc-stubs type method handlers for the synchronous server only; the aio ones are used untyped.
Handler = Any
_UNAUTHENTICATED = (
    "missing or unknown token: send metadata 'authorization: Bearer <token>' "
    "(the client reads it from token= or SUMMARYD_TOKEN)"
)
UNAUTHENTICATED_MESSAGE = _UNAUTHENTICATED


class Caller:
    """The token a call came with, judged by the token table in force whenever it is asked.

    A token file re-read by SIGHUP applies to calls already under way: a write stream asks before each batch,
    so a removed token is refused at its next message. Asking costs one identity check until a reload.
    """

    def __init__(self, auth: AuthInterceptor, authorization: str, grant: Grant) -> None:
        self._auth = auth
        self._authorization = authorization
        self._tokens = auth.tokens
        self._grant: Grant | None = grant
        self.fingerprint = grant.fingerprint

    def grant(self) -> Grant | None:
        """What the token may do now; None once it is no longer in the token file."""
        tokens = self._auth.tokens
        if tokens is not self._tokens:
            self._tokens, self._grant = tokens, tokens.grant_for(self._authorization)
        return self._grant


# The caller of the RPC being served; each RPC runs in a task of its own, so this never leaks between calls.
_CALLER: ContextVar[Caller | None] = ContextVar("summaryd_caller", default=None)


def current_caller() -> Caller | None:
    """The caller of the RPC being served, or None when the daemon has no token file (every caller may do all)."""
    return _CALLER.get()


# A relay stream's table of tokens: its sessions each bring their client's token (`RelayBatch.authorization`).
_RELAY_AUTH: ContextVar[AuthInterceptor | None] = ContextVar("summaryd_relay_auth", default=None)

RELAY_METHOD = "/summaryd.v1.Summaries/Relay"


class RelayCallers:
    """The callers of a relay stream's sessions: each session is its client's caller, made from the token its
    first batch on the stream forwards, and the current caller while its batches are handled."""

    def __init__(self) -> None:
        self._auth = _RELAY_AUTH.get()
        self._callers: dict[str, Caller] = {}

    def serve_as(self, session_id: str, authorization: str) -> bool:
        """Make the session's caller current (from `authorization` the first time); False when its token is
        missing or unknown. Without a token file every session may do all (as every caller may)."""
        if self._auth is None:
            return True
        caller = self._callers.get(session_id)
        if caller is None:
            grant = self._auth.tokens.grant_for(authorization)
            if grant is None:
                return False
            caller = self._callers[session_id] = Caller(self._auth, authorization, grant)
        _CALLER.set(caller)
        return True

    def forget(self, session_id: str) -> None:
        """The session left the stream (refused): its next batch must bring its token again."""
        self._callers.pop(session_id, None)


def _aborting(handler: Handler, code: grpc.StatusCode, message: str) -> Handler:
    """A handler of the same kind as `handler` that only refuses the call."""

    async def refuse(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message)

    # A streaming handler must be an async generator: interceptors in front of this one iterate it.
    async def refuse_stream(request: Any, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        await context.abort(code, message)
        yield  # never reached: abort() raises

    kwargs = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(refuse, **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(refuse_stream, **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(refuse, **kwargs)
    return grpc.stream_stream_rpc_method_handler(refuse_stream, **kwargs)


def _serving_as(handler: Handler, caller: Caller) -> Handler:
    """`handler` with `caller` made the current caller of the call (the service has unary and bidi methods)."""
    kwargs = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        inner = handler.unary_unary

        async def unary(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
            _CALLER.set(caller)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
    if handler.stream_stream:
        inner_stream = handler.stream_stream

        async def stream(requests: AsyncIterator[Any], context: aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            _CALLER.set(caller)
            async for answer in inner_stream(requests, context):
                yield answer

        return grpc.stream_stream_rpc_method_handler(stream, **kwargs)
    # A method kind the service does not have: refuse rather than serve it without an authorizable caller.
    return _aborting(handler, grpc.StatusCode.UNIMPLEMENTED, "this method is not served with a token file")


def _relaying(handler: Handler, auth: AuthInterceptor) -> Handler:
    """The relay stream's `handler` with the token table its sessions' tokens are checked against."""
    inner = handler.stream_stream

    async def stream(requests: AsyncIterator[Any], context: aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        _RELAY_AUTH.set(auth)
        async for answer in inner(requests, context):
            yield answer

    return grpc.stream_stream_rpc_method_handler(
        stream, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


class AuthInterceptor(aio.ServerInterceptor):  # type: ignore[type-arg]
    """Checks bearer tokens on the summaryd service (health and reflection stay open for probes).

    A call without a token in the current table is refused with `UNAUTHENTICATED`; any other reaches the
    servicer as its `current_caller()`, which the servicer checks against the run of what the call touches.
    """

    def __init__(self, tokens: TokenTable) -> None:
        self.tokens = tokens

    def reload(self, tokens: TokenTable) -> None:
        """Swap in a re-read token file; it applies to every later call and to the next message of open streams."""
        self.tokens = tokens

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(_SERVICE):
            return handler
        if details.method == RELAY_METHOD:
            # Each session of a relay stream brings its own client's token, checked by the servicer per session.
            return _relaying(handler, self)
        metadata = dict(details.invocation_metadata or ())
        authorization = metadata.get("authorization")
        if not isinstance(authorization, str):
            authorization = ""
        grant = self.tokens.grant_for(authorization)
        if grant is None:
            return _aborting(handler, grpc.StatusCode.UNAUTHENTICATED, _UNAUTHENTICATED)
        return _serving_as(handler, Caller(self, authorization, grant))
