"""The usual batch of serialized events, every one a wall time, a step and one tagged `simple_value`, read at once
from its bytes by numpy: checked and its points taken without a Python object per event.

Every protobuf serializer (TensorFlow's, upb's, the pure-Python one torch uses) writes such an event in field
order, with lengths in their shortest varints, so its bytes are one fixed layout::

    09 <wall_time: 8>  [10 <step: varint>]  2a <S>  0a <V>  0a <T> <tag: T>  15 <simple_value: 4>

(the step left out when it is 0, as proto3 leaves it). Numpy reads that layout for every event of the batch at
once, from the events joined, and a batch is taken only when every event is exactly it, its lengths adding up
to its size. Such an event is a valid `Event` whatever its numbers are (its tag's UTF-8 is checked too), so the
batch's check needs no parse, and its points are read without one; any other batch is read as before (parsed,
event by event where it must be).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray


class PointColumns(NamedTuple):
    """A batch's scalar points as columns, one entry a point, in order."""

    tags: Sequence[str]
    steps: Sequence[int]
    wall_times: Sequence[float]
    values: Sequence[float]


@dataclass(frozen=True, slots=True)
class UsualBatch:
    """A batch of usual events as columns: its distinct tags, each event's index into them, its step, wall time
    and value."""

    tags: list[str]
    tag_index: NDArray[np.int64]
    steps: NDArray[np.int64]
    wall_times: NDArray[np.float64]
    values: NDArray[np.float32]
    longest_tag: int
    """in UTF-8 bytes"""

    def points(self) -> PointColumns:
        """The points, as the write observers read them (lists)."""
        tags = self.tags
        one = len(tags) == 1
        per_point = [tags[0]] * len(self.steps) if one else list(map(tags.__getitem__, self.tag_index.tolist()))
        return PointColumns(per_point, self.steps.tolist(), self.wall_times.tolist(), self.values.tolist())


class EventBatch(list[bytes]):
    """A batch of serialized events as received, which keeps what its check read: its check, the aggregation,
    the watch and the board's index each look at the same batch."""

    __slots__ = ("points", "read_as_usual", "usual")

    def __init__(self, events: Iterable[bytes]) -> None:
        super().__init__(events)
        self.read_as_usual = False
        """its check tried `read_usual` on it: `usual` says what came of it, and nothing tries again"""
        self.usual: UsualBatch | None = None
        """the batch read as usual events by its check"""
        self.points: PointColumns | None = None


USUAL_FROM = 64
"""From how many events a batch is read so: numpy's fixed cost (some 55 µs a batch) is then below the parses it
saves (the check's and the observers' joined reading, `scalar_points`, 70 µs at 64 events and 300 at 500)."""

_WALL_TIME, _STEP, _SUMMARY, _VALUE, _TAG, _SIMPLE_VALUE = 0x09, 0x10, 0x2A, 0x0A, 0x0A, 0x15
_SHORTEST = 9 + 2 + 2 + 2 + 5  # a wall time, three keys with a one-byte length each, a float (an empty tag)
_VARINT_LIMITS = np.array([1 << bits for bits in range(7, 64, 7)], dtype=np.uint64)
_LENGTH_BYTES = 5  # a length's varint: up to 2**35, beyond any event the daemon takes
_STEP_BYTES = 10  # an int64's varint, a negative one's included


class _NotUsualError(Exception):
    """An event of the batch is not exactly the usual layout."""


def read_usual(events: Sequence[bytes]) -> UsualBatch | None:
    """The batch read as usual events, or None when any event is not exactly one (an empty batch included)."""
    try:
        return _read(events)
    except _NotUsualError:
        return None


