"""Random and malformed requests at a live daemon: it never crashes, never writes outside its logdir, every
file it wrote parses to its end, and a well-behaved client logging beside the attack loses nothing."""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from _support import Daemon, assert_whole_records, read_events
from summaryd.client import SummaryWriter
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

# Codes a hostile request may get; anything else (UNKNOWN, INTERNAL) is a daemon bug.
EXPECTED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.PERMISSION_DENIED,
}

path_parts = st.one_of(
    st.sampled_from(["..", ".", "", "a", "b/../..", "/etc", "\\x", "\u202e", "e\u0301", "\x00", "rank-0", "x" * 300]),
    st.text(min_size=0, max_size=12),
)
run_paths = st.lists(path_parts, min_size=0, max_size=20).map("/".join)


def _valid_event(step: int, wall_time: float) -> bytes:
    summary = Summary(value=[Summary.Value(tag="t", simple_value=1.0)])
    return Event(wall_time=wall_time, step=step, summary=summary).SerializeToString()


events = st.one_of(
    st.binary(max_size=64),
    st.builds(
        _valid_event,
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=True, allow_infinity=True),
    ),
    st.just(Event(wall_time=1.0, file_version="brain.Event:2").SerializeToString()),
    st.just(Event(wall_time=1.0, step=3).SerializeToString()),
)


def test_hostile_requests_do_no_harm(daemon: Daemon, tmp_path: Path) -> None:
    outside_before = {p for p in tmp_path.iterdir() if p.name != "runs"}
    steady_report: list[object] = []

    def steady_client() -> None:
        with SummaryWriter("steady", address=daemon.address, worker="") as writer:
            for step in range(3000):
                writer.add_scalar("ok", step, step)
            steady_report.append(writer.close(timeout=60))

    bystander = threading.Thread(target=steady_client)
    bystander.start()
    channel = grpc.insecure_channel(daemon.address)
    stub = pb_grpc.SummariesStub(channel)

    @settings(max_examples=250, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(
        run=run_paths,
        worker=st.one_of(st.just(""), path_parts),
        first=st.integers(min_value=0, max_value=2**64 - 1),
        batch=st.lists(events, max_size=8),
        reuse=st.booleans(),
    )
    def attack(run: str, worker: str, first: int, batch: list[bytes], reuse: bool) -> None:
        session_id = "steady-victim" if reuse else str(uuid.uuid4())
        try:
            stub.OpenSession(pb.OpenSessionRequest(session_id=session_id, run=run, worker=worker), timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() in EXPECTED, (exc.code(), exc.details())
            assert exc.details()
        try:
            request = pb.WriteRequest(session_id=session_id, first_sequence=first, events=batch)
            for _ in stub.Write(iter([request]), timeout=10):
                pass
        except grpc.RpcError as exc:
            assert exc.code() in EXPECTED, (exc.code(), exc.details())

    try:
        attack()
    finally:
        bystander.join(120)
        channel.close()

    assert daemon.proc.poll() is None, daemon.log()
    assert {p for p in tmp_path.iterdir() if p.name != "runs"} == outside_before
    for root, _dirs, files in os.walk(daemon.logdir):
        for name in files:
            path = Path(root) / name
            assert path.resolve().is_relative_to(daemon.logdir.resolve())
            if "tfevents" in name:
                assert_whole_records(path)
    [report] = steady_report
    assert report.ok and report.delivered == 3000  # type: ignore[attr-defined]
    [steady_file] = (daemon.logdir / "steady").glob("*tfevents*")
    steps = [e.step for e in read_events(steady_file) if e.HasField("summary")]
    assert steps == list(range(3000))
