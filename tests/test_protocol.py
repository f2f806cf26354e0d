"""The wire contract as a client of any language sees it: sequences, duplicates, gaps and bad events."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from _support import Daemon, assert_whole_records, event_files, read_events
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc


def scalar(step: int) -> bytes:
    summary = Summary(value=[Summary.Value(tag="s", simple_value=float(step))])
    return Event(wall_time=1.0 + step, step=step, summary=summary).SerializeToString()


@pytest.fixture
def stub(daemon: Daemon) -> Iterator[pb_grpc.SummariesStub]:
    with grpc.insecure_channel(daemon.address) as channel:
        yield pb_grpc.SummariesStub(channel)


def open_session(stub: pb_grpc.SummariesStub, run: str = "proto", session_id: str | None = None) -> str:
    session_id = session_id or str(uuid.uuid4())
    stub.OpenSession(pb.OpenSessionRequest(session_id=session_id, run=run), timeout=10)
    return session_id


def write(stub: pb_grpc.SummariesStub, session_id: str, *batches: tuple[int, list[bytes]]) -> list[int]:
    requests = [
        pb.WriteRequest(session_id=session_id, first_sequence=first, events=events) for first, events in batches
    ]
    return [ack.acked_sequence for ack in stub.Write(iter(requests), timeout=10)]


def steps_in(daemon: Daemon, run: str) -> list[int]:
    [path] = event_files(daemon.logdir / run)
    assert_whole_records(path)
    return [e.step for e in read_events(path) if e.HasField("summary")]


def test_duplicates_and_overlaps_are_written_once(daemon: Daemon, stub: pb_grpc.SummariesStub) -> None:
    """A resent batch, and one that overlaps what was written, add only what is new."""
    session = open_session(stub)
    acks = write(stub, session, (1, [scalar(0), scalar(1)]), (1, [scalar(0), scalar(1)]), (2, [scalar(1), scalar(2)]))
    assert acks == [2, 2, 3]
    assert steps_in(daemon, "proto") == [0, 1, 2]
    status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    assert [s.duplicates_dropped for s in status.sessions] == [3]


def test_reopening_a_session_resumes_its_sequence(daemon: Daemon, stub: pb_grpc.SummariesStub) -> None:
    """A reconnecting client learns what the daemon holds and continues from there."""
    session = open_session(stub)
    write(stub, session, (1, [scalar(0), scalar(1), scalar(2)]))
    answer = stub.OpenSession(pb.OpenSessionRequest(session_id=session, run="proto"), timeout=10)
    assert (answer.run_dir, answer.last_sequence) == ("proto", 3)
    assert write(stub, session, (4, [scalar(3)])) == [4]
    assert steps_in(daemon, "proto") == [0, 1, 2, 3]


def test_a_gap_is_refused(stub: pb_grpc.SummariesStub) -> None:
    """Skipping sequence numbers is FAILED_PRECONDITION, with where to resend from."""
    session = open_session(stub)
    with pytest.raises(grpc.RpcError) as caught:
        write(stub, session, (1, [scalar(0)]), (5, [scalar(4)]))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "resend from 2" in caught.value.details()


@pytest.mark.parametrize(
    ("event", "complaint"),
    [
        (b"\xff\xff\xff", "not a serialized tensorboard Event"),
        (Event(wall_time=1.0, file_version="brain.Event:2").SerializeToString(), "file_version"),
        (Event(wall_time=float("nan"), step=1, summary=Summary()).SerializeToString(), "wall_time"),
        (Event(wall_time=1.0, step=1).SerializeToString(), "carries nothing"),
    ],
)
def test_bad_events_refuse_their_batch_and_keep_the_file_whole(
    daemon: Daemon, stub: pb_grpc.SummariesStub, event: bytes, complaint: str
) -> None:
    """INVALID_ARGUMENT names the bad event; nothing of its batch is written; earlier batches stay."""
    session = open_session(stub)
    with pytest.raises(grpc.RpcError) as caught:
        write(stub, session, (1, [scalar(0)]), (2, [scalar(1), event, scalar(2)]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "event 1 of the batch" in caught.value.details() and complaint in caught.value.details()
    assert refused_sequence(caught.value) == 3  # the batch starts at 2: its event 1 is sequence number 3
    assert steps_in(daemon, "proto") == [0]
    assert write(stub, session, (2, [scalar(1)])) == [2]


def refused_sequence(error: grpc.RpcError) -> int:
    [value] = [v for k, v in error.trailing_metadata() or () if k == "summaryd-refused-sequence"]  # type: ignore[attr-defined]
    return int(value)


def test_a_refusal_names_the_event_by_sequence_past_resent_events(daemon: Daemon, stub: pb_grpc.SummariesStub) -> None:
    """A resent batch overlapping what is acknowledged: the refused event's sequence number counts the skipped
    events too, so that the client can drop exactly that one."""
    session = open_session(stub)
    assert write(stub, session, (1, [scalar(0), scalar(1)])) == [2]
    bad = Event(wall_time=1.0, step=3).SerializeToString()  # carries nothing
    with pytest.raises(grpc.RpcError) as caught:
        write(stub, session, (1, [scalar(0), scalar(1), scalar(2), bad]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused_sequence(caught.value) == 4
    assert steps_in(daemon, "proto") == [0, 1]


def test_closed_and_unknown_sessions(stub: pb_grpc.SummariesStub) -> None:
    """Writing to an unknown session is NOT_FOUND; to a closed one FAILED_PRECONDITION; closing twice is fine."""
    with pytest.raises(grpc.RpcError) as caught:
        write(stub, str(uuid.uuid4()), (1, [scalar(0)]))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    session = open_session(stub)
    write(stub, session, (1, [scalar(0)]))
    assert stub.CloseSession(pb.CloseSessionRequest(session_id=session), timeout=10).acked_sequence == 1
    assert stub.CloseSession(pb.CloseSessionRequest(session_id=session), timeout=10).acked_sequence == 1
    with pytest.raises(grpc.RpcError) as caught:
        write(stub, session, (2, [scalar(1)]))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as caught:
        open_session(stub, session_id=session)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_one_session_id_cannot_switch_runs(stub: pb_grpc.SummariesStub) -> None:
    session = open_session(stub, "a")
    with pytest.raises(grpc.RpcError) as caught:
        open_session(stub, "b", session_id=session)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_reflection_lists_the_services(daemon: Daemon) -> None:
    """grpcurl-style tools discover the API through server reflection."""
    with grpc.insecure_channel(daemon.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        [answer] = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for s in answer.list_services_response.service}
    assert {"summaryd.v1.Summaries", "grpc.health.v1.Health"} <= names
