"""Scalar events built from a batch's columns (`WriteRequest.scalars`), byte for byte as a client serializes them.

A client's scalar event is `Event{wall_time, step, summary{value{tag, simple_value}}}`, serialized by protobuf in
field order with proto3's rules: `wall_time` and `step` are left out when zero, `tag` when empty, and
`simple_value` (a member of a oneof) is always written. Everything after `step` depends on the tag alone, so it
is kept per tag (`_template`); a record costs a few concatenations, one CRC-32C of its bytes, and a cached
length header.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator, Sequence
from typing import overload

import google_crc32c
import numpy as np
from numpy.typing import NDArray

from summaryd.server.errors import EventError
from summaryd.server.limits import DEFAULT, Limits
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1.wire import header

_DOUBLE = struct.Struct("<d")
_WALL_TIME = struct.Struct("<Bd")  # Event.wall_time's key (field 1, 64-bit: 9) and value in one pack
_MASK_DELTA = 0xA282EAD8  # TFRecord's CRC mask (see `wire.masked_crc32c`)
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

        Per record, Python builds its bytes (three packs from cached parts) and its CRC-32C; the checks, the
        CRC masking and the framing are numpy operations over the whole batch.

        Raises:
            EventError: naming the first bad scalar (its index in this sequence) and what is wrong with it.
        """
        columns, start = self._columns, self._start
        count = len(self)
        if count == 0:
            return b""
        tags = list(columns.tags)
        tag_index = np.asarray(columns.tag_index[start:], dtype=np.int64)
        wall_times = columns.wall_time[start:]
        problems = self._problems(tags, tag_index, np.asarray(wall_times, dtype=np.float64), limits)
        if problems:
            raise min(problems, key=lambda problem: problem.index)
        templates = [_template(tag) for tag in tags]
        tails = [_tail(len(template)) for template in templates]
        wall_pack, step_field = _WALL_TIME.pack, _step_field
        records = [
            (wall_pack(9, wall_time) if wall_time else _wall_time_field(wall_time))
            + step_field(step)
            + tails[which].pack(templates[which], value)
            for which, step, wall_time, value in zip(
                tag_index.tolist(), columns.step[start:], wall_times, columns.value[start:], strict=True
            )
        ]
        lengths = np.fromiter(map(len, records), dtype=np.int64, count=count)
        over = np.flatnonzero(lengths > limits.max_event_bytes)
        if over.size:
            index = int(over[0])
            raise EventError(
                index,
                f"is {int(lengths[index])} bytes, over the limit of {limits.max_event_bytes} bytes (--max-event-bytes)",
            )
        crcs = np.fromiter(map(google_crc32c.value, records), dtype=np.uint64, count=count)
        return _frame(records, crcs)

    @staticmethod
    def _problems(
        tags: list[str], tag_index: NDArray[np.int64], wall_times: NDArray[np.float64], limits: Limits
    ) -> list[EventError]:
        """The first scalar failing each check (the caller raises the earliest)."""
        problems: list[EventError] = []
        beyond = np.flatnonzero(tag_index >= len(tags))
        if beyond.size:
            index = int(beyond[0])
            problems.append(
                EventError(index, f"has tag_index {int(tag_index[index])}, beyond the batch's {len(tags)} tags")
            )
            tag_index = np.where(tag_index >= len(tags), 0, tag_index)  # for the checks below
        max_tag = limits.max_tag_bytes
        for which, tag in enumerate(tags):
            size = len(tag.encode())
            used = np.flatnonzero(tag_index == which) if size > max_tag else None
            if used is not None and used.size:
                problems.append(
                    EventError(
                        int(used[0]),
                        f"has a tag of {size} bytes, over the limit of {max_tag} bytes (--max-tag-bytes)",
                    )
                )
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(~((wall_times >= 0.0) & (wall_times < np.inf)))  # NaN fails both
        if bad.size:
            index = int(bad[0])
            problems.append(
                EventError(index, f"has wall_time {float(wall_times[index])}; use the client's clock in seconds")
            )
        return problems


@functools.lru_cache(maxsize=1024)
def _tail(template_size: int) -> struct.Struct:
    """Packs a template and the value's 4 bytes in one call."""
    return struct.Struct(f"<{template_size}sf")


def _frame(records: list[bytes], crcs: NDArray[np.uint64]) -> bytes:
    """TFRecord framing of `records`, as `wire.frame_all` frames them: a length header cached per length, and
    the CRCs masked for the whole batch at once."""
    masked = (((crcs >> np.uint64(15)) | (crcs << np.uint64(17))) + np.uint64(_MASK_DELTA)) & np.uint64(0xFFFFFFFF)
    footers = masked.astype("<u4").tobytes()
    headers: dict[int, bytes] = {}
    parts: list[bytes] = []
    offset = 0
    for record in records:
        size = len(record)
        head = headers.get(size)
        if head is None:
            head = headers[size] = header(size)
        parts += (head, record, footers[offset : offset + 4])
        offset += 4
    return b"".join(parts)
