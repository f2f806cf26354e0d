"""Scalar events built from a batch's columns (`WriteRequest.scalars`), byte for byte as a client serializes them.

A client's scalar event is `Event{wall_time, step, summary{value{tag, simple_value}}}`, serialized by protobuf in
field order with proto3's rules: `wall_time` and `step` are left out when zero, `tag` when empty, and
`simple_value` (a member of a oneof) is always written. Everything after `step` depends on the tag alone, so it
is kept per tag (`_template`); a batch's records are built together with numpy (`_Layout`), and a record's
own cost is one CRC-32C of its bytes.
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
_MASK_DELTA = 0xA282EAD8  # TFRecord's CRC mask (see `wire.masked_crc32c`)
_FLOAT = struct.Struct("<f")
_WALL_TIME_TAG = b"\x09"  # Event.wall_time: field 1, 64-bit
_STEP_TAG = b"\x10"  # Event.step: field 2, varint
_U64 = (1 << 64) - 1
_U32 = 0xFFFFFFFF


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

    @property
    def columns(self) -> tuple[pb.ScalarColumns, int]:
        """The batch's columns and the index in them of this sequence's first scalar."""
        return self._columns, self._start

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

        The checks and the record bytes are numpy operations over the whole batch (see `_Layout`); per record,
        only its CRC-32C is a call.

        Raises:
            EventError: naming the first bad scalar (its index in this sequence) and what is wrong with it.
        """
        columns, start = self._columns, self._start
        if len(self) == 0:
            return b""
        tags = list(columns.tags)
        # The columns are read whole (numpy copies a packed field at C speed) and cut here, not in protobuf.
        tag_index = np.asarray(columns.tag_index, dtype=np.int64)[start:]
        wall = np.asarray(columns.wall_time, dtype=np.float64)[start:]
        problems = self._problems(tags, tag_index, wall, limits)
        if problems:
            raise min(problems, key=lambda problem: problem.index)
        steps = np.asarray(columns.step, dtype=np.int64)[start:].view(np.uint64)
        values = np.asarray(columns.value, dtype=np.float32)[start:]
        layout = _Layout(tags, tag_index, steps, wall)
        over = np.flatnonzero(layout.lengths > limits.max_event_bytes)
        if over.size:
            index = int(over[0])
            raise EventError(
                index,
                f"is {int(layout.lengths[index])} bytes, over the limit of {limits.max_event_bytes} bytes "
                "(--max-event-bytes)",
            )
        return layout.framed(steps, wall, values)

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


_VARINT = np.arange(10)  # an int64's varint has up to 10 bytes
_VARINT_SHIFTS = (_VARINT * 7).astype(np.uint64)
_VARINT_STEPS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)  # each adds a varint byte
_STEP_SLOT = np.arange(11)  # the step's key and varint


