"""Events the caller queues as plain values, and their bytes, which the sender thread builds.

Queued as one flat tuple of atomic values (`_items.QueuedScalar`, `_items.QueuedSummary`): a scalar is
`(tag, value, step, wall_time, estimated bytes)` and a serialized summary `(summary bytes, step, wall_time,
estimated bytes)`.
"""

from __future__ import annotations

from typing import Any

from tensorboard.compat.proto.event_pb2 import Event

SCALAR_OVERHEAD_BYTES = 24
"""About what a scalar's event takes besides its tag (for the queue's byte bound)."""
SUMMARY_OVERHEAD_BYTES = 16
"""About what an event takes besides the serialized summary it carries."""

_SUMMARY_FIELD = 5  # Event.summary


class EventEncoder:
    """Builds the serialized `Event`s of queued values, byte for byte as torch's builders and `FileWriter`
    (or TensorFlow's `add_summary`) make them.

    It refills the same messages rather than building new ones: about a quarter of the cost. Every field is set
    each time, so nothing of an earlier event remains. Not thread-safe: one per sender thread.
    """

    def __init__(self) -> None:
        self._scalar = Event()
        self._value = self._scalar.summary.value.add()
        self._header = Event()

    def scalar(self, item: tuple[Any, ...]) -> bytes:
        """A queued scalar `(SCALAR, tag, value, step, wall_time, ...)` as a `simple_value` event."""
        event, value = self._scalar, self._value
        value.tag, value.simple_value, event.step, event.wall_time = item[1:5]
        data: bytes = event.SerializeToString()
        return data

    def summary(self, item: tuple[Any, ...]) -> bytes:
        """A queued summary `(SUMMARY, summary bytes, step, wall_time, ...)` as an event; the summary is framed as
        field 5, not re-encoded."""
        summary, header = item[1], self._header
        header.step, header.wall_time = item[2:4]
        data: bytes = header.SerializeToString()
        return data + length_delimited(_SUMMARY_FIELD, summary)


def length_delimited(field_number: int, payload: bytes) -> bytes:
    """Protobuf wire encoding of a length-delimited field (tag, varint length, payload)."""
    out = bytearray()
    for value in ((field_number << 3) | 2, len(payload)):
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7  # noqa: PLW2901
        out.append(value)
    return bytes(out) + payload


def checked_tag(tag: object) -> str:
    """A tag as protobuf takes it (what torch's `add_scalar` accepts): `str`, or UTF-8 `bytes`.

    Raises:
        TypeError: any other type. UnicodeDecodeError (a ValueError): bytes that are not UTF-8.
    """
    if isinstance(tag, str):
        return tag
    if isinstance(tag, bytes):
        return tag.decode()
    raise TypeError(f"a summary tag must be a str, not {type(tag).__name__}")
