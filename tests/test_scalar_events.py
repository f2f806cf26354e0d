"""The usual scalar events read from their bytes: a batch is taken only when every event is exactly the usual
layout, and then its points, its check and its errors are what parsing each event gives."""

from __future__ import annotations

import math
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from summaryd.server.errors import EventError
from summaryd.server.records import event_check, scalar_points
from summaryd.server.records.event_check import check_and_frame
from summaryd.server.records.scalar_events import USUAL_FROM, EventBatch, read_usual
from summaryd.server.records.scalar_points import event_point_columns
from summaryd.server.security.limits import Limits
from summaryd.v1.wire import frame_all

LIMITS = Limits(max_event_bytes=4096, max_tag_bytes=64)


def _usual(tag: str, step: int, wall_time: float, value: float) -> bytes:
    summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
    return Event(wall_time=wall_time, step=step, summary=summary).SerializeToString()


def _overlong(data: bytes, at: int) -> bytes:
    """The one-byte length at `at` written in two bytes: valid protobuf, never what a serializer writes."""
    return data[:at] + bytes([data[at] | 0x80, 0]) + data[at + 1 :]


@st.composite
def _event(draw: st.DrawFn) -> bytes:
    """The usual event, or one changed the ways a client's bytes could differ from it."""
    tag = draw(st.sampled_from(["loss", "acc", "lr/group-0", "", "损失", "t" * 70]))
    step = draw(st.one_of(st.integers(0, 300), st.integers(-(2**63), 2**63 - 1)))
    wall_time = draw(st.one_of(st.floats(0, 2e9), st.sampled_from([math.nan, -1.0, math.inf])))
    value = draw(st.floats(width=32, allow_nan=True, allow_infinity=True))
    data = _usual(tag, step, wall_time, value)
    change = draw(
        st.sampled_from(
            ["none", "none", "none", "byte", "key", "cut", "grow", "overlong", "utf8", "extra", "two", "merged"]
        )
    )
    if change == "byte" and data:
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    elif change == "key":  # the value's float under another field's key
        data = data[:-5] + bytes([draw(st.integers(0, 255))]) + data[-4:]
    elif change == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    elif change == "grow":
        data += bytes(draw(st.lists(st.integers(0, 255), min_size=1, max_size=3)))
    elif change == "overlong" and len(data) > 12:
        data = _overlong(data, len(data) - 1 - data[::-1].index(0x2A) + 1)  # the summary's length
    elif change == "utf8" and tag:
        start = data.index(tag.encode())
        data = data[:start] + b"\xff" + data[start + 1 :]
    elif change == "extra":  # the event's source_metadata: a field the layout does not have
        data += Event(source_metadata={"writer": "x"}).SerializeToString()
    elif change == "two":  # a second value in the summary
        data = Event(
            wall_time=wall_time,
            step=step,
            summary=Summary(value=[Summary.Value(tag=tag, simple_value=value), Summary.Value(tag="b", simple_value=1)]),
        ).SerializeToString()
    elif change == "merged":  # two events' bytes as one
        data += _usual("m", 1, 1.0, 1.0)
    return data


def _parsed_points(events: list[bytes]) -> list[tuple[str, int, float, float]] | None:
    """Each event's one point as its own parse gives it, or None when an event is not one scalar."""
    found = []
    for data in events:
        try:
            event = Event.FromString(data)
        except Exception:
            return None
        values = event.summary.value
        if len(values) != 1 or values[0].WhichOneof("value") != "simple_value":
            return None
        found.append((values[0].tag, event.step, event.wall_time, values[0].simple_value))
    return found


@settings(max_examples=300, deadline=None)
@given(st.lists(_event(), min_size=1, max_size=8))
def test_a_batch_read_so_holds_exactly_what_each_event_parsed_holds(events: list[bytes]) -> None:
    usual = read_usual(events)
    if usual is None:
        return
    expected = _parsed_points(events)
    assert expected is not None, "read as usual events, but an event does not parse as one scalar"
    assert repr(list(zip(*usual.points(), strict=True))) == repr(expected)  # repr: NaN is not equal to itself
    assert usual.longest_tag == max(len(tag.encode()) for tag, *_ in expected)


