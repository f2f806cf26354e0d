"""Scalar events built from a batch's columns (`WriteRequest.scalars`), byte for byte as a client serializes them.

A client's scalar event is `Event{wall_time, step, summary{value{tag, simple_value}}}`, serialized by protobuf in
field order with proto3's rules: `wall_time` and `step` are left out when zero, `tag` when empty, and
`simple_value` (a member of a oneof) is always written. Everything after `step` depends on the tag alone, so it
is kept per tag (`_template`). A batch's records are built together with numpy (`_Layout`): records of one
shape as the rows of one byte matrix, their CRC-32Cs from the CRC's linearity (`crc_columns`), so that no
Python runs per record.
"""

from __future__ import annotations

import functools
import itertools
import struct
import threading
from collections.abc import Iterator, Sequence
from typing import NamedTuple, TypeVar, overload

import google_crc32c
import numpy as np
from numpy.typing import NDArray

from summaryd.server.errors import EventError
from summaryd.server.records.crc_columns import column_crcs, linear_crc, varying_bytes
from summaryd.server.security.limits import DEFAULT, Limits
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1.wire import column_steps, frame, header

_DOUBLE = struct.Struct("<d")
_MASK_DELTA = 0xA282EAD8  # TFRecord's CRC mask (see `wire.masked_crc32c`)
_FLOAT = struct.Struct("<f")
_CRC = struct.Struct("<I")  # a record's masked CRC-32C (`wire.footer`)
_U32 = 0xFFFFFFFF
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


class ScalarArrays(NamedTuple):
    """A batch's scalar columns (from its first scalar on) as numpy arrays."""

    tag_index: NDArray[np.int64]
    steps: NDArray[np.int64]
    wall_times: NDArray[np.float64]
    values: NDArray[np.float32]


