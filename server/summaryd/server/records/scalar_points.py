"""The scalar points (tag, step, wall time, value) of a batch the daemon accepted, for aggregation.

A batch of scalar columns gives them directly (no record is decoded back). Serialized events are parsed once
more, only for aggregated sessions: a `Summary` value counts when it is a `simple_value` (`add_scalar`, the
hooks, Keras, `add_summary`) or a rank-0 numeric tensor (TF2's `tf.summary.scalar`, torch's new-style scalar)
that no plugin other than scalars claims.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from google.protobuf.message import DecodeError
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.compat.proto.tensor_pb2 import TensorProto

from summaryd.server.records.scalar_records import ScalarRecords

Point = tuple[str, int, float, float]
"""tag, step, wall time, value"""

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
    return _event_points(events)


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
    tags = list(columns.tags)
    # Slices of the packed fields are plain lists; the value column reads back exactly the float32 written.
    return zip(
        map(tags.__getitem__, columns.tag_index[start:]),
        columns.step[start:],
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
