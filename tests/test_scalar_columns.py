"""Scalar batches as columns (`WriteRequest.scalars`): the daemon writes exactly the records a client would have
serialized, under the same sequence numbers, duplicates, refusals and limits as serialized events."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator

import grpc
import pytest

from _support import Daemon, assert_whole_records, event_files
from summaryd.client._sender._encoder import EventEncoder
from summaryd.client._sender._kinds import SCALAR
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import REFUSED_SEQUENCE_KEY, whole_records

Scalar = tuple[str, float, int, float]

# Every corner of the encoding: zero and negative zero (left out, written), steps of 1 to 10 varint bytes,
# an empty tag, a non-ASCII one, one long enough for a 2-byte length, values float32 rounds, overflows or
# cannot order.
EDGES: list[Scalar] = [
    ("loss", 0.25, 1, 1_700_000_000.123456),
    ("loss", 0.1, 0, 0.0),
    ("acc", -3.5, -1, -0.0),
    ("", 1.0, 2**40, 12.5),
    ("métrique/é", 1e40, 2**63 - 1, 1e9),
    ("t" * 300, math.inf, -(2**63), 5.0),
    ("nan", math.nan, 127, 6.0),
    ("acc", 7.0, 128, 7.0),
    ("loss", -1e-45, 16_384, 8.0),
]


@pytest.fixture
def stub(daemon: Daemon) -> Iterator[pb_grpc.SummariesStub]:
    with grpc.insecure_channel(daemon.address) as channel:
        yield pb_grpc.SummariesStub(channel)


def columns(scalars: list[Scalar]) -> pb.ScalarColumns:
    tags: dict[str, int] = {}
    for tag, *_ in scalars:
        tags.setdefault(tag, len(tags))
    return pb.ScalarColumns(
        tags=list(tags),
        tag_index=[tags[s[0]] for s in scalars],
        value=[s[1] for s in scalars],
        step=[s[2] for s in scalars],
        wall_time=[s[3] for s in scalars],
    )


def serialized(scalars: list[Scalar]) -> list[bytes]:
    """What the client's sender serializes for `add_scalar` today."""
    encoder = EventEncoder()
    return [encoder.scalar((SCALAR, *s, 0)) for s in scalars]


def open_session(stub: pb_grpc.SummariesStub, run: str) -> str:
    session_id = str(uuid.uuid4())
    answer = stub.OpenSession(pb.OpenSessionRequest(session_id=session_id, run=run), timeout=10)
    assert answer.takes_scalar_columns
    return session_id


def write(stub: pb_grpc.SummariesStub, session_id: str, *requests: pb.WriteRequest) -> list[int]:
    for request in requests:
        request.session_id = session_id
    return [ack.acked_sequence for ack in stub.Write(iter(requests), timeout=10)]


def records(daemon: Daemon, run: str) -> list[bytes]:
    """The run's records after the daemon's own `file_version` record."""
    [path] = event_files(daemon.logdir / run)
    assert_whole_records(path)
    return list(whole_records(path.read_bytes()))[1:]


def test_columns_write_the_bytes_of_the_serialized_events(daemon: Daemon, stub: pb_grpc.SummariesStub) -> None:
    """The same scalars sent as serialized events and as columns make byte-identical records."""
    write(stub, open_session(stub, "events"), pb.WriteRequest(first_sequence=1, events=serialized(EDGES)))
    write(stub, open_session(stub, "columns"), pb.WriteRequest(first_sequence=1, scalars=columns(EDGES)))
    assert records(daemon, "columns") == records(daemon, "events") == serialized(EDGES)


def test_columns_and_events_keep_sequence_order(daemon: Daemon, stub: pb_grpc.SummariesStub) -> None:
    """Batches of both kinds in one stream are written in sequence order; a resent or overlapping column batch
    adds only its new part."""
    first, second, third = EDGES[:3], EDGES[3:6], EDGES[6:]
    acks = write(
        stub,
        open_session(stub, "mixed"),
        pb.WriteRequest(first_sequence=1, scalars=columns(first)),
        pb.WriteRequest(first_sequence=4, events=serialized(second)),
        pb.WriteRequest(first_sequence=1, scalars=columns(first)),
        pb.WriteRequest(first_sequence=6, scalars=columns(EDGES[5:])),
    )
    assert acks == [3, 6, 6, 9]
    assert records(daemon, "mixed") == serialized(first + second + third)


def test_a_bad_scalar_refuses_its_batch_and_is_named(daemon: Daemon, stub: pb_grpc.SummariesStub) -> None:
    """A scalar the daemon refuses (a NaN wall time) refuses its whole batch, naming its sequence number."""
    session = open_session(stub, "refused")
    bad = [*EDGES[:2], ("loss", 1.0, 3, math.nan)]
    with pytest.raises(grpc.RpcError) as caught:
        write(stub, session, pb.WriteRequest(first_sequence=1, scalars=columns(bad)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "event 2 of the batch has wall_time nan" in caught.value.details()
    assert dict(caught.value.trailing_metadata() or ())[REFUSED_SEQUENCE_KEY] == "3"
    assert not event_files(daemon.logdir / "refused")


@pytest.mark.parametrize(
    ("request_", "complaint"),
    [
        (pb.WriteRequest(first_sequence=1, events=serialized(EDGES[:1]), scalars=columns(EDGES[1:2])), "not both"),
        (
            pb.WriteRequest(first_sequence=1, scalars=pb.ScalarColumns(tags=["a"], tag_index=[0], step=[1, 2])),
            "columns of different lengths",
        ),
        (
            pb.WriteRequest(
                first_sequence=1,
                scalars=pb.ScalarColumns(tags=["a"], tag_index=[0], fixed_step=[1, 2], wall_time=[1.0], value=[1.0]),
            ),
            "columns of different lengths",
        ),
        (
            pb.WriteRequest(
                first_sequence=1,
                scalars=pb.ScalarColumns(
                    tags=["a"], tag_index=[0], step=[1], fixed_step=[1], wall_time=[1.0], value=[1.0]
                ),
            ),
            "both step and fixed_step",
        ),
        (
            pb.WriteRequest(
                first_sequence=1,
                scalars=pb.ScalarColumns(tags=["a"], tag_index=[1], step=[1], wall_time=[1.0], value=[1.0]),
            ),
            "tag_index 1, beyond the batch's 1 tags",
        ),
    ],
)
def test_malformed_columns_are_refused(stub: pb_grpc.SummariesStub, request_: pb.WriteRequest, complaint: str) -> None:
    """Columns that do not describe scalars are INVALID_ARGUMENT, with what to fix."""
    with pytest.raises(grpc.RpcError) as caught:
        write(stub, open_session(stub, "malformed"), request_)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert complaint in caught.value.details()