class _Layout:
    """A batch's framed records, built for the whole batch at once as rows of fixed-width slots.

    A framed scalar record is `header | wall_time field | step field | tag template | value | footer`. Each
    record is a row of a byte matrix with one slot per part, as wide as the widest that part gets in the batch;
    every part is written for all rows by a column assignment, a mask says which bytes of each slot a record
    uses, and the masked matrix read in row order is the records' bytes back to back. Only the CRC-32C of each
    record is a call per record (google-crc32c has no batch API), on its data read straight from its row
    (`_crcs`), before the footers are written and the matrix is read out once.
    """

    def __init__(
        self, tags: list[str], tag_index: NDArray[np.int64], steps: NDArray[np.uint64], wall: NDArray[np.float64]
    ) -> None:
        templates = [_template(tag) for tag in tags]
        sizes = np.fromiter(map(len, templates), dtype=np.int64, count=len(templates))
        widest = int(sizes.max())
        table = np.zeros((len(templates), widest), dtype=np.uint8)
        for row, template in enumerate(templates):
            table[row, : len(template)] = np.frombuffer(template, dtype=np.uint8)
        self._table, self._tag_index = table, tag_index
        self._template_size = sizes[tag_index]
        self._has_wall = wall.view(np.uint64) != 0  # only +0.0 is left out, -0.0 is written
        varint = 1 + (steps[:, None] >= _VARINT_STEPS).sum(axis=1)
        self._varint = np.where(steps == 0, 0, varint)
        self._step_size = np.where(steps == 0, 0, 1 + varint)
        self.lengths: NDArray[np.int64] = self._has_wall * 9 + self._step_size + self._template_size + 4

    def framed(self, steps: NDArray[np.uint64], wall: NDArray[np.float64], values: NDArray[np.float32]) -> bytes:
        """The records framed as one blob."""
        count = len(self.lengths)
        widest = self._table.shape[1]
        rows = np.zeros((count, 12 + 9 + 11 + widest + 4 + 4), dtype=np.uint8)
        used = np.ones(rows.shape, dtype=np.bool_)
        # A batch's records come in few lengths: one cached header each, looked up by length.
        sizes = np.flatnonzero(np.bincount(self.lengths))
        headers = np.zeros((int(sizes[-1]) + 1, 12), dtype=np.uint8)
        headers[sizes] = np.frombuffer(b"".join(header(size) for size in sizes.tolist()), dtype=np.uint8).reshape(
            -1, 12
        )
        rows[:, :12] = headers[self.lengths]
        rows[:, 12] = 0x09  # Event.wall_time: field 1, 64-bit
        rows[:, 13:21] = wall.astype("<f8").view(np.uint8).reshape(-1, 8)
        used[:, 12:21] = self._has_wall[:, None]
        rows[:, 21] = 0x10  # Event.step: field 2, varint
        varint = ((steps[:, None] >> _VARINT_SHIFTS) & np.uint64(0x7F)).astype(np.uint8)
        varint |= ((self._varint - 1)[:, None] > _VARINT).view(np.uint8) << 7  # every byte but the last continues
        rows[:, 22:32] = varint
        used[:, 21:32] = self._step_size[:, None] > _STEP_SLOT
        rows[:, 32 : 32 + widest] = self._table[self._tag_index]
        used[:, 32 : 32 + widest] = np.arange(widest) < self._template_size[:, None]
        rows[:, 32 + widest : 36 + widest] = values.astype("<f4").view(np.uint8).reshape(-1, 4)
        footer = 36 + widest
        crcs = self._crcs(rows[:, 12:footer], used[:, 12:footer])
        masked = (((crcs >> np.uint64(15)) | (crcs << np.uint64(17))) + np.uint64(_MASK_DELTA)) & np.uint64(_U32)
        rows[:, footer:] = masked.astype("<u4").view(np.uint8).reshape(-1, 4)
        return rows[used].tobytes()

    def _crcs(self, data: NDArray[np.uint8], used: NDArray[np.bool_]) -> NDArray[np.uint64]:
        """The CRC-32C of each record's data (its used bytes of `data`), one call per record.

        Records of one shape (wall time or not, the step's and the template's sizes) use the same bytes of their
        row: those columns of their rows, read as one fixed-size value each, are their data as `bytes` objects
        without a slice per record. A batch has few shapes."""
        shapes = self._has_wall * 1_000_000 + self._step_size * 1_000 + self._template_size
        if (shapes == shapes[0]).all():  # the usual batch: one shape, no grouping
            return self._shape_crcs(data, used[0])
        crcs = np.empty(len(shapes), dtype=np.uint64)
        kinds, first, which = np.unique(shapes, return_index=True, return_inverse=True)
        for kind in range(len(kinds)):
            rows = np.flatnonzero(which == kind)
            crcs[rows] = self._shape_crcs(data[rows], used[first[kind]])
        return crcs

    @staticmethod
    def _shape_crcs(data: NDArray[np.uint8], used: NDArray[np.bool_]) -> NDArray[np.uint64]:
        """The CRC-32C of rows of one shape, whose data is the bytes `used` marks in each row."""
        columns = np.flatnonzero(used)
        records = np.ascontiguousarray(data[:, columns]).view(f"V{len(columns)}").ravel().tolist()
        return np.fromiter(map(google_crc32c.value, records), dtype=np.uint64, count=len(records))
