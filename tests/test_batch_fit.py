"""The client's cut of its batches to the daemon's stated limits (the events no message can carry sorted out
before they are numbered, the rest cut into messages as they are sent), checked against protobuf's own size of
the message the daemon measures."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from summaryd.client._sender._batch_fit import DaemonLimits
from summaryd.v1 import summaryd_pb2 as pb

SESSION = str(uuid.uuid4())
# Events of random sizes (each made distinct), and limits (0: not stated) that cut them every which way.
BATCHES_AND_LIMITS = {
    "sizes": st.lists(st.integers(min_value=0, max_value=70_000), max_size=60),
    "max_message": st.integers(min_value=200, max_value=200_000),
    "max_event": st.integers(min_value=0, max_value=100_000),
    "max_events": st.integers(min_value=0, max_value=8),
}


@given(**BATCHES_AND_LIMITS)
def test_every_cut_is_a_message_the_daemon_takes(
    sizes: list[int], max_message: int, max_event: int, max_events: int
) -> None:
    events = [index.to_bytes(2, "big") + b"x" * size for index, size in enumerate(sizes)]  # each one distinct
    limits = DaemonLimits(max_message, max_event, max_events)
    kept, too_large = limits.sort_out(events, sum(map(len, events)), SESSION)
    cuts = limits.split(kept, sum(map(len, kept)), SESSION)
    for cut in cuts:
        # The largest first sequence number: the size the daemon sees can only be smaller.
        request = pb.WriteRequest(session_id=SESSION, first_sequence=2**64 - 1, events=cut)
        assert cut and request.ByteSize() <= max_message
        assert not max_events or len(cut) <= max_events
        assert not max_event or max(map(len, cut)) <= max_event
    # Nothing lost or reordered: the cuts and the refused events are the events, and only events that no message
    # could carry are refused.
    assert [event for cut in cuts for event in cut] == kept == [event for event in events if event not in too_large]
    assert len(kept) + len(too_large) == len(events) and too_large == [e for e in events if e in too_large]
    for event in too_large:
        alone = pb.WriteRequest(session_id=SESSION, first_sequence=2**64 - 1, events=[event]).ByteSize()
        assert (max_event and len(event) > max_event) or alone > max_message


def test_a_daemon_that_states_no_limits_gets_the_batch_whole() -> None:
    events = [b"x" * 1000] * 5000
    assert DaemonLimits().sort_out(events, 5_000_000, SESSION) == (events, [])
    assert DaemonLimits().split(events, 5_000_000, SESSION) == [events]


def test_a_full_batch_is_not_cut() -> None:
    """The client's default batch (1,024 scalars) under the daemon's defaults goes as one message."""
    events = [b"e" * 40] * 1024
    limits = DaemonLimits(64 << 20, 16 << 20, 10_000)
    assert limits.sort_out(events, 40 * 1024, SESSION) == (events, [])
    assert limits.split(events, 40 * 1024, SESSION) == [events]


@given(**BATCHES_AND_LIMITS)
def test_numbered_events_are_cut_without_a_loss(
    sizes: list[int], max_message: int, max_event: int, max_events: int
) -> None:
    """`split` (events numbered already, spooled or resent): every event is sent, in order; a cut is either a
    message the daemon takes or one event too large for any, alone, for the daemon to refuse by its rules."""
    events = [index.to_bytes(2, "big") + b"x" * size for index, size in enumerate(sizes)]
    limits = DaemonLimits(max_message, max_event, max_events)
    cuts = limits.split(events, sum(map(len, events)), SESSION)
    assert [event for cut in cuts for event in cut] == events
    _, too_large = limits.sort_out(events, sum(map(len, events)), SESSION)
    for cut in cuts:
        request = pb.WriteRequest(session_id=SESSION, first_sequence=2**64 - 1, events=cut)
        alone_and_too_large = len(cut) == 1 and cut[0] in too_large
        assert alone_and_too_large or request.ByteSize() <= max_message
        assert not max_events or len(cut) <= max_events
