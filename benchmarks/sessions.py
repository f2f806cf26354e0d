"""Benchmark 9, many sessions at once: the daemon's CPU per scalar, its backlog and its resident size while
`sessions` clients each log `rate` scalars a second.

The clients are one lean load generator, not `sessions` processes with a `SummaryWriter` each: this benchmark
measures the daemon, and on a machine of two cores 256 client processes (each with its sender thread, its
channel and a heap with torch) would take the CPU the daemon needs and measure their own contention instead.
The generator speaks the contract directly with grpc.aio: one `OpenSession` and one `Write` stream per
session, a few sessions per channel, and sends what a client's sender sends at its defaults: every linger
interval what is due as one batch of scalar columns (`WriteRequest.scalars`), at most `max_in_flight` batches
unacknowledged, so that a session that falls behind sends larger batches (up to `max_batch_events`). The
sessions' sends are spread evenly over the linger interval.

After `warmup_s` at full load, a window of `seconds` is measured: the daemon's CPU (user + system of all its
threads, `/proc/<pid>/stat`) over the scalars it acknowledged in the window, and once a second the backlog
(scalars due by the schedule but not yet acknowledged: what real clients would hold in their queues) and the
daemon's resident size.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks._memory import rss_mb
from summaryd.client._options import ClientOptions

_TICK = os.sysconf("SC_CLK_TCK")
_OPENING = 64  # sessions opened at once
_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class SessionsParams:
    """`sessions` sessions of the daemon at `address` (pid `daemon_pid`) on runs under `run_prefix`, each logging
    `rate` scalars a second; a window of `seconds` measured after `warmup_s` at full load. Each session sends as
    a client does with its defaults (`ClientOptions`: linger, batches in flight, largest batch);
    `sessions_per_channel` sessions share a channel."""

    address: str
    daemon_pid: int
    run_prefix: str
    sessions: int
    rate: int
    seconds: float
    warmup_s: float = 3.0
    sessions_per_channel: int = 16


# A client's defaults, which every session follows.
_LINGER_S = ClientOptions.linger_secs
_MAX_IN_FLIGHT = ClientOptions.max_in_flight
_MAX_BATCH = ClientOptions.max_batch_events


@dataclass(frozen=True)
class SessionsResult:
    sessions: int
    offered_rate: float
    """Scalars a second all sessions together should send."""
    acked_rate: float
    """Scalars a second the daemon acknowledged over the window."""
    events: int
    """Scalars acknowledged in the window."""
    seconds: float
    daemon_cpu_s: float
    """The daemon's CPU over the window, all threads."""
    generator_cpu_s: float
    """The load generator's own CPU over the window: near one core, it (not the daemon) bounds the load."""
    backlog_start: float
    backlog_end: float
    """Scalars due but not acknowledged: the mean of the samples of the window's first and last tenth."""
    backlog_max: int
    rss_start_mb: float
    rss_end_mb: float
    rss_max_mb: float
    samples: list[tuple[float, int, float]]
    """(seconds into the window, backlog, daemon RSS MB), once a second."""


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process `pid`, every thread."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def prepare(raw: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
    params = SessionsParams(**raw)

    def run() -> dict[str, Any]:
        return asyncio.run(_Load(params).run())

    return run