class ScalarRecords(Sequence[bytes]):
    """The serialized events of a batch's scalar columns (or a tail of them), built when framed."""

    def __init__(self, columns: pb.ScalarColumns, start: int = 0) -> None:
        self._columns = columns
        self._start = start
        # The steps' field and the length, read once: a batch's length is asked for some ten times on its way
        # (checks, counts, the observers), and each read of a repeated field costs a lookup of the field and a
        # wrapper; the steps are in one of two fields (`wire.column_steps`), so each read would be two.
        self._steps = column_steps(columns)
        self._length = len(self._steps) - start
        self._tags: tuple[str, ...] | None = None
        # The columns as numpy arrays, once framing read them (a large batch, or one framed with others): the write
        # observers that want them need not read the columns again.
        self.arrays: ScalarArrays | None = None

    def __len__(self) -> int:
        return self._length

    @property
    def tags(self) -> tuple[str, ...]:
        """The batch's tag table, read out of the message once: each read of the field makes every string anew,
        and framing, the watch and aggregation each want them."""
        if self._tags is None:
            self._tags = tuple(self._columns.tags)
        return self._tags

    @property
    def columns(self) -> tuple[pb.ScalarColumns, int]:
        """The batch's columns and the index in them of this sequence's first scalar."""
        return self._columns, self._start

    @property
    def steps(self) -> Sequence[int]:
        """The batch's whole step column, whichever field carries it (this sequence starts at `columns`' index)."""
        return self._steps

    def column_arrays(self) -> ScalarArrays:
        """The columns as numpy arrays: those framing read, else read now."""
        if self.arrays is None:
            columns, start = self._columns, self._start
            self.arrays = ScalarArrays(
                np.asarray(columns.tag_index, dtype=np.int64)[start:],
                np.asarray(self._steps, dtype=np.int64)[start:],
                np.asarray(columns.wall_time, dtype=np.float64)[start:],
                np.asarray(columns.value, dtype=np.float32)[start:],
            )
        return self.arrays

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
        return self._records(self._start, len(self._steps))

    def _records(self, start: int, stop: int) -> Iterator[bytes]:
        columns = self._columns
        templates = [_template(tag) for tag in self.tags]
        float_pack = _FLOAT.pack
        # The columns sliced into lists first: indexing a repeated field per element costs more than the record.
        for wall_time, step, which, value in zip(
            columns.wall_time[start:stop],
            self._steps[start:stop],
            columns.tag_index[start:stop],
            columns.value[start:stop],
            strict=True,
        ):
            yield _wall_time_field(wall_time) + _step_field(step) + templates[which] + float_pack(value)

    def framed(self, limits: Limits = DEFAULT) -> bytes:
        """Check every scalar and return the records framed as one blob, ready for one write.

        The checks, the record bytes and their CRC-32Cs are numpy operations over the whole batch (see
        `_Layout`); nothing is a call per record.

        Raises:
            EventError: naming the first bad scalar (its index in this sequence) and what is wrong with it.
        """
        columns, start = self._columns, self._start
        if len(self) == 0:
            return b""
        if len(self) <= _FEW_SCALARS:
            blob = self._framed_each(limits)
            if blob is not None:
                return blob
        tags = list(self.tags)
        # The columns are read whole (numpy copies a packed field at C speed) and cut here, not in protobuf.
        tag_index = np.asarray(columns.tag_index, dtype=np.int64)[start:]
        wall = np.asarray(columns.wall_time, dtype=np.float64)[start:]
        problems = self._problems(tags, tag_index, wall, limits)
        if problems:
            raise min(problems, key=lambda problem: problem.index)
        steps = np.asarray(self._steps, dtype=np.int64)[start:].view(np.uint64)
        values = np.asarray(columns.value, dtype=np.float32)[start:]
        self.arrays = ScalarArrays(tag_index, steps.view(np.int64), wall, values)
        layout = _Layout(tags, tag_index, steps, wall, values)
        if layout.widest > limits.max_event_bytes:
            lengths = layout.lengths()
            over = np.flatnonzero(lengths > limits.max_event_bytes)
            if over.size:
                index = int(over[0])
                raise EventError(
                    index,
                    f"is {int(lengths[index])} bytes, over the limit of {limits.max_event_bytes} bytes "
                    "(--max-event-bytes)",
                )
        return layout.framed()

    def _framed_each(self, limits: Limits) -> bytes | None:
        """The records of a small batch built one by one (numpy's fixed cost per call, some twenty calls per
        batch, is more than a few dozen records cost in Python); None when a check fails, for `framed`'s own
        checks to name the first bad scalar."""
        columns, start = self._columns, self._start
        tags = self.tags
        wall_times = columns.wall_time[start:]
        tag_index = columns.tag_index[start:]
        if not all(0.0 <= wall_time < _INFINITY for wall_time in wall_times):  # NaN fails too
            return None
        if max(tag_index) >= len(tags) or (
            max(map(len, tags)) * 4 > limits.max_tag_bytes
            and any(len(tag.encode()) > limits.max_tag_bytes for tag in tags)
        ):
            return None
        # As `frame_all` of `_records`, in one loop: a batch's scalars share their wall time and step in runs (a
        # step's tags), whose fields are built once a run, and each record's CRC is masked inline.
        templates = [_template(tag) for tag in tags]
        float_pack, crc_pack, crc_of = _FLOAT.pack, _CRC.pack, google_crc32c.value
        parts: list[bytes] = []
        fields, field_step, field_wall = b"", None, 0.0  # the wall time and step fields, and what they are of
        stop = len(self._steps)
        for wall_time, step, which, value in zip(
            columns.wall_time[start:stop],
            self._steps[start:stop],
            columns.tag_index[start:stop],
            columns.value[start:stop],
            strict=True,
        ):
            if step != field_step or wall_time != field_wall or not wall_time:  # 0.0 == -0.0, written apart
                fields, field_step, field_wall = _wall_time_field(wall_time) + _step_field(step), step, wall_time
            record = fields + templates[which] + float_pack(value)
            crc = crc_of(record)
            parts += (header(len(record)), record, crc_pack((((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32))
        if max(map(len, parts[1::3])) > limits.max_event_bytes:
            return None
        return b"".join(parts)

    @staticmethod
    def _problems(
        tags: list[str], tag_index: NDArray[np.int64], wall_times: NDArray[np.float64], limits: Limits
    ) -> list[EventError]:
        """The first scalar failing each check (the caller raises the earliest)."""
        problems: list[EventError] = []
        # Each check first answers "any?" in one reduction; only a failing one looks for its first scalar.
        if int(tag_index.max()) >= len(tags):
            index = int(np.flatnonzero(tag_index >= len(tags))[0])
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
        if wall_times.min() >= 0.0 and wall_times.max() < np.inf:  # NaN fails both
            return problems
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(~((wall_times >= 0.0) & (wall_times < np.inf)))
        if bad.size:
            index = int(bad[0])
            problems.append(
                EventError(index, f"has wall_time {float(wall_times[index])}; use the client's clock in seconds")
            )
        return problems


def framed_together(batches: Sequence[ScalarRecords], limits: Limits = DEFAULT) -> list[bytes] | None:
    """Each batch's blob, as its own `framed` would return it, built in one numpy pass over their columns joined.

    A group commit takes many small batches at once (a rank's step of 20 scalars each): framed one by one they
    cost some 2.5 µs a record in Python; joined, the batches cost what one large batch costs (`_Layout`), about
    a third. None when a batch fails a check, for each batch's own `framed` to name its bad scalar.
    """
    if not batches:
        return []
    index: dict[str, int] = {}  # the batches' tags, each once
    tables: dict[tuple[str, ...], int] = {}  # each distinct tag list: where its global indices start in `flat`
    flat: list[int] = []
    bases: list[int] = []
    counts: list[int] = []
    tag_counts: list[int] = []
    joined = _Joined()
    for batch in batches:
        columns, start = batch.columns
        step_column = batch.steps
        count = len(step_column)
        if start >= count or not len(columns.tag_index) == count == len(columns.wall_time) == len(columns.value):
            # An empty batch, or columns of unequal lengths (refused by the request checks before this): joined,
            # two such would shift each other's points.
            return None
        tags = batch.tags
        base = tables.get(tags)
        if base is None:
            base = tables[tags] = len(flat)
            flat.extend(index.setdefault(tag, len(index)) for tag in tags)
        bases.append(base)
        counts.append(count - start)
        tag_counts.append(len(tags))
        joined.add(columns, step_column, start)
    local, steps, wall_times, values = joined.arrays()
    sizes = np.array(counts, dtype=np.int64)
    # Each batch's tag indices within its own tags (beyond them, one would read the next batch's table), then the
    # checks `framed` makes, over the tags joined.
    if (local >= np.repeat(np.array(tag_counts, dtype=np.int64), sizes)).any() or (local < 0).any():
        return None
    global_index = np.array(flat, dtype=np.int64)[local + np.repeat(np.array(bases, dtype=np.int64), sizes)]
    joined_tags = list(index)
    if ScalarRecords._problems(joined_tags, global_index, wall_times, limits):
        return None
    layout = _Layout(joined_tags, global_index, steps.view(np.uint64), wall_times, values)
    if layout.widest > limits.max_event_bytes and (layout.lengths() > limits.max_event_bytes).any():
        return None
    blob = layout.framed()
    # Each batch's records end where the framed sizes of it and the batches before it add up to.
    last = np.cumsum(sizes)
    ends = np.cumsum(layout.lengths() + 16)[last - 1].tolist()
    # Each batch keeps its slice of the joined columns (views), for the write observers (aggregation).
    for batch, first, stop in zip(batches, (last - sizes).tolist(), last.tolist(), strict=True):
        batch.arrays = ScalarArrays(local[first:stop], steps[first:stop], wall_times[first:stop], values[first:stop])
    return [blob[begin:end] for begin, end in zip([0, *ends[:-1]], ends, strict=True)]


class _Joined:
    """The columns of many batches joined in order, as numpy arrays: a small batch's slices gathered into lists
    (one conversion for a run of them), a large one copied by numpy from its packed fields (at C speed, but at a
    fixed cost per call that a slice of a few dozen values does not have)."""

    _NUMPY_FROM = 64  # scalars in a batch from which its fields are copied by numpy

    def __init__(self) -> None:
        self._index_chunks: list[NDArray[np.int64]] = []
        self._step_chunks: list[NDArray[np.int64]] = []
        self._wall_chunks: list[NDArray[np.float64]] = []
        self._value_chunks: list[NDArray[np.float32]] = []
        self._tag_index: list[int] = []
        self._steps: list[int] = []
        self._wall: list[float] = []
        self._values: list[float] = []

    def add(self, columns: pb.ScalarColumns, steps: Sequence[int], start: int) -> None:
        """The scalars of `columns` (whose step column is `steps`) from `start` on."""
        if len(steps) - start < self._NUMPY_FROM:
            self._tag_index += columns.tag_index[start:]
            self._steps += steps[start:]
            self._wall += columns.wall_time[start:]
            self._values += columns.value[start:]
            return
        self._flush()
        self._index_chunks.append(np.asarray(columns.tag_index, dtype=np.int64)[start:])
        self._step_chunks.append(np.asarray(steps, dtype=np.int64)[start:])
        self._wall_chunks.append(np.asarray(columns.wall_time, dtype=np.float64)[start:])
        self._value_chunks.append(np.asarray(columns.value, dtype=np.float32)[start:])

    def _flush(self) -> None:
        if self._steps:
            self._index_chunks.append(np.array(self._tag_index, dtype=np.int64))
            self._step_chunks.append(np.array(self._steps, dtype=np.int64))
            self._wall_chunks.append(np.array(self._wall, dtype=np.float64))
            self._value_chunks.append(np.array(self._values, dtype=np.float32))
            self._tag_index, self._steps, self._wall, self._values = [], [], [], []

    def arrays(self) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64], NDArray[np.float32]]:
        """Tag indices, steps, wall times and values (of unequal lengths when a batch's columns are: the caller
        checks)."""
        self._flush()
        return (
            _concatenated(self._index_chunks),
            _concatenated(self._step_chunks),
            _concatenated(self._wall_chunks),
            _concatenated(self._value_chunks),
        )


_Item = TypeVar("_Item", bound=np.generic)


def _concatenated(chunks: list[NDArray[_Item]]) -> NDArray[_Item]:
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)


