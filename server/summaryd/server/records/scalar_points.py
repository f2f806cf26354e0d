"""The scalar points (tag, step, wall time, value) of a batch the daemon accepted, for aggregation.

A batch of scalar columns gives them directly (no record is decoded back). Serialized events are read once more
for the write observers that read scalars (aggregation, the watch, the board's index), unless their check read
them already (a large batch of the usual events): a `Summary` value counts when it is a `simple_value`
(`add_scalar`, the hooks, Keras, `add_summary`) or a rank-0 numeric tensor (TF2's `tf.summary.scalar`, torch's
new-style scalar) that no plugin other than scalars claims.

The usual batch, every event one `simple_value` with its wall time, step and tag, is read whole: a Python loop over
each event's fields costs several microseconds an event, which the watch, on by default, would pay for every
serialized event a daemon takes. A large one is read from its bytes by numpy (`scalar_events.read_usual`, with
its check), a small one by three C parses of its events joined (`_whole_batch`). A batch the service received as
an `EventBatch` is read once, for its check and all of them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from google.protobuf.message import DecodeError, Message
from numpy.typing import NDArray
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.compat.proto.tensor_pb2 import TensorProto

from summaryd.server.records.private_messages import Kind, repeated_messages
from summaryd.server.records.scalar_events import USUAL_FROM, EventBatch, PointColumns, read_usual
from summaryd.server.records.scalar_records import ScalarRecords

Point = tuple[str, int, float, float]
"""tag, step, wall time, value"""

__all__ = ["Point", "PointColumns", "event_point_columns", "points"]

# TensorFlow's numeric dtypes (types.proto): the numpy type of `tensor_content` and the repeated field otherwise.
_DTYPES: dict[int, tuple[str, str]] = {
    1: ("<f4", "float_val"),  # DT_FLOAT
    2: ("<f8", "double_val"),  # DT_DOUBLE
    3: ("<i4", "int_val"),  # DT_INT32
    9: ("<i8", "int64_val"),  # DT_INT64
    19: ("<f2", "half_val"),  # DT_HALF
}
_SCALARS_PLUGIN = "scalars"


def points(events: Sequence[bytes]) -> Iterator[Point]:
    """The scalar points of a batch's events, in order."""
    if isinstance(events, ScalarRecords):
        return _column_points(events)
    return zip(*event_point_columns(events), strict=True)


def event_point_columns(events: Sequence[bytes]) -> PointColumns:
    """The scalar points of a batch of serialized events, as columns (read once for an `EventBatch`)."""
    if isinstance(events, EventBatch):
        if events.points is None:
            if events.usual is not None:
                events.points = events.usual.points()
            else:  # not read as usual events, or found not to be: not tried again
                events.points = _read_columns(events, try_usual=not events.read_as_usual)
        return events.points
    return _read_columns(events)


def _read_columns(events: Sequence[bytes], try_usual: bool = True) -> PointColumns:
    if len(events) >= USUAL_FROM:
        usual = read_usual(events) if try_usual else None
        whole = usual.points() if usual is not None else None
    else:
        whole = _whole_batch(events)
    if whole is not None:
        return whole
    found = list(_event_points(events))
    return PointColumns([p[0] for p in found], [p[1] for p in found], [p[2] for p in found], [p[3] for p in found])


# A batch's events joined end to end read as one message: `Event`'s wall time, step and summary (as bytes) of
# every event; a summary's values (as bytes); a value's tag and `simple_value`.
_FlatEvents, _FlatSummaries, _FlatValues = repeated_messages(
    "summaryd/server/scalar_points_flat.proto",
    "summaryd.server.records.scalar_points",
    {
        "FlatEvents": [
            ("wall_time", 1, Kind.TYPE_DOUBLE, ""),
            ("step", 2, Kind.TYPE_INT64, ""),
            ("summary", 5, Kind.TYPE_BYTES, ""),
        ],
        "FlatSummaries": [("value", 1, Kind.TYPE_BYTES, "")],
        "FlatValues": [("tag", 1, Kind.TYPE_STRING, ""), ("simple_value", 2, Kind.TYPE_FLOAT, "")],
    },
)


_VARINT_LIMITS = np.array([1 << bits for bits in range(7, 63, 7)], dtype=np.int64)


def _varint_bytes(numbers: NDArray[np.int64]) -> NDArray[np.int64]:
    """How many bytes the varint of each non-negative number takes (a negative one: 1, never its ten)."""
    return 1 + np.searchsorted(_VARINT_LIMITS, numbers, side="right")


