"""What a client may send: serialized `Event`s with content, never the records the daemon writes itself."""

from __future__ import annotations

import math
from collections.abc import Sequence

from google.protobuf.message import DecodeError
from tensorboard.compat.proto.event_pb2 import Event

from summaryd.server.errors import EventError
from summaryd.server.record_writer import frame

_INT64_MAX = 2**63 - 1


def check_and_frame(events: Sequence[bytes]) -> bytes:
    """Validate every event of a batch, then return them framed as one blob.

    The whole batch is checked before anything is framed, so a bad event refuses its batch and leaves the
    event file untouched.

    Raises:
        EventError: naming the first bad event and what is wrong with it.
    """
    event = Event()
    for index, data in enumerate(events):
        try:
            event.ParseFromString(data)
        except DecodeError:
            raise EventError(index, "is not a serialized tensorboard Event") from None
        if event.HasField("file_version"):
            raise EventError(index, "sets file_version; the daemon writes that record itself")
        if not math.isfinite(event.wall_time) or event.wall_time < 0:
            raise EventError(index, f"has wall_time {event.wall_time}; use the client's clock in seconds")
        if abs(event.step) > _INT64_MAX:  # pragma: no cover - protobuf already bounds int64
            raise EventError(index, "has a step outside int64")
        if event.WhichOneof("what") is None:
            raise EventError(index, "carries nothing (no summary, session_log, graph or metadata)")
    return b"".join([frame(data) for data in events])
