"""The daemon's batch framing, driven in-process: whole-batch passes give the bytes and the errors that framing
and checking event by event give."""

from __future__ import annotations

import math
import random
import struct

import pytest
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.compat.proto.tensor_pb2 import TensorProto

from summaryd.server.errors import EventError
from summaryd.server.records.event_check import check_and_frame
from summaryd.server.records.scalar_records import ScalarRecords
from summaryd.server.security.limits import Limits
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1.wire import frame_all


def _scalar(tag: str, value: float, step: int, wall_time: float) -> bytes:
    summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
    return Event(wall_time=wall_time, step=step, summary=summary).SerializeToString()


GOOD = _scalar("loss", 0.5, 3, 1.0)
MIXED = [
    GOOD,
    Event(wall_time=2.0, session_log=SessionLog(status=SessionLog.START)).SerializeToString(),
    _scalar("x" * 2000, 1.0, 4, 3.0),  # over a 1,024-byte event size, within the tag limit it is checked against
    Event(
        wall_time=4.0, summary=Summary(value=[Summary.Value(tag="img", image=Summary.Image(height=1))])
    ).SerializeToString(),
]
BAD = {
    "too large": b"\x0a" * 5000,
    "not an event": b"\xff\xff",
    "empty": Event(wall_time=1.0).SerializeToString(),
    "file_version": Event(wall_time=1.0, file_version="brain.Event:2").SerializeToString(),
    "nan wall time": _scalar("a", 1.0, 1, float("nan")),
    "negative wall time": _scalar("a", 1.0, 1, -1.0),
    "long tag": _scalar("t" * 3000, 1.0, 1, 1.0),
}
LIMITS = Limits(max_event_bytes=4096, max_tag_bytes=2048)


def test_a_batch_of_every_kind_is_framed_as_frame_all_frames_it() -> None:
    assert check_and_frame(MIXED, LIMITS) == frame_all(MIXED)


@pytest.mark.parametrize("kind", sorted(BAD))
def test_the_first_bad_event_is_named_as_it_is_alone(kind: str) -> None:
    with pytest.raises(EventError) as alone:
        check_and_frame([BAD[kind]], LIMITS)
    with pytest.raises(EventError) as in_batch:
        check_and_frame([*MIXED, BAD[kind], BAD["nan wall time"], BAD["empty"]], LIMITS)
    assert alone.value.index == 0
    assert in_batch.value.index == len(MIXED)
    assert str(in_batch.value).split(" ", 5)[5] == str(alone.value).split(" ", 5)[5]


def _nested_to_the_depth_limit() -> bytes:
    """An event that parses alone with not one level to spare: one level deeper, inside a batch, it does not."""
    tensor = TensorProto(dtype=21)  # DT_VARIANT
    tensor.variant_val.add(type_name="leaf")
    for _ in range(48):
        outer = TensorProto(dtype=21)
        outer.variant_val.add().tensors.append(tensor)
        tensor = outer
    data = Event(wall_time=1.0, summary=Summary(value=[Summary.Value(tag="deep", tensor=tensor)])).SerializeToString()
    Event.FromString(data)  # the event itself is good
    return data


UNDECIDED = {
    # The whole-batch parse nests every event one level deeper than a parse of the event alone.
    "nested to the depth limit": _nested_to_the_depth_limit(),
    # Field 1 (wall_time) sent length-delimited: not a wall time to `Event`, packed NaNs to a repeated double.
    "wall_time field packed": GOOD + b"\x0a\x08" + struct.pack("<d", math.nan),
}


@pytest.mark.parametrize("kind", sorted(UNDECIDED))
def test_a_good_event_the_whole_batch_checks_cannot_decide_is_written_as_it_came(kind: str) -> None:
    batch = [*MIXED, UNDECIDED[kind], GOOD]
    assert check_and_frame(batch, LIMITS) == frame_all(batch)


def test_random_scalar_columns_and_their_tails_frame_as_the_serialized_events() -> None:
    rng = random.Random(7)
    tags = ["", "a", "loss/train", "é" * 40, "t" * 200]
    scalars = [
        (
            rng.randrange(len(tags)),
            rng.choice([0.0, rng.uniform(-1e6, 1e6)]),
            rng.choice([0, rng.randrange(1 << 7), rng.randrange(1 << 35), rng.randrange(-(1 << 63), 1 << 63)]),
            rng.choice([0.0, -0.0, rng.uniform(0.0, 2e9)]),
        )
        for _ in range(3000)
    ]
    columns = pb.ScalarColumns(
        tags=tags,
        tag_index=[s[0] for s in scalars],
        value=[s[1] for s in scalars],
        step=[s[2] for s in scalars],
        wall_time=[s[3] for s in scalars],
    )
    # The value as the column holds it (float32), as the client's Event holds it.
    events = [
        _scalar(tags[which], value, step, wall)
        for (which, _, step, wall), value in zip(scalars, columns.value, strict=True)
    ]
    for start in (0, 1, 1234, 2999):
        assert ScalarRecords(columns)[start:].framed() == frame_all(events[start:])