@settings(max_examples=200, deadline=None)
@given(st.lists(_event(), min_size=1, max_size=4), st.integers(0, 2**32))
def test_a_large_batch_is_checked_and_refused_as_event_by_event(events: list[bytes], seed: int) -> None:
    """Spread among usual events to a batch the numpy reading takes: the same bytes, or the same first error."""
    rng = random.Random(seed)
    batch = [_usual("loss", step, 1e9 + step, step / 8) for step in range(USUAL_FROM)]
    for data in events:
        batch.insert(rng.randrange(len(batch) + 1), data)
    try:
        event_check._raise_first_problem(batch, LIMITS)
    except EventError as exc:
        expected: EventError | None = exc
    else:
        expected = None
    if expected is None:
        assert check_and_frame(EventBatch(batch), LIMITS) == frame_all(batch)
    else:
        try:
            check_and_frame(EventBatch(batch), LIMITS)
        except EventError as exc:
            assert (exc.index, str(exc)) == (expected.index, str(expected))
        else:
            raise AssertionError(f"refused one by one ({expected}), taken as a batch")


def test_a_large_usual_batch_is_read_from_its_bytes_and_kept_for_the_observers() -> None:
    tags = ["loss", "acc", "损失"]
    events = [_usual(tags[i % 3], step, 1e9 + i, i / 4) for i, step in enumerate([0, -5, 2**40, *range(500)])]
    usual = read_usual(events)
    assert usual is not None
    batch = EventBatch(events)
    assert check_and_frame(batch, LIMITS) == frame_all(events)
    assert batch.usual is not None  # the check read it; the observers take its points from the batch
    assert event_point_columns(batch) is event_point_columns(batch) == usual.points()
    first = [("loss", 0, 1e9, 0.0), ("acc", -5, 1e9 + 1, 0.25), ("损失", 2**40, 1e9 + 2, 0.5)]
    assert list(zip(*event_point_columns(batch), strict=True))[:3] == first


# Each field's key put under another field of the same wire type: the event parses (as another kind of event,
# or with an unknown field), and is not a scalar. Offsets in an event of step 51: wall time at 0, step at 9, the
# summary at 11, its value at 13, the tag at 15.
_OTHER_KEYS = [(0, 0x11), (9, 0x18), (11, 0x22), (13, 0x12), (15, 0x3A)]


def _key(data: bytes, at: int, key: int) -> bytes:
    return data[:at] + bytes([key]) + data[at + 1 :]


def test_an_event_the_layout_does_not_take_leaves_the_batch_to_the_parse() -> None:
    events = [_usual("loss", step, 1e9 + step, 1.0) for step in range(1, 100)]
    assert read_usual(events) is not None
    for odd in (
        _overlong(events[50], 9 + 1 + 1 + 1),  # the summary's length in two bytes (step < 128: one byte)
        _usual("loss", 3, 0.0, 1.0),  # wall time 0: proto3 leaves the field out
        _usual("", 3, 1.0, 1.0),  # no tag: left out
        events[50] + struct.pack("<B", 0x50) + b"\x01",  # an unknown field after
        events[50][:-5] + b"\x1d" + events[50][-4:],  # the float under field 3's key: parsed, not a simple_value
        *(_key(events[50], at, key) for at, key in _OTHER_KEYS),
    ):
        assert read_usual([*events[:50], odd, *events[51:]]) is None


def test_a_large_batch_its_check_found_not_usual_is_parsed_for_the_observers_without_a_second_try(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Events with a field the layout has not (the writer's name): the check tries numpy once; the observers'
    points come from the parse, exactly as each event's own parse gives them."""
    events = [
        _usual("loss", step, 1e9 + step, step / 4) + Event(source_metadata={"writer": "w"}).SerializeToString()
        for step in range(1, 100)
    ]
    batch = EventBatch(events)
    assert check_and_frame(batch, LIMITS) == frame_all(events)
    assert batch.read_as_usual and batch.usual is None

    def tried_again(events: object) -> None:
        raise AssertionError("read_usual tried again on a batch its check read")

    monkeypatch.setattr(scalar_points, "read_usual", tried_again)
    assert list(zip(*event_point_columns(batch), strict=True)) == _parsed_points(events)
