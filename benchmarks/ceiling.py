"""Benchmark 3, the daemon's ceiling: pre-serialized batches, and the same scalars as columns, over the raw gRPC
stream, against raw framing.

Both contenders take the same batches of serialized scalar `Event`s. The feeder opens a session with the
generated stub, streams `WriteRequest`s on one `Write` stream until the last one is acknowledged, and closes
the session (the daemon fsyncs). The raw limit frames the same records with the daemon's own `frame_all` and
writes them to a file, one write per batch, then fsyncs: what the daemon would cost with no gRPC, no
validation and no event loop.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import grpc
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import frame_all


@dataclass(frozen=True)
class CeilingParams:
    target: str
    """The daemon's address for the feeder, a file path for raw framing."""
    batches: int
    batch_events: int
    run: str = ""
    columns: bool = False
    """The feeder sends the same scalars as columns (`WriteRequest.scalars`), for the daemon to build."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CeilingParams:
        return cls(**data)


@dataclass(frozen=True)
class CeilingResult:
    events: int
    seconds: float
    bytes: int


_TICK = 1e-5
"""Seconds between two scalars' wall times: each scalar has its own clock reading, as a client's do."""


def scalar_batch(size: int) -> list[bytes]:
    """`size` serialized scalar events, as the client sends them."""
    now = time.time()
    return [
        Event(
            wall_time=now + step * _TICK,
            step=step,
            summary=Summary(value=[Summary.Value(tag="loss", simple_value=step * 0.001)]),
        ).SerializeToString()
        for step in range(size)
    ]


def scalar_columns(size: int, wall_time: float) -> pb.ScalarColumns:
    """The scalars of `scalar_batch` as columns, their steps in `fixed_step` as a client sends them to this
    daemon (it says `takes_fixed_steps`)."""
    return pb.ScalarColumns(
        tags=["loss"],
        tag_index=[0] * size,
        fixed_step=range(size),
        wall_time=[wall_time + step * _TICK for step in range(size)],
        value=[step * 0.001 for step in range(size)],
    )


def prepare_feed(raw: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
    params = CeilingParams.from_json(raw)
    batch = scalar_batch(params.batch_events)
    columns = scalar_columns(params.batch_events, Event.FromString(batch[0]).wall_time) if params.columns else None
    channel = grpc.insecure_channel(params.target, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
    stub = pb_grpc.SummariesStub(channel)
    session_id = str(uuid.uuid4())
    # Opened before the clock starts: the connection is up and the session known when the stream begins.
    stub.OpenSession(pb.OpenSessionRequest(session_id=session_id, run=params.run, next_sequence=1), timeout=30)
    total = params.batches * params.batch_events

    def requests() -> Iterator[pb.WriteRequest]:
        for index in range(params.batches):
            first = index * params.batch_events + 1
            if columns is None:
                yield pb.WriteRequest(session_id=session_id, first_sequence=first, events=batch)
            else:
                yield pb.WriteRequest(session_id=session_id, first_sequence=first, scalars=columns)

    def run() -> dict[str, Any]:
        started = time.perf_counter()
        acked = 0
        for ack in stub.Write(requests(), timeout=600):
            acked = ack.acked_sequence
        closed = stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), timeout=60)
        seconds = time.perf_counter() - started
        channel.close()
        if acked != total or closed.events_written != total:
            raise RuntimeError(f"the daemon acknowledged {acked} and wrote {closed.events_written} of {total}")
        return asdict(CeilingResult(total, seconds, sum(map(len, batch)) * params.batches))

    return run


def prepare_framing(raw: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
    params = CeilingParams.from_json(raw)
    batch = scalar_batch(params.batch_events)

    def run() -> dict[str, Any]:
        started = time.perf_counter()
        fd = os.open(params.target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        try:
            for _ in range(params.batches):
                view = memoryview(frame_all(batch))
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        seconds = time.perf_counter() - started
        total = params.batches * params.batch_events
        return asdict(CeilingResult(total, seconds, sum(map(len, batch)) * params.batches))

    return run
