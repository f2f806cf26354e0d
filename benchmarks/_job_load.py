"""The lean load generator of the job-shape benchmark: many simulated workers of one run in one process.

`python -m benchmarks._job_load PARAMS_JSON` opens a session for each of its workers (`rank-<first>` ..), says
`ready` on stdout, reads the start time (Unix seconds) from stdin, and then plays each worker: a step every
`1 / steps_per_second` seconds logging `tags` scalars, queued, and sent as one batch of scalar columns the way
the client's sender sends it: a partial batch waits `linger` (the daemon's pacing within the client's bound,
`summaryd.client._sender._pacing.Pacing`, the very object the client uses) and at most `max_in_flight` batches
are unacknowledged. After the warm-up it counts what was offered and acknowledged, the backlog (queued and
unacknowledged scalars) at both ends of the window and each step's visibility (from its scalars' queueing to
their ack), and prints one JSON line with its figures and its own CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import sys
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc
import uvloop
from grpc import aio

from summaryd.client._options import ClientOptions
from summaryd.client._sender._pacing import Pacing
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class LoadParams:
    address: str
    run: str
    world_size: int
    first_rank: int
    workers: int
    tags: int = 20
    steps_per_second: float = 5.0
    warmup: float = 5.0
    seconds: float = 20.0
    aggregate: bool = True
    max_batch_events: int = 1024

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LoadParams:
        return cls(**data)


@dataclass
class Counts:
    offered: int = 0
    acked: int = 0
    messages: int = 0
    visibility: list[float] = field(default_factory=list)


class Worker:
    """One simulated rank: its queue of scalars, its batches in flight and its pacing."""

    def __init__(self, params: LoadParams, rank: int, stub: pb_grpc.SummariesStub, counts: Counts) -> None:
        self.params = params
        self.rank = rank
        self.stub = stub
        self.counts = counts
        self.session_id = str(uuid.uuid4())
        self.pacing = Pacing(ClientOptions.make(address=params.address, max_batch_events=params.max_batch_events))
        self.tags = [f"metric/{i:02d}" for i in range(params.tags)]
        self.queued: list[int] = []  # steps queued, not yet sent
        self.queued_at = 0.0  # when the oldest queued step was queued
        self.next_sequence = 1
        self.acked = 0
        self.in_flight = 0
        self.steps: deque[tuple[int, float]] = deque()  # (last sequence, queued at) of steps not yet acked
        self.measuring = False
        self.wake = asyncio.Event()

    @property
    def backlog(self) -> int:
        return self.next_sequence - 1 - self.acked + len(self.queued) * self.params.tags

    async def open(self) -> None:
        params = self.params
        answer = await self.stub.OpenSession(
            pb.OpenSessionRequest(
                session_id=self.session_id,
                run=params.run,
                worker=f"rank-{self.rank}",
                world_size=params.world_size,
                next_sequence=1,
                aggregate_off=not params.aggregate,
            ),
            timeout=120,
        )
        self.pacing.advise(answer.pacing.linger_seconds, answer.pacing.max_in_flight)

    async def play(self, start: float, end: float) -> None:
        loop = asyncio.get_running_loop()
        clock_offset = time.time() - loop.time()
        call = self.stub.Write()
        reader = asyncio.ensure_future(self._read(call, loop))
        interval = 1.0 / self.params.steps_per_second
        # Ranks step in lockstep, as data-parallel ranks do, each a little off the others.
        next_step = start - clock_offset + (self.rank % 97) / 97 * interval
        step = 0
        try:
            while True:
                now = loop.time()
                if now >= end - clock_offset:
                    return
                if now >= next_step:
                    if not self.queued:
                        self.queued_at = now
                    self.queued.append(step)
                    if self.measuring:
                        self.counts.offered += self.params.tags
                    step += 1
                    next_step += interval
                await self._send_ready(call, now)
                wait = next_step - now
                if self.queued and self.in_flight < self.pacing.max_in_flight:
                    wait = min(wait, self.queued_at + self.pacing.linger_secs - now)
                self.wake.clear()
                if wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.wake.wait(), wait)
        finally:
            call.cancel()
            reader.cancel()

    async def _send_ready(self, call: Any, now: float) -> None:
        params, pacing = self.params, self.pacing
        while self.queued and self.in_flight < pacing.max_in_flight:
            full = len(self.queued) * params.tags >= params.max_batch_events
            if not full and now - self.queued_at < pacing.linger_secs:
                return
            most = max(1, params.max_batch_events // params.tags)
            steps, self.queued = self.queued[:most], self.queued[most:]
            tags = params.tags
            columns = pb.ScalarColumns(
                tags=self.tags,
                tag_index=list(range(tags)) * len(steps),
                step=[s for s in steps for _ in range(tags)],
                wall_time=[time.time()] * (tags * len(steps)),
                value=[self.rank + s * 0.001 + i for s in steps for i in range(tags)],
            )
            first = self.next_sequence
            self.next_sequence += tags * len(steps)
            for k in range(len(steps)):
                self.steps.append((first + (k + 1) * tags - 1, self.queued_at))
            request = pb.WriteRequest(first_sequence=first, scalars=columns)
            if first == 1:
                request.session_id = self.session_id
            self.in_flight += 1
            if self.measuring:
                self.counts.messages += 1
            await call.write(request)
            self.queued_at = now

    async def _read(self, call: Any, loop: asyncio.AbstractEventLoop) -> None:
        try:
            async for ack in call:
                if ack.HasField("pacing"):
                    self.pacing.advise(ack.pacing.linger_seconds, ack.pacing.max_in_flight)
                if ack.acked_sequence > self.acked:
                    now = loop.time()
                    if self.measuring:
                        self.counts.acked += ack.acked_sequence - self.acked
                    self.acked = ack.acked_sequence
                    self.in_flight = max(0, self.in_flight - 1)
                    while self.steps and self.steps[0][0] <= self.acked:
                        _, queued_at = self.steps.popleft()
                        if self.measuring:
                            self.counts.visibility.append(now - queued_at)
                self.wake.set()
        except (grpc.RpcError, asyncio.CancelledError):
            return


async def play(params: LoadParams) -> dict[str, Any]:
    channels = [aio.insecure_channel(params.address) for _ in range(max(1, params.workers // 128))]
    counts = Counts()
    workers = [
        Worker(params, params.first_rank + i, pb_grpc.SummariesStub(channels[i % len(channels)]), counts)
        for i in range(params.workers)
    ]
    for chunk in range(0, len(workers), 64):
        await asyncio.gather(*(w.open() for w in workers[chunk : chunk + 64]))
    print("ready", flush=True)
    start = float(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
    window_start, window_end = start + params.warmup, start + params.warmup + params.seconds
    tasks = [asyncio.ensure_future(w.play(start, window_end)) for w in workers]
    await asyncio.sleep(max(0.0, window_start - time.time()))
    for w in workers:
        w.measuring = True
    backlog_start = sum(w.backlog for w in workers)
    cpu_start = _cpu()
    await asyncio.sleep(max(0.0, window_end - time.time()))
    backlog_end = sum(w.backlog for w in workers)
    cpu = _cpu() - cpu_start
    for w in workers:
        w.measuring = False
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close(None)
    # Each step's visibility, sorted and thinned to at most 2,000 values (quantiles keep; one line stays short).
    visibility = sorted(counts.visibility)
    counts.visibility = visibility[:: max(1, len(visibility) // 2000)]
    return {
        **asdict(counts),
        "backlog_start": backlog_start,
        "backlog_end": backlog_end,
        "generator_cpu_s": cpu,
        "linger_s": sorted(w.pacing.linger_secs for w in workers)[len(workers) // 2],
        "in_flight": sorted(w.pacing.max_in_flight for w in workers)[len(workers) // 2],
    }


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    params = LoadParams.from_json(json.loads(sys.argv[1]))
    result = uvloop.run(play(params))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