_VARINT_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)  # an int64's varint has up to 10 bytes of 7 bits
_VARINT_BOUNDS = np.array([1 << (7 * k) for k in range(10)], dtype=np.uint64)  # each adds a varint byte
_FEW_SCALARS = 128  # up to which a batch's records are built one by one (`ScalarRecords._framed_each`)
_INFINITY = float("inf")
_FEW_RUNS = 256  # scalars per run of one shape, on average, from which runs are built one by one in order


class _Scratch(threading.local):
    """A thread's buffer for building blobs in, kept between batches: memory fresh from the system costs a page
    fault per page on first touch, more than building the records in it."""

    _KEPT_BYTES = 16 * 1024 * 1024  # a larger buffer is made for its batch alone

    def __init__(self) -> None:
        self._buffer = bytearray()

    def buffer(self, size: int) -> bytearray:
        """At least `size` bytes to write over (the views of the last batch's records may still hold the old
        buffer: it is replaced, never resized)."""
        if len(self._buffer) >= size:
            return self._buffer
        fresh = bytearray(size)
        if size <= self._KEPT_BYTES:
            self._buffer = fresh
        return fresh


_BLOBS, _GROUPS = _Scratch(), _Scratch()


class _Layout:
    """A batch's framed records, built as dense byte matrices, one per group of records of one shape.

    A framed scalar record is `header | wall_time field | step field | tag template | value | footer`. Records
    of one shape (wall time written or not, the step's varint size, the template's size) have the same layout,
    so a group of them is an (n, record size) byte matrix: every row starts as the group's first record (one
    bytes repetition), and the fields that differ between rows are written over it, each as one unaligned
    integer per row; the matrix read in row order is the records back to back. A group's CRCs are one
    google-crc32c call and a table gather per byte column that varies in it (`crc_columns`). A batch has few
    shapes and they come in runs (steps cross a varint size rarely): each run is a group, built in place in the
    blob; when shapes interleave (tags of several sizes), records are grouped by shape, each group's rows are put
    in their records' rows of a matrix as wide as the widest record, and the bytes each uses are read out.
    """

    def __init__(
        self,
        tags: list[str],
        tag_index: NDArray[np.int64],
        steps: NDArray[np.uint64],
        wall: NDArray[np.float64],
        values: NDArray[np.float32],
    ) -> None:
        self._templates = tuple(_template(tag) for tag in tags)  # the key of `_template_words`, `_template_terms`
        self._tag_index, self._steps = tag_index, steps
        self._wall, self._values = wall.astype("<f8", copy=False), values.astype("<f4", copy=False)
        self._has_wall = wall.view(np.uint64) != 0  # only +0.0 is left out, -0.0 is written
        self._varint = np.searchsorted(_VARINT_BOUNDS, steps, side="right")  # 0 for step 0: no field
        self._shapes = self._varint * 2 + self._has_wall
        if len(tags) > 1:
            sizes = np.fromiter(map(len, self._templates), dtype=np.int64, count=len(self._templates))
            self._shapes += sizes[tag_index] * 32
        self.widest = 9 + 11 + max(map(len, self._templates)) + 4
        """The most bytes a record of this batch can have."""

    def lengths(self) -> NDArray[np.int64]:
        """Each record's size."""
        sizes = np.fromiter(map(len, self._templates), dtype=np.int64, count=len(self._templates))
        step_size = np.where(self._varint == 0, 0, self._varint + 1)
        lengths: NDArray[np.int64] = self._has_wall * 9 + step_size + sizes[self._tag_index] + 4
        return lengths

    def _length(self, record: int) -> int:
        """The size of record `record` (and every record of its shape)."""
        varint = int(self._varint[record])
        template = self._templates[int(self._tag_index[record])]
        return 9 * bool(self._has_wall[record]) + (varint + 1 if varint else 0) + len(template) + 4

    def framed(self) -> bytes:
        """The records framed as one blob."""
        shapes = self._shapes
        edges = np.flatnonzero(shapes[1:] != shapes[:-1]) + 1
        if len(edges) * _FEW_RUNS < len(shapes):
            bounds = [0, *edges.tolist(), len(shapes)]
            runs = list(itertools.pairwise(bounds))
            total = sum((self._length(first) + 16) * (stop - first) for first, stop in runs)
            blob = _BLOBS.buffer(total)
            at = 0
            for first, stop in runs:
                at += self._group(first, slice(first, stop), blob, at).nbytes
            with memoryview(blob) as view:
                return view[:total].tobytes()
        # Shapes interleave: each group's rows go to its records' rows of a matrix as wide as the widest record,
        # and the bytes each record uses, read in row order, are the blob.
        sizes = self.lengths() + 16
        count, widest = len(sizes), int(sizes.max())
        padded = np.frombuffer(_BLOBS.buffer(count * widest), dtype=np.uint8, count=count * widest)
        padded = padded.reshape(count, widest)
        order = np.argsort(shapes, kind="stable")
        firsts = np.flatnonzero(np.diff(shapes[order], prepend=-1))
        for group in np.split(order, firsts[1:]):
            buffer = _GROUPS.buffer(int(sizes[group[0]]) * len(group))
            records = self._group(int(group[0]), group, buffer, 0)
            padded[group, : records.shape[1]] = records
        used: NDArray[np.uint8] = padded[np.arange(widest) < sizes[:, None]]
        return used.tobytes()

    def _group(self, first: int, which: slice | NDArray[np.intp], blob: bytearray, at: int) -> NDArray[np.uint8]:
        """The framed records of one shape (that of the batch's record `first`), one per row, built in `blob`
        from byte `at` on: the records `which` (a run of the batch or its records of that shape)."""
        tag_index, steps, wall, values = (
            self._tag_index[which],
            self._steps[which],
            self._wall[which],
            self._values[which],
        )
        count, length, varint = len(steps), self._length(first), int(self._varint[first])
        has_wall = bool(self._has_wall[first])
        template = self._templates[int(tag_index[0])]
        record = (
            (_WALL_TIME_TAG + wall[:1].tobytes() if has_wall else b"")
            + _step_field(int(steps[0].view(np.int64)))
            + template
            + values[:1].tobytes()
        )
        size = 12 + length + 4
        blob[at : at + size * count] = frame(record) if count == 1 else (header(length) + record + bytes(4)) * count
        rows = np.frombuffer(blob, dtype=np.uint8, count=size * count, offset=at).reshape(count, size)
        if count == 1:  # a record alone in its shape (as step 0 is), framed as it is
            return rows
        varying: list[int] = []  # the data's columns that may differ between rows
        step_at = 9 if has_wall else 0  # where the step's field starts in the data
        wall_bytes = varying_bytes(wall.view("<u8"), 8) if has_wall else []
        if wall_bytes:
            _field(rows, 13, "<u8")[:] = wall.view("<u8")
            varying += [1 + piece for piece in wall_bytes]
        step_pieces = varying_bytes(steps, varint, bits=7)
        if step_pieces:
            self._write_varint(rows, 13 + step_at, varint, steps)
            varying += [step_at + 1 + piece for piece in step_pieces]
        if len(self._templates) > 1:  # the first row's template is every row's: write the others' differences
            offset = 8 + length - len(template)
            for start, words in _template_words(self._templates, len(template)):
                _field(rows, offset + start, words.dtype.str)[:] = words.take(tag_index)
        value_bytes = varying_bytes(values.view("<u4"), 4)
        if value_bytes:
            _field(rows, 8 + length, "<u4")[:] = values.view("<u4")
            varying += [length - 4 + piece for piece in value_bytes]
        crcs = column_crcs(rows[:, 12 : 12 + length], varying)
        if len(self._templates) > 1 and (tag_index != tag_index[0]).any():
            # Templates of one size but other tags: their bytes' share of the CRC, against the first row's.
            terms = _template_terms(self._templates)
            crcs ^= terms.take(tag_index) ^ terms[tag_index[0]]
        masked = ((crcs >> np.uint32(15)) | (crcs << np.uint32(17))) + np.uint32(_MASK_DELTA)
        _field(rows, 12 + length, "<u4")[:] = masked
        return rows

    @staticmethod
    def _write_varint(rows: NDArray[np.uint8], offset: int, size: int, steps: NDArray[np.uint64]) -> None:
        """Write each row's step as a varint of `size` bytes at `offset` (the bytes after it keep the first row's)."""
        if size > 8:  # steps of 2**56 and beyond, negative ones: rare, byte by byte
            pieces = (steps[:, None] >> _VARINT_SHIFTS[:size]) & np.uint64(0x7F)
            pieces[:, :-1] |= np.uint64(0x80)  # every byte but the last continues
            rows[:, offset : offset + size] = pieces.astype(np.uint8)
            return
        # One little-endian word per row: the varint's bytes, then the first row's bytes that follow it.
        after = int.from_bytes(rows[0, offset + size : offset + 8].tobytes(), "little") << (8 * size)
        continues = int.from_bytes(b"\x80" * (size - 1), "little")  # every byte but the last continues
        words = steps & np.uint64(0x7F)
        for piece in range(1, size):
            words |= ((steps >> np.uint64(7 * piece)) & np.uint64(0x7F)) << np.uint64(8 * piece)
        words |= np.uint64(after | continues)
        _field(rows, offset, "<u8")[:] = words