def _whole_batch(events: Sequence[bytes]) -> PointColumns | None:
    """The points of a batch whose every event is exactly a wall time, a step and a summary of one
    `simple_value` with a tag, read by three C parses of the events joined; None for any other batch (the
    per-event reading takes it).

    Joined, the events are one message whose repeated fields hold every event's field in order; they belong to
    the events one to one when each field appears once in each event (the step none when it is 0), which the
    counts and each event's size (exactly those fields' bytes) show. What else an event's bytes could hold
    would only move that client's own points among its own events, as it could by sending other steps.
    """
    joined = _read_joined(events)
    if joined is None:
        return None
    flat, summary_sizes, value_sizes, scalars = joined
    event_sizes = _sizes(events)
    # wall_time: a tag byte and 8; summary: a tag byte, its length, its bytes; what is left is the step's: none
    # for step 0 (proto3 leaves it out), else a tag byte and its varint (a negative step's ten bytes never match).
    step_sizes = event_sizes - (9 + 1 + _varint_bytes(summary_sizes) + summary_sizes)
    stepped = step_sizes > 0
    given = np.array(flat.step, dtype=np.int64)  # type: ignore[attr-defined]
    if int(stepped.sum()) != len(given) or not (step_sizes[stepped] == 1 + _varint_bytes(given)).all():
        return None
    if not (summary_sizes == 1 + _varint_bytes(value_sizes) + value_sizes).all():
        return None
    if len(given) == len(events):
        steps: Sequence[int] = flat.step  # type: ignore[attr-defined]
    else:
        filled = np.zeros(len(events), dtype=np.int64)
        filled[stepped] = given
        steps = filled.tolist()
    # The repeated fields as they are (sequences of str and float): a copy into lists would cost more than
    # reading them once.
    return PointColumns(
        scalars.tag,  # type: ignore[attr-defined]
        steps,
        flat.wall_time,  # type: ignore[attr-defined]
        scalars.simple_value,  # type: ignore[attr-defined]
    )


def _sizes(parts: Sequence[bytes]) -> NDArray[np.int64]:
    return np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))


def _read_joined(
    events: Sequence[bytes],
) -> tuple[Message, NDArray[np.int64], NDArray[np.int64], Message] | None:
    """The batch's events read joined, with the size of each summary and each value, and the values read joined,
    when each holds one of each field counted (a step may be left out: step 0)."""
    count = len(events)
    try:
        flat = _FlatEvents.FromString(b"".join(events))
        # Each element of a repeated bytes field is copied out on every look: a list takes them out once.
        summaries = list(flat.summary)  # type: ignore[attr-defined]
        if not count or not len(flat.wall_time) == len(summaries) == count or len(flat.step) > count:  # type: ignore[attr-defined]
            return None
        values = list(_FlatSummaries.FromString(b"".join(summaries)).value)  # type: ignore[attr-defined]
        if len(values) != count:
            return None
        scalars = _FlatValues.FromString(b"".join(values))
    except DecodeError:
        return None
    if not len(scalars.tag) == len(scalars.simple_value) == count:  # type: ignore[attr-defined]
        return None
    return flat, _sizes(summaries), _sizes(values), scalars


def _event_points(events: Sequence[bytes]) -> Iterator[Point]:
    event = Event()
    for data in events:
        try:
            event.ParseFromString(data)
        except DecodeError:  # refused before it was written; never reaches here
            continue
        if not event.HasField("summary"):
            continue
        step, wall_time = event.step, event.wall_time
        for value in event.summary.value:
            number = _number(value)
            if number is not None:
                yield value.tag, step, wall_time, number


def _column_points(records: ScalarRecords) -> Iterator[Point]:
    columns, start = records.columns
    tags = records.tags
    # Slices of the packed fields are plain lists; the value column reads back exactly the float32 written.
    return zip(
        map(tags.__getitem__, columns.tag_index[start:]),
        records.steps[start:],
        columns.wall_time[start:],
        columns.value[start:],
        strict=True,
    )


def _number(value: Summary.Value) -> float | None:
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    plugin = value.metadata.plugin_data.plugin_name
    if kind != "tensor" or (plugin and plugin != _SCALARS_PLUGIN):
        return None
    return _scalar_tensor(value.tensor)


def _scalar_tensor(tensor: TensorProto) -> float | None:
    """The number a rank-0 numeric tensor holds, or None for any other tensor."""
    dtype = _DTYPES.get(tensor.dtype)
    if dtype is None or tensor.tensor_shape.dim:
        return None
    if tensor.tensor_content:
        content = np.frombuffer(tensor.tensor_content, dtype=dtype[0])
        return float(content[0]) if content.size == 1 else None
    repeated = getattr(tensor, dtype[1])
    if len(repeated) != 1:
        return None
    if dtype[1] == "half_val":  # float16 bits in an int32
        return float(np.array(repeated[0], dtype=np.uint16).view(np.float16))
    return float(repeated[0])
