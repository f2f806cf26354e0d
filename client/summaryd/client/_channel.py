"""The client's gRPC channel: plaintext or TLS (with an optional client certificate), plus the bearer token."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

# Batches up to the daemon's default --max-message-bytes out; and in, a status of every session at the daemon's
# bounds (4,096 sessions with run paths and identities at their longest make about 8 MiB, over gRPC's default 4 MiB).
_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


@dataclass(frozen=True)
class ChannelSettings:
    """How to reach the daemon. Each field falls back to its `SUMMARYD_*` variable (see `from_environment`)."""

    token: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls: bool = False

    @classmethod
    def from_environment(
        cls,
        *,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> ChannelSettings:
        """Arguments win; else `SUMMARYD_TOKEN`, `SUMMARYD_TLS_CA`, `SUMMARYD_TLS_CERT`, `SUMMARYD_TLS_KEY`.

        TLS is on when a CA bundle is given or `SUMMARYD_TLS=1` (then the system's roots are trusted).
        """
        ca = tls_ca or environ.get("SUMMARYD_TLS_CA") or None
        cert = tls_cert or environ.get("SUMMARYD_TLS_CERT") or None
        key = tls_key or environ.get("SUMMARYD_TLS_KEY") or None
        if (cert is None) != (key is None):
            raise ValueError("a client certificate needs both tls_cert and tls_key (SUMMARYD_TLS_CERT/_KEY)")
        tls = bool(ca or cert or environ.get("SUMMARYD_TLS", "") in ("1", "true", "yes"))
        return cls(token or environ.get("SUMMARYD_TOKEN") or None, ca, cert, key, tls)


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):  # type: ignore[type-arg]
    """Adds `authorization: Bearer <token>` to every call (over plaintext too, for a loopback daemon)."""

    def __init__(self, token: str) -> None:
        self._metadata = ("authorization", f"Bearer {token}")

    def _with_token(self, details: Any) -> Any:
        return _Details(details, (*(details.metadata or ()), self._metadata))

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_stream(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)


class _Details(grpc.ClientCallDetails):
    def __init__(self, base: Any, metadata: tuple[tuple[str, str | bytes], ...]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = base.wait_for_ready
        self.compression = base.compression


def open_channel(address: str, settings: ChannelSettings) -> grpc.Channel:
    """A channel to the daemon with the settings' TLS and token."""
    if settings.tls:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=Path(settings.tls_ca).read_bytes() if settings.tls_ca else None,
            private_key=Path(settings.tls_key).read_bytes() if settings.tls_key else None,
            certificate_chain=Path(settings.tls_cert).read_bytes() if settings.tls_cert else None,
        )
        channel = grpc.secure_channel(address, credentials, options=_OPTIONS)
    else:
        channel = grpc.insecure_channel(address, options=_OPTIONS)
    if settings.token:
        channel = grpc.intercept_channel(channel, _BearerToken(settings.token))
    return channel
