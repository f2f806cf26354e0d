"""Bearer tokens and the run prefixes each may write, read from `--token-file` (re-read on SIGHUP).

The file holds one token a line, followed by the run prefixes it may write (`*` for every run)::

    # token                              prefixes
    9f2c1e0d7a5b4c3e8f1a2b3c4d5e6f70     team-a/ shared/eval
    4b1d9e8f7c6a5b4c3d2e1f0a9b8c7d6e     *

Tokens are compared in constant time and never logged; logs name a token by a short fingerprint.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

MIN_TOKEN_LENGTH = 16


@dataclass(frozen=True)
class Grant:
    """What one token may do: write runs under its prefixes."""

    fingerprint: str
    prefixes: tuple[str, ...]

    def allows(self, run_dir: str) -> bool:
        """True when `run_dir` is one of the prefixes or lies below one (`a/` and `a` both cover `a/b`)."""
        for prefix in self.prefixes:
            if prefix == "*":
                return True
            bare = prefix.rstrip("/")
            if run_dir == bare or run_dir.startswith(bare + "/"):
                return True
        return False


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
            if any(p.startswith("/") or ".." in p.split("/") for p in prefixes):
                raise ValueError(f"{path}:{number}: prefixes are run paths relative to the logdir, or '*'")
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


def _aborting(handler: Handler, code: grpc.StatusCode, message: str) -> Handler:
    """A handler of the same kind as `handler` that only refuses the call."""

    async def refuse(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message)

    kwargs = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(refuse, **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(refuse, **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(refuse, **kwargs)
    return grpc.stream_stream_rpc_method_handler(refuse, **kwargs)


class AuthInterceptor(aio.ServerInterceptor):  # type: ignore[type-arg]
    """Checks bearer tokens on the summaryd service (health and reflection stay open for probes).

    A token may open sessions only on runs under its prefixes (`PERMISSION_DENIED` otherwise), and a session is
    bound to the token that opened it: writing, flushing or closing it with another token is refused too.
    """

    def __init__(self, tokens: TokenTable) -> None:
        self.tokens = tokens
        self._owners: dict[str, str] = {}

    def reload(self, tokens: TokenTable) -> None:
        """Swap in a re-read token file; sessions of removed tokens are refused from their next call on."""
        self.tokens = tokens

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(_SERVICE):
            return handler
        metadata = dict(details.invocation_metadata or ())
        authorization = metadata.get("authorization")
        grant = self.tokens.grant_for(authorization if isinstance(authorization, str) else None)
        if grant is None:
            return _aborting(handler, grpc.StatusCode.UNAUTHENTICATED, _UNAUTHENTICATED)
        method = details.method[len(_SERVICE) :]
        if method == "OpenSession":
            return self._guard_open(handler, grant)
        if method in ("Flush", "CloseSession", "PutFile"):
            return self._guard_unary(handler, grant, forget=method == "CloseSession")
        if method == "Write":
            return self._guard_write(handler, grant)
        return handler

    def _owned(self, session_id: str, grant: Grant) -> bool:
        owner = self._owners.get(session_id)
        return owner is None or hmac.compare_digest(owner, grant.fingerprint)

    def _guard_open(self, handler: Handler, grant: Grant) -> Handler:
        inner = handler.unary_unary

        async def open_session(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
            run_dir = "/".join(part for part in (request.run.rstrip("/"), request.worker) if part)
            if not grant.allows(run_dir):
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"this token may not write run {run_dir!r}; ask for a token whose prefixes cover it",
                )
            if not self._owned(request.session_id, grant):
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, "the session belongs to another token")
            answer = await inner(request, context)
            self._owners[request.session_id] = grant.fingerprint
            return answer

        return grpc.unary_unary_rpc_method_handler(
            open_session,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _guard_unary(self, handler: Handler, grant: Grant, *, forget: bool) -> Handler:
        inner = handler.unary_unary

        async def guarded(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
            if not self._owned(request.session_id, grant):
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, "the session belongs to another token")
            answer = await inner(request, context)
            if forget:
                self._owners.pop(request.session_id, None)
            return answer

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _guard_write(self, handler: Handler, grant: Grant) -> Handler:
        inner = handler.stream_stream

        async def write(requests: AsyncIterator[Any], context: aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            async def checked() -> AsyncIterator[Any]:
                async for request in requests:
                    if request.session_id and not self._owned(request.session_id, grant):
                        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "the session belongs to another token")
                    yield request

            async for answer in inner(checked(), context):
                yield answer

        return grpc.stream_stream_rpc_method_handler(
            write,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
