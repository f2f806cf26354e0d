"""Benchmark 6, memory: the daemon holding many runs and sessions and flooded by them, and a client flooding.

Daemon: one process opens `runs` sessions, each on its own run with one small batch written (so every run has
an open event file, its journal and its directory), and reads the daemon's resident size at rest; then the
first `streaming` sessions each stream `batches` batches of `batch_events` scalars at once, sending without
waiting for acks, and the daemon's peak during that flood is read (`VmHWM`, reset before it). Sessions are
closed at the end.

Client: the resident size a writer adds while logging `events` scalars back to back (its peak above the size
before the first call), with the daemon live, with no daemon (everything backs up in the client), and for
torch's writer.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks._contenders import WriterSpec, import_training_runtime, open_writer
from benchmarks._memory import peak_mb, reset_peak, rss_mb

_CONCURRENCY = 64


@dataclass(frozen=True)
class DaemonMemoryParams:
    address: str
    daemon_pid: int
    run_prefix: str
    runs: int
    streaming: int
    batches: int
    batch_events: int


@dataclass(frozen=True)
class DaemonMemoryResult:
    idle_mb: float
    """The daemon's resident size before the trial opened anything."""
    runs_open_mb: float
    """With every run open and every session live, at rest."""
    flood_peak_mb: float
    """The peak while `streaming` sessions streamed at once."""
    after_mb: float
    """After the flood, before the sessions were closed."""
    peak_reset: bool
    events: int


def prepare_daemon(raw: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
    params = DaemonMemoryParams(**raw)

    def run() -> dict[str, Any]:
        return asyncio.run(_load_daemon(params))

    return run


async def _load_daemon(params: DaemonMemoryParams) -> dict[str, Any]:
    import grpc

    from benchmarks.ceiling import scalar_batch
    from summaryd.v1 import summaryd_pb2 as pb
    from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

    batch = scalar_batch(params.batch_events)
    pid = params.daemon_pid
    idle = rss_mb(pid)
    gate = asyncio.Semaphore(_CONCURRENCY)
    sessions = [str(uuid.uuid4()) for _ in range(params.runs)]
    options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
    async with grpc.aio.insecure_channel(params.address, options=options) as channel:
        stub = pb_grpc.SummariesStub(channel)

        async def stream(session_id: str, requests: list[pb.WriteRequest]) -> int:
            call = stub.Write(timeout=300)
            for request in requests:
                await call.write(request)
            await call.done_writing()
            acked = 0
            async for ack in call:
                acked = ack.acked_sequence
            return acked

        async def open_run(index: int, session_id: str) -> None:
            async with gate:
                run = f"{params.run_prefix}/run-{index:04d}"
                await stub.OpenSession(pb.OpenSessionRequest(session_id=session_id, run=run, next_sequence=1))
                first = pb.WriteRequest(session_id=session_id, first_sequence=1, events=batch[:1])
                if await stream(session_id, [first]) != 1:
                    raise RuntimeError(f"{run}: the first event was not acknowledged")

        await asyncio.gather(*(open_run(i, s) for i, s in enumerate(sessions)))
        runs_open = rss_mb(pid)
        peak_reset = reset_peak(pid)

        async def flood(session_id: str) -> None:
            requests = [
                pb.WriteRequest(session_id=session_id, first_sequence=2 + i * len(batch), events=batch)
                for i in range(params.batches)
            ]
            expected = 1 + params.batches * len(batch)
            if await stream(session_id, requests) != expected:
                raise RuntimeError("a flooding session was not acknowledged to its end")

        await asyncio.gather(*(flood(s) for s in sessions[: params.streaming]))
        flood_peak = peak_mb(pid)
        after = rss_mb(pid)

        async def close(session_id: str) -> None:
            async with gate:
                await stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), timeout=120)

        await asyncio.gather(*(close(s) for s in sessions))
    events = params.runs + params.streaming * params.batches * params.batch_events
    return asdict(DaemonMemoryResult(idle, runs_open, flood_peak, after, peak_reset, events))


@dataclass(frozen=True)
class ClientMemoryParams:
    writer: WriterSpec
    events: int


@dataclass(frozen=True)
class ClientMemoryResult:
    before_mb: float
    """The process's resident size with torch imported and the writer open, before the first call."""
    added_peak_mb: float
    """The largest resident size while logging, less `before_mb`."""
    peak_reset: bool


def prepare_client(raw: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
    params = ClientMemoryParams(**{**raw, "writer": WriterSpec.from_json(raw["writer"])})
    import_training_runtime()
    writer = open_writer(params.writer)

    def run() -> dict[str, Any]:
        before = rss_mb()
        peak_reset = reset_peak()
        add_scalar = writer.add_scalar
        for step in range(params.events):
            add_scalar("loss", step * 0.001, step)
        peak = peak_mb()
        writer.close()
        return asdict(ClientMemoryResult(before, max(0.0, peak - before), peak_reset))

    return run