# Per table of templates: a batch's tags are a job's tags, the same batch after batch (and a group commit's
# batches joined have the same table), so these are made once, not per batch.
@functools.lru_cache(maxsize=256)
def _template_words(templates: tuple[bytes, ...], size: int) -> list[tuple[int, NDArray[np.generic]]]:
    """Where the templates of `size` bytes differ between tags, as words to write over a record's first
    template: `(offset in the template, each tag's 8 bytes there)`, the last one ending at the template's end."""
    table = np.zeros((len(templates), size), dtype=np.uint8)
    rows = [row for row, template in enumerate(templates) if len(template) == size]
    table[rows] = np.frombuffer(b"".join(templates[row] for row in rows), dtype=np.uint8).reshape(len(rows), size)
    differ = np.flatnonzero((table[rows] != table[rows[0]]).any(axis=0)).tolist()
    # Two tags' templates of one size are 8 bytes or more (under 8 is the empty tag's alone).
    starts = range(differ[0], differ[-1] + 1, 8) if differ else range(0)
    words = [
        (start, np.ascontiguousarray(table[:, start : start + 8]).view("<u8").ravel())
        for start in (min(start, size - 8) for start in starts)
    ]
    for _, column in words:
        column.flags.writeable = False  # shared by every batch of the table
    return words


@functools.lru_cache(maxsize=256)
def _template_terms(templates: tuple[bytes, ...]) -> NDArray[np.uint32]:
    """Each tag template's share of its record's CRC-32C (`_template_term`)."""
    terms = np.fromiter(map(_template_term, templates), dtype=np.uint32, count=len(templates))
    terms.flags.writeable = False  # shared by every batch of the table
    return terms


@functools.lru_cache(maxsize=65536)
def _template_term(template: bytes) -> int:
    """A tag template's share of its record's CRC-32C (four bytes, the value's, follow it)."""
    return linear_crc(template + bytes(4))


def _field(rows: NDArray[np.uint8], offset: int, dtype: str) -> NDArray[np.generic]:
    """A view of one `dtype` value per row of `rows`, at byte `offset` of each row (unaligned as it may be)."""
    return np.ndarray((len(rows),), dtype=dtype, buffer=rows, offset=offset, strides=(rows.shape[1],))