def _read(events: Sequence[bytes]) -> UsualBatch:
    count = len(events)
    sizes = np.fromiter(map(len, events), dtype=np.int64, count=count)
    _expect(count > 0 and int(sizes.min()) >= _SHORTEST)
    joined = b"".join(events)
    # Zeros after the last event: a varint read near its end never looks past the buffer.
    data = np.frombuffer(joined + bytes(_STEP_BYTES), dtype=np.uint8)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    _expect((data[starts] == _WALL_TIME).all())
    at = starts + 9
    stepped = data[at] == _STEP
    steps = np.zeros(count, dtype=np.int64)
    if stepped.any():
        step_values, step_bytes = _varints(data, at[stepped] + 1, _STEP_BYTES)
        steps[stepped] = step_values.view(np.int64)
        at[stepped] += 1 + step_bytes
    # Each length is the whole rest of its event, less the fields that follow inside it.
    value_at = _field(data, at, _SUMMARY, ends, 0)
    tag_at = _field(data, value_at, _VALUE, ends, 0)
    tag_starts = _field(data, tag_at, _TAG, ends, 5)
    float_at = ends - 5
    _expect((data[float_at] == _SIMPLE_VALUE).all())
    tag_lengths = float_at - tag_starts
    tags, tag_index = _tags(joined, data, tag_starts, tag_lengths)
    values = _gather(data, float_at + 1, 4).view("<f4").ravel()
    wall_times = _gather(data, starts + 1, 8).view("<f8").ravel()
    return UsualBatch(tags, tag_index, steps, wall_times, values, int(tag_lengths.max()))


def _expect(holds: bool | np.bool_) -> None:
    if not holds:
        raise _NotUsualError


def _field(
    data: NDArray[np.uint8], at: NDArray[np.int64], key: int, ends: NDArray[np.int64], after: int
) -> NDArray[np.int64]:
    """Where the content of each event's length-delimited field at `at` begins, when each is that field (`key`)
    and its content runs to `after` bytes before its event's end."""
    _expect((data[at] == key).all())
    lengths, length_bytes = _varints(data, at + 1, _LENGTH_BYTES)
    content = at + 1 + length_bytes
    _expect((content + lengths.astype(np.int64) + after == ends).all())
    return content


def _varints(data: NDArray[np.uint8], at: NDArray[np.int64], most: int) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """The varint at each of `at` and its length in bytes, when each is at most `most` bytes and is written in its
    fewest (as serializers write them)."""
    byte = data[at]
    if not (byte & 0x80).any():  # every one a byte: a length under 128, the usual
        return byte.astype(np.uint64), np.ones(len(at), dtype=np.int64)
    values = np.zeros(len(at), dtype=np.uint64)
    length = np.zeros(len(at), dtype=np.int64)
    going = np.ones(len(at), dtype=bool)
    for shift in range(0, 7 * most, 7):
        values |= (byte & 0x7F).astype(np.uint64) * going << np.uint64(shift)
        length += going
        going &= byte >= 0x80
        if not going.any():
            break
        byte = data[at + length]
    else:
        raise _NotUsualError
    # The shortest form: one byte more than the number of 7-bit groups below the value (the 10th byte of a
    # negative int64 included), and no zero last byte but for the value 0.
    _expect((length == 1 + np.searchsorted(_VARINT_LIMITS, values, side="right")).all())
    return values, length


def _gather(data: NDArray[np.uint8], at: NDArray[np.int64], width: int) -> NDArray[np.uint8]:
    """The `width` bytes from each of `at`, one row each (contiguous, for a view as numbers)."""
    rows: NDArray[np.uint8] = data[at[:, None] + np.arange(width)]
    return rows


def _tags(
    joined: bytes, data: NDArray[np.uint8], starts: NDArray[np.int64], lengths: NDArray[np.int64]
) -> tuple[list[str], NDArray[np.int64]]:
    """The distinct tags and each event's index into them, when every distinct one is UTF-8 (a string field must
    be)."""
    first_length = int(lengths[0])
    first = joined[int(starts[0]) : int(starts[0]) + first_length]
    if (lengths == first_length).all() and (
        _gather(data, starts, first_length) == data[starts[0] : starts[0] + first_length]
    ).all():  # the usual batch of a step: one tag
        tag_bytes = [first]
        tag_index = np.zeros(len(starts), dtype=np.int64)
    else:
        each = [joined[a:b] for a, b in zip(starts.tolist(), (starts + lengths).tolist(), strict=True)]
        indices = {tag: i for i, tag in enumerate(dict.fromkeys(each))}
        tag_bytes = list(indices)
        tag_index = np.fromiter(map(indices.__getitem__, each), dtype=np.int64, count=len(each))
    try:
        return [tag.decode() for tag in tag_bytes], tag_index
    except UnicodeDecodeError:
        raise _NotUsualError from None