class _Load:
    """The sessions, their streams and the counts the samples read."""

    def __init__(self, params: SessionsParams) -> None:
        from summaryd.v1 import summaryd_pb2 as pb

        self.params = params
        self.wall_time = time.time()
        self.columns: dict[int, bytes] = {}
        self.pb = pb
        self.sent = 0
        self.acked = 0
        self.started = 0.0
        self.stopping = False

    def due(self, now: float) -> int:
        """Scalars the schedule says were sent by `now`."""
        return int((now - self.started) * self.params.rate) * self.params.sessions

    async def run(self) -> dict[str, Any]:
        import grpc

        from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

        params, pb = self.params, self.pb
        channels = [
            grpc.aio.insecure_channel(params.address, options=[("grpc.max_send_message_length", _MESSAGE_BYTES)])
            for _ in range(-(-params.sessions // params.sessions_per_channel))
        ]
        try:
            stubs = [pb_grpc.SummariesStub(channel) for channel in channels]
            # Write with a serializer that passes bytes through: the generator builds each request's bytes itself.
            writes = [
                channel.stream_stream(
                    "/summaryd.v1.Summaries/Write",
                    request_serializer=bytes,
                    response_deserializer=pb.WriteAck.FromString,
                )
                for channel in channels
            ]
            gate = asyncio.Semaphore(_OPENING)
            ids = [str(uuid.uuid4()) for _ in range(params.sessions)]

            async def open_one(index: int) -> None:
                async with gate:
                    run = f"{params.run_prefix}/session-{index:04d}"
                    request = pb.OpenSessionRequest(session_id=ids[index], run=run, next_sequence=1)
                    await stubs[index // params.sessions_per_channel].OpenSession(request, timeout=60)

            await asyncio.gather(*(open_one(i) for i in range(params.sessions)))
            self.started = time.monotonic() + 0.1
            per = params.sessions_per_channel
            tasks = [
                asyncio.ensure_future(self._session(i, ids[i], writes[i // per], stubs[i // per].CloseSession))
                for i in range(params.sessions)
            ]
            try:
                result = await self._measure()
            finally:
                self.stopping = True
                await asyncio.wait_for(asyncio.gather(*tasks), 120)
            return asdict(result)
        finally:
            for channel in channels:
                await channel.close(None)

    def _request(self, session_id: str, first: int, count: int) -> bytes:
        """A serialized `WriteRequest` of `count` scalars from sequence `first`: a small head, and the columns'
        bytes appended (protobuf merges the two), made once per batch size."""
        columns = self.columns.get(count)
        if columns is None:
            columns = self.columns[count] = self.pb.WriteRequest(
                scalars=self.pb.ScalarColumns(
                    tags=["loss", "accuracy"],
                    tag_index=[i % 2 for i in range(count)],
                    step=range(count),
                    wall_time=[self.wall_time] * count,
                    value=[i * 0.001 for i in range(count)],
                )
            ).SerializeToString()
        return self.pb.WriteRequest(session_id=session_id, first_sequence=first).SerializeToString() + columns

    async def _session(self, index: int, session_id: str, write: Any, close: Any) -> None:
        """One client's sender: every linger interval, what is due (at most `_MAX_BATCH` scalars) as one batch,
        while fewer than `_MAX_IN_FLIGHT` batches are unacknowledged; a session that falls behind sends larger
        batches, as a client does."""
        params = self.params
        call = write(timeout=params.warmup_s + params.seconds + 300)
        in_flight: deque[int] = deque()  # the last sequence of each batch not yet acknowledged
        room = asyncio.Event()
        acked = 0

        async def read_acks() -> None:
            nonlocal acked
            async for ack in call:
                self.acked += ack.acked_sequence - acked
                acked = ack.acked_sequence
                while in_flight and in_flight[0] <= acked:
                    in_flight.popleft()
                room.set()

        reader = asyncio.ensure_future(read_acks())
        started = self.started + _LINGER_S * index / params.sessions
        tick = started
        sent = 0
        while not self.stopping:
            tick += _LINGER_S
            delay = tick - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            while len(in_flight) >= _MAX_IN_FLIGHT and not self.stopping:
                room.clear()
                await room.wait()
            count = min(int((time.monotonic() - started) * params.rate) - sent, _MAX_BATCH)
            if count <= 0 or self.stopping:
                continue
            await call.write(self._request(session_id, sent + 1, count))
            sent += count
            in_flight.append(sent)
            self.sent += count
        await call.done_writing()
        await reader
        if acked != sent:
            raise RuntimeError(f"session {index}: acknowledged {acked} of {sent}")
        await close(self.pb.CloseSessionRequest(session_id=session_id), timeout=120)

    async def _measure(self) -> SessionsResult:
        params = self.params
        pid = params.daemon_pid
        await asyncio.sleep(max(0.0, self.started + params.warmup_s - time.monotonic()))
        began = time.monotonic()
        cpu_before, own_before, acked_before = process_cpu(pid), process_cpu(os.getpid()), self.acked
        samples: list[tuple[float, int, float]] = []
        while True:
            now = time.monotonic()
            samples.append((now - began, max(0, self.due(now) - self.acked), rss_mb(pid)))
            if now - began >= params.seconds:
                break
            await asyncio.sleep(min(1.0, began + params.seconds - now))
        elapsed = time.monotonic() - began
        cpu, own = process_cpu(pid) - cpu_before, process_cpu(os.getpid()) - own_before
        events = self.acked - acked_before
        tenth = max(1, len(samples) // 10)
        backlogs = [backlog for _, backlog, _ in samples]
        sizes = [size for _, _, size in samples]
        return SessionsResult(
            sessions=params.sessions,
            offered_rate=params.rate * params.sessions,
            acked_rate=events / elapsed,
            events=events,
            seconds=elapsed,
            daemon_cpu_s=cpu,
            generator_cpu_s=own,
            backlog_start=sum(backlogs[:tenth]) / tenth,
            backlog_end=sum(backlogs[-tenth:]) / tenth,
            backlog_max=max(backlogs),
            rss_start_mb=sizes[0],
            rss_end_mb=sizes[-1],
            rss_max_mb=max(sizes),
            samples=samples,
        )
