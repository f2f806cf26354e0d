"""What a client may send: serialized `Event`s with content, never the records the daemon writes itself."""

from __future__ import annotations

import math
from collections.abc import Sequence

from google.protobuf.message import DecodeError
from tensorboard.compat.proto.event_pb2 import Event

from summaryd.server.errors import EventError
from summaryd.server.limits import DEFAULT, Limits
from summaryd.server.record_writer import frame

_INT64_MAX = 2**63 - 1


def check_and_frame(events: Sequence[bytes], limits: Limits = DEFAULT) -> bytes:
    """Validate every event of a batch (sizes within `limits`), then return them framed as one blob.

    The whole batch is checked before anything is framed, so a bad event refuses its batch and leaves the
    event file untouched.

    Raises:
        EventError: naming the first bad event and what is wrong with it.
    """
    event = Event()
    max_event, max_tag = limits.max_event_bytes, limits.max_tag_bytes
    for index, data in enumerate(events):
        if len(data) > max_event:
            raise EventError(index, f"is {len(data)} bytes, over the limit of {max_event} bytes (--max-event-bytes)")
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
        for value in event.summary.value:
            # A tag of n characters has at most 4n UTF-8 bytes: most tags need no encoding to pass.
            if len(value.tag) * 4 > max_tag and len(value.tag.encode()) > max_tag:
                raise EventError(
                    index,
                    f"has a tag of {len(value.tag.encode())} bytes, over the limit of {max_tag} bytes "
                    "(--max-tag-bytes)",
                )
    return b"".join([frame(data) for data in events])
