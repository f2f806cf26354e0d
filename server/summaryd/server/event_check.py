"""What a client may send: serialized `Event`s with content, never the records the daemon writes itself."""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError
from tensorboard.compat.proto.event_pb2 import Event

from summaryd.server.errors import EventError
from summaryd.server.limits import DEFAULT, Limits
from summaryd.v1.wire import footer, header

_INFINITY = float("inf")


def check_and_frame(events: Sequence[bytes], limits: Limits = DEFAULT) -> bytes:
    """Validate every event of a batch (sizes within `limits`) and return them framed as one blob.

    One pass checks and frames each event; a bad event raises before anything is returned, so it refuses its
    whole batch and leaves the event file untouched.

    Raises:
        EventError: naming the first bad event and what is wrong with it.
    """
    event = Event()
    max_event, max_tag = limits.max_event_bytes, limits.max_tag_bytes
    parts: list[bytes] = []
    for index, data in enumerate(events):
        size = len(data)
        if size > max_event:
            raise EventError(index, f"is {size} bytes, over the limit of {max_event} bytes (--max-event-bytes)")
        try:
            event.ParseFromString(data)
        except DecodeError:
            raise EventError(index, "is not a serialized tensorboard Event") from None
        # One look at the `what` oneof answers both "has content" and "is not a file_version record".
        what = event.WhichOneof("what")
        if what is None:
            raise EventError(index, "carries nothing (no summary, session_log, graph or metadata)")
        if what == "file_version":
            raise EventError(index, "sets file_version; the daemon writes that record itself")
        wall_time = event.wall_time
        if not 0.0 <= wall_time < _INFINITY:  # also false for NaN
            raise EventError(index, f"has wall_time {wall_time}; use the client's clock in seconds")
        # A tag is part of its event: an event no longer than the limit cannot hold a tag over it.
        if what == "summary" and size > max_tag:
            for value in event.summary.value:
                # A tag of n characters has at most 4n UTF-8 bytes: most tags need no encoding to pass.
                if len(value.tag) * 4 > max_tag and len(value.tag.encode()) > max_tag:
                    raise EventError(
                        index,
                        f"has a tag of {len(value.tag.encode())} bytes, over the limit of {max_tag} bytes "
                        "(--max-tag-bytes)",
                    )
        parts += (header(size), data, footer(data))
    return b"".join(parts)
