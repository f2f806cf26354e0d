"""The scalar points the write observers read from serialized events: the whole-batch reading gives exactly what
reading event by event gives, whatever the batch holds (odd encodings included)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from summaryd.server.records import scalar_points
from summaryd.server.records.scalar_points import event_point_columns, points

_tags = st.sampled_from(["loss", "acc", "lr/group-0", "", "损失"])
_floats = st.floats(width=32, allow_nan=True, allow_infinity=True)


@st.composite
def _event(draw: st.DrawFn) -> bytes:
    """One serialized event: mostly the usual one simple value, sometimes another shape, sometimes bytes no
    serializer makes (a field twice, two events merged, a value with metadata)."""
    shape = draw(
        st.sampled_from(
            ["usual", "usual", "usual", "values", "histogram", "log", "merged", "twice", "bare", "metadata"]
        )
    )
    step = draw(st.one_of(st.integers(0, 2**40), st.integers(-(2**40), 2**62)))
    wall_time = draw(st.floats(0, 2e9))
    value = Summary.Value(tag=draw(_tags), simple_value=draw(_floats))
    if shape == "values":
        summary = Summary(value=[value, Summary.Value(tag=draw(_tags), simple_value=draw(_floats))])
    elif shape == "histogram":
        summary = Summary(value=[Summary.Value(tag="h", histo={"min": 1.0, "max": 2.0, "num": 1})])
    elif shape == "metadata":
        value.metadata.plugin_data.plugin_name = "scalars"
        summary = Summary(value=[value])
    else:
        summary = Summary(value=[value])
    if shape == "bare":  # a wall time and a step, nothing else: it holds no point
        return Event(step=step, wall_time=wall_time).SerializeToString()
    if shape == "log":
        return Event(step=step, wall_time=wall_time, session_log={"status": 1}).SerializeToString()
    data = Event(step=step, wall_time=wall_time, summary=summary).SerializeToString()
    if shape == "twice":  # the summary field a second time: parsed, its values join the first's
        data += Event(
            summary=Summary(value=[Summary.Value(tag=draw(_tags), simple_value=draw(_floats))])
        ).SerializeToString()
    if shape == "merged":  # two events' bytes as one: on the wire, one event (the scalar fields of the last win)
        data += Event(step=draw(st.integers(1, 2**20)), summary=Summary(value=[value])).SerializeToString()
    return data


def _one_by_one(events: list[bytes]) -> list[tuple[str, int, float, float]]:
    return list(scalar_points._event_points(events))


def _same(a: list[tuple[str, int, float, float]], b: list[tuple[str, int, float, float]]) -> bool:
    # NaN is not equal to itself: compare the points' text.
    return repr(a) == repr(b)


@settings(max_examples=150, deadline=None)
@given(st.lists(_event(), min_size=0, max_size=12))
def test_the_whole_batch_reading_gives_what_reading_event_by_event_gives(events: list[bytes]) -> None:
    expected = _one_by_one(events)
    assert _same(list(points(events)), expected)
    columns = event_point_columns(events)
    assert _same(list(zip(*columns, strict=True)), expected)


def test_a_usual_batch_is_read_whole() -> None:
    """The usual batch takes the whole-batch reading (its figures are the benchmarks'; this shows it is taken)."""
    events = [
        Event(step=s, wall_time=1e9 + s, summary=Summary(value=[Summary.Value(tag="loss", simple_value=s / 8)]))
        for s in range(1, 300)
    ]
    batch = [e.SerializeToString() for e in events]
    whole = scalar_points._whole_batch(batch)
    assert whole is not None
    assert list(zip(*whole, strict=True)) == [(e.summary.value[0].tag, e.step, e.wall_time, e.step / 8) for e in events]
    # One event of another shape sends the batch to the per-event reading, which gives the same points.
    batch.insert(100, Event(step=7, wall_time=1.0, session_log={"status": 1}).SerializeToString())
    assert scalar_points._whole_batch(batch) is None
    assert list(points(batch)) == list(zip(*whole, strict=True))


def test_fields_counted_right_but_not_one_an_event_are_read_event_by_event() -> None:
    """An event with its summary twice beside one with none: the counts of the joined fields match the events',
    but the second summary is the first event's (it holds both points, at its step)."""
    value = Summary.Value(tag="loss", simple_value=1.0)
    twice = Event(step=5, wall_time=2.0, summary=Summary(value=[value])).SerializeToString()
    twice += Event(summary=Summary(value=[Summary.Value(tag="acc", simple_value=0.5)])).SerializeToString()
    bare = Event(step=6, wall_time=3.0).SerializeToString()
    assert list(points([twice, bare])) == [("loss", 5, 2.0, 1.0), ("acc", 5, 2.0, 0.5)]
