"""Scalar events built from a batch's columns (`WriteRequest.scalars`), byte for byte as a client serializes them.

A client's scalar event is `Event{wall_time, step, summary{value{tag, simple_value}}}`, serialized by protobuf in
field order with proto3's rules: `wall_time` and `step` are left out when zero, `tag` when empty, and
`simple_value` (a member of a oneof) is always written. Everything after `step` depends on the tag alone, so it
is kept per tag (`_template`); a record costs a few concatenations, one CRC-32C of its bytes, and a cached
length header.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Iterator, Sequence
from typing import overload

from summaryd.server.errors import EventError
from summaryd.server.limits import DEFAULT, Limits
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1.wire import footer, header

_DOUBLE = struct.Struct("<d")
_FLOAT = struct.Struct("<f")
_WALL_TIME_TAG = b"\x09"  # Event.wall_time: field 1, 64-bit
_STEP_TAG = b"\x10"  # Event.step: field 2, varint
_U64 = (1 << 64) - 1


def _varint(value: int) -> bytes:
    """Protobuf's varint of an int64 (negative values as their 10-byte two's complement)."""
    value &= _U64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@functools.lru_cache(maxsize=4096)
def _step_field(step: int) -> bytes:
    """The `step` field of an event, empty for 0 (proto3 leaves it out). Cached: a run's steps repeat."""
    return _STEP_TAG + _varint(step) if step else b""


@functools.lru_cache(maxsize=65536)
def _template(tag: str) -> bytes:
    """Everything of a scalar event after `step` but the value's 4 bytes: `summary{value{tag, simple_value}}`."""
    encoded = tag.encode()
    tag_field = b"\x0a" + _varint(len(encoded)) + encoded if encoded else b""
    value = tag_field + b"\x15"  # Value.simple_value: field 2, 32-bit; its 4 bytes follow
    value_size = len(value) + _FLOAT.size
    summary_size = 1 + len(_varint(value_size)) + value_size
    return b"\x2a" + _varint(summary_size) + b"\x0a" + _varint(value_size) + value


def _wall_time_field(wall_time: float) -> bytes:
    """The `wall_time` field, left out only for +0.0 (protobuf writes any other bit pattern, -0.0 too)."""
    packed = _DOUBLE.pack(wall_time)
    return b"" if packed == b"\0\0\0\0\0\0\0\0" else _WALL_TIME_TAG + packed


def column_problem(columns: pb.ScalarColumns) -> str | None:
    """What is wrong with the columns' shape (answered INVALID_ARGUMENT before anything is written)."""
    count = len(columns.step)
    if not len(columns.tag_index) == len(columns.wall_time) == len(columns.value) == count:
        return (
            f"scalars has columns of different lengths (tag_index {len(columns.tag_index)}, step {count}, "
            f"wall_time {len(columns.wall_time)}, value {len(columns.value)}); send one entry per scalar in each"
        )
    return None


class ScalarRecords(Sequence[bytes]):
    """The serialized events of a batch's scalar columns (or a tail of them), built when framed."""

    def __init__(self, columns: pb.ScalarColumns, start: int = 0) -> None:
        self._columns = columns
        self._start = start

    def __len__(self) -> int:
        return len(self._columns.step) - self._start

    @overload
    def __getitem__(self, index: int) -> bytes: ...
    @overload
    def __getitem__(self, index: slice) -> ScalarRecords: ...
    def __getitem__(self, index: int | slice) -> bytes | ScalarRecords:
        if isinstance(index, slice):
            start, stop, stride = index.indices(len(self))
            if stop != len(self) or stride != 1:
                raise ValueError("scalar records are cut only to a tail")
            return ScalarRecords(self._columns, self._start + start)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return b"".join(self._records(self._start + index, self._start + index + 1))

    def __iter__(self) -> Iterator[bytes]:
        return self._records(self._start, len(self._columns.step))

    def _records(self, start: int, stop: int) -> Iterator[bytes]:
        columns = self._columns
        tags = columns.tags
        float_pack = _FLOAT.pack
        for i in range(start, stop):
            yield (
                _wall_time_field(columns.wall_time[i])
                + _step_field(columns.step[i])
                + _template(tags[columns.tag_index[i]])
                + float_pack(columns.value[i])
            )

    def framed(self, limits: Limits = DEFAULT) -> bytes:
        """Check every scalar and return the records framed as one blob, ready for one write.

        Raises:
            EventError: naming the first bad scalar (its index in this sequence) and what is wrong with it.
        """
        columns, start = self._columns, self._start
        tags = list(columns.tags)
        templates: list[bytes | None] = [None] * len(tags)
        max_tag, max_event = limits.max_tag_bytes, limits.max_event_bytes
        tag_index = columns.tag_index[start:]
        wall_times = columns.wall_time[start:]
        steps = columns.step[start:]
        values = columns.value[start:]
        float_pack, double_pack, step_field = _FLOAT.pack, _DOUBLE.pack, _step_field
        infinity = math.inf
        parts: list[bytes] = []
        for index, (which, wall_time, step, value) in enumerate(zip(tag_index, wall_times, steps, values, strict=True)):
            try:
                template = templates[which]
            except IndexError:
                raise EventError(index, f"has tag_index {which}, beyond the batch's {len(tags)} tags") from None
            if template is None:
                encoded = tags[which].encode()
                if len(encoded) > max_tag:
                    raise EventError(
                        index,
                        f"has a tag of {len(encoded)} bytes, over the limit of {max_tag} bytes (--max-tag-bytes)",
                    )
                template = templates[which] = _template(tags[which])
            if not 0.0 <= wall_time < infinity:  # also false for NaN
                raise EventError(index, f"has wall_time {wall_time}; use the client's clock in seconds")
            if wall_time:
                data = _WALL_TIME_TAG + double_pack(wall_time) + step_field(step) + template + float_pack(value)
            else:
                data = _wall_time_field(wall_time) + step_field(step) + template + float_pack(value)
            size = len(data)
            if size > max_event:
                raise EventError(index, f"is {size} bytes, over the limit of {max_event} bytes (--max-event-bytes)")
            parts += (header(size), data, footer(data))
        return b"".join(parts)
