"""Errors the inner layers raise; the service turns each into one gRPC status at the edge."""

from __future__ import annotations

from summaryd.v1.runpath import RunPathError
from summaryd.v1.wire import REFUSED_SEQUENCE_KEY

__all__ = ["REFUSED_SEQUENCE_KEY", "EventError", "LimitError", "RunPathError"]


class EventError(ValueError):
    """An event a client must not send: not an `Event`, or of a kind the daemon writes itself."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"event {index} of the batch {reason}")
        self.index = index
        self.sequence: int | None = None
        """The event's sequence number in its session, once the session has placed the batch."""


class LimitError(Exception):
    """A client asked for more than a configured limit allows (sessions, open runs); RESOURCE_EXHAUSTED."""
