"""Queued scalars as columns: what a batch of them carries to a daemon that builds their events itself."""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from summaryd.client._sender._encoder import EventEncoder
from summaryd.client._sender._kinds import SCALAR
from summaryd.v1 import summaryd_pb2 as pb

# The fields of a queued scalar `(SCALAR, tag, value, step, wall_time, estimated bytes)`.
_TAG, _VALUE, _STEP, _WALL = itemgetter(1), itemgetter(2), itemgetter(3), itemgetter(4)


# The keys of `ScalarColumns`' packed fields on the wire (field number << 3 | wire type 2, length-delimited):
# tag_index (2), wall_time (4), value (5), fixed_step (6).
_TAG_INDEX_FIELD, _WALL_TIME_FIELD, _VALUE_FIELD, _FIXED_STEP_FIELD = b"\x12", b"\x22", b"\x2a", b"\x32"


def _varint(number: int) -> bytes:
    """`number` (not negative) as a protobuf varint."""
    out = bytearray()
    while number >= 0x80:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


@dataclass(frozen=True, eq=False)
class ScalarRun:
    """A run of queued scalars `(SCALAR, tag, value, step, wall_time, estimated bytes)` as columns, in queue order.

    Made per batch with a handful of C-level operations (no `Event` per scalar); `tags` holds each tag once,
    `tag_index` points into it.
    """

    tags: Sequence[str]
    tag_index: Sequence[int]
    values: Sequence[float]
    steps: Sequence[int]
    wall_times: Sequence[float]
    # The steps as packed little-endian int64s, as `ScalarColumns.fixed_step` carries them: what the int64 check
    # made; b"": not made (`fill` then sends `step`).
    step_bytes: bytes = b""

    @classmethod
    def of(cls, items: Sequence[tuple[Any, ...]], one_tag: str | None = None) -> ScalarRun:
        """The columns of `items` (`one_tag`: the tag of every one of them, known already). Raises `ValueError`
        for a scalar no request carries: a step beyond int64, or a tag that is not UTF-8."""
        # One C-level pass per column (`itemgetter`); cheaper than transposing the tuples with `zip(*items)`.
        tag_index: Sequence[int]
        if one_tag is None:
            tags = list(map(_TAG, items))
            if tags and tags.count(tags[0]) == len(tags):  # one tag after all: `count` compares in C, no hash
                one_tag = tags[0]
        if one_tag is not None:
            names: tuple[str, ...] = (one_tag,)
            tag_index = [0] * len(items)
        else:
            table = {tag: index for index, tag in enumerate(dict.fromkeys(tags))}
            names = tuple(table)
            tag_index = list(map(table.__getitem__, tags))
        for name in names:
            name.encode()  # a tag that is not UTF-8 (a lone surrogate) raises here, not in the request's field
        steps = list(map(_STEP, items))
        try:
            # That every step is an int64, checked by packing them: a third of the cost of `min` and `max`. The
            # bytes are what a daemon that takes `fixed_step` is sent.
            step_bytes = struct.pack(f"<{len(steps)}q", *steps)
        except struct.error:
            raise ValueError("a step beyond int64, which no request carries") from None
        return cls(names, tag_index, list(map(_VALUE, items)), steps, list(map(_WALL, items)), step_bytes)

    def __len__(self) -> int:
        return len(self.steps)

    def packed(self) -> ScalarRun:
        """The same columns in packed arrays, for a batch that waits (no stream open): a few bytes a scalar
        instead of its objects, which go back to the allocator for the caller's next ones."""
        return ScalarRun(
            self.tags,
            array("L", self.tag_index),
            array("d", self.values),
            array("q", self.steps),
            array("d", self.wall_times),
            self.step_bytes,
        )

    def fill(self, columns: pb.ScalarColumns, fixed_steps: bool = False) -> pb.ScalarColumns:
        """Extend `columns` (empty: the write request's own field, which saves copying a message into it) with
        these, as the request carries them; `fixed_steps`: the steps in `fixed_step` (a daemon that takes them),
        copied as packed, where `step` converts and varint-encodes each."""
        columns.tags.extend(self.tags)
        if len(self.tags) == 1:
            # One tag: its index column is all zeros, which read from their packed encoding (a zero byte each)
            # costs nothing per scalar, where `extend` converted and appended each of them.
            count = len(self.tag_index)
            columns.MergeFromString(_TAG_INDEX_FIELD + _varint(count) + bytes(count))
        else:
            columns.tag_index.extend(self.tag_index)
        # The packed fields, merged in one parse and joined, not added: `+` copied the wall times' bytes four
        # times and the values' twice.
        packed: list[bytes] = []
        if fixed_steps and self.step_bytes:
            packed += (_FIXED_STEP_FIELD, _varint(len(self.step_bytes)), self.step_bytes)
        else:
            columns.step.extend(self.steps)
        count = len(self.steps)
        try:
            # Wall times and values are fixed-width: packed (little-endian, as protobuf's) in one call, their
            # bytes are read in one copy, where `extend` converted and appended each.
            walls = struct.pack(f"<{count}d", *self.wall_times)
            values = struct.pack(f"<{count}f", *self.values)
        except OverflowError:  # a value beyond float32, which `extend` turns into an infinity as torch does
            columns.wall_time.extend(self.wall_times)
            columns.value.extend(self.values)
        else:
            packed += (_WALL_TIME_FIELD, _varint(len(walls)), walls, _VALUE_FIELD, _varint(len(values)), values)
        if packed:
            columns.MergeFromString(b"".join(packed))
        return columns

    def encoded(self) -> list[bytes]:
        """The serialized events, byte for byte what the daemon builds from the columns: for the spool, an
        older daemon, a batch cut to smaller limits, or a refusal."""
        encoder = EventEncoder()
        tags = self.tags
        return [
            encoder.scalar((SCALAR, tags[which], value, step, wall_time))
            for which, value, step, wall_time in zip(
                self.tag_index, self.values, self.steps, self.wall_times, strict=True
            )
        ]
