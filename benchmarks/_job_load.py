"""The lean load generator of the job-shape benchmark: many simulated workers of one run in one process.

`python -m benchmarks._job_load PARAMS_JSON` opens a session for each of its workers (`rank-<first>` ..), says
`ready` on stdout, reads the start time (Unix seconds) from stdin, and then plays each worker: a step every
`1 / steps_per_second` seconds logging `tags` scalars, queued, and sent as one batch of scalar columns the way
the client's sender sends it: a partial batch waits `linger` (the daemon's pacing within the client's bound,
`summaryd.client._sender._pacing.Pacing`, the very object the client uses) and at most `max_in_flight` batches
are unacknowledged. It counts the scalars offered in the measured window (after the warm-up) and those of them
acknowledged by `grace` seconds after the window's end (the load goes on meanwhile), each such step's visibility
(from its own queueing to its ack), the backlog's trend (queued and unacknowledged scalars, sampled every 0.1 s of
the window, fitted by least squares), and prints one JSON line with its figures and its own CPU.

Why acknowledgements are matched to what was offered: a paced worker sends once a linger (a second or so under
a big job) and ranks step in lockstep, so the backlog is a sawtooth with the linger's period, and the acks
*received* in a window trail its offer by up to a linger: 5-10 % of a 10-20 s window, either way, by where the
window's ends fall on the tooth. Counting the window's own scalars, acknowledged within the grace (3 s: the
longest linger the pacing asks, 2 s, and a second for the trip and the commit), measures whether the daemon keeps
up; a daemon behind acks later and later, past it; the fitted trend says whether a backlog grows.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import math
import os
import resource
import statistics
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
from summaryd.server.server import tune_collector
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

GENERATOR_NICENESS = 10


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
    grace: float = 3.0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LoadParams:
        return cls(**data)


@dataclass
class Counts:
    offered: int = 0
    acked: int = 0  # of the offered scalars, those acknowledged by the window's end + grace
    messages: int = 0
    visibility: list[float] = field(default_factory=list)


class Clock:
    """One timer for every worker of the process: steps are taken a phase of ranks at a time and a worker is
    woken only when it has a batch to send, so the generator's own CPU goes on what a client does (building
    and writing batches), not on thousands of per-step timeouts that take cores from the daemon it measures."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._heap: list[tuple[float, int, Worker | Phase]] = []
        self._order = 0
        self._wake: asyncio.Future[None] | None = None
        self._wake_at = math.inf
        self._timer: asyncio.TimerHandle | None = None

    def at(self, when: float, what: Worker | Phase) -> None:
        self._order += 1
        heapq.heappush(self._heap, (when, self._order, what))
        if when < self._wake_at and self._wake is not None and not self._wake.done():
            self._arm(when)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._wake_at = when
        wake = self._wake
        assert wake is not None
        self._timer = self.loop.call_at(when, _resolve, wake)

    async def run(self, end: float) -> None:
        heap = self._heap
        while True:
            now = self.loop.time()
            if now >= end:
                return
            while heap and heap[0][0] <= now:
                when, _, what = heapq.heappop(heap)
                what.fire(when, now, self)
            self._wake = self.loop.create_future()
            self._arm(min(heap[0][0] if heap else end, end))
            await self._wake


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Phase:
    """The ranks that step at the same moment (data-parallel ranks step in lockstep, each a little off)."""

    def __init__(self, workers: list[Worker], interval: float) -> None:
        self.workers = workers
        self.interval = interval
        self.step = 0

    def fire(self, when: float, now: float, clock: Clock) -> None:
        for worker in self.workers:
            worker.queue_step(self.step, now)
        self.step += 1
        clock.at(when + self.interval, self)


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
        self.tag_index = list(range(params.tags))
        self.values = [float(rank + i) for i in range(params.tags)]
        self.queued: list[int] = []  # steps queued, not yet sent
        self.queued_when: list[float] = []  # when each queued step was queued; inf: not offered in the window
        self.queued_at = 0.0  # when the oldest queued step was queued
        self.next_sequence = 1
        self.acked = 0
        self.in_flight = 0
        # (last sequence, queued at; inf: not counted) of the steps sent and not yet acked
        self.steps: deque[tuple[int, float]] = deque()
        self.measuring = False
        self.counting_until = math.inf  # acks of the window's steps count until then (loop time)
        self.clock: Clock | None = None
        self.scheduled_at = math.inf  # when the clock wakes this worker next (inf: not scheduled)
        self._ready: asyncio.Future[None] | None = None

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

    def queue_step(self, step: int, now: float) -> None:
        if not self.queued:
            self.queued_at = now
        self.queued.append(step)
        if self.measuring:
            self.counts.offered += self.params.tags
            self.queued_when.append(now)
        else:
            self.queued_when.append(math.inf)
        self._schedule(now)

    def _due(self) -> float:
        """When this worker next sends, as the client's sender would: a full batch at once, a partial one when
        its linger is out; never with the in-flight window full (an ack reopens it)."""
        if not self.queued or self.in_flight >= self.pacing.max_in_flight:
            return math.inf
        if len(self.queued) * self.params.tags >= self.params.max_batch_events:
            return self.queued_at
        return self.queued_at + self.pacing.linger_secs

    def _schedule(self, now: float) -> None:
        due = self._due()
        if due <= now:
            self.wake()
        elif due < self.scheduled_at or self.scheduled_at <= now:
            self.scheduled_at = due
            assert self.clock is not None
            self.clock.at(due, self)

    def fire(self, when: float, now: float, clock: Clock) -> None:
        if when == self.scheduled_at:
            self.scheduled_at = math.inf
            self.wake()

    def wake(self) -> None:
        if self._ready is not None:
            _resolve(self._ready)

    async def play(self, clock: Clock, end: float) -> None:
        loop = clock.loop
        self.clock = clock
        call = self.stub.Write()
        reader = asyncio.ensure_future(self._read(call, loop))
        try:
            while loop.time() < end:
                self._ready = loop.create_future()
                self._schedule(loop.time())
                await self._ready
                await self._send_ready(call, loop)
        finally:
            call.cancel()
            reader.cancel()

    async def _send_ready(self, call: Any, loop: asyncio.AbstractEventLoop) -> None:
        params, pacing, tags = self.params, self.pacing, self.params.tags
        while self.queued and self.in_flight < pacing.max_in_flight:
            now = loop.time()
            full = len(self.queued) * tags >= params.max_batch_events
            if not full and now - self.queued_at < pacing.linger_secs:
                return
            most = max(1, params.max_batch_events // tags)
            steps, self.queued = self.queued[:most], self.queued[most:]
            when, self.queued_when = self.queued_when[:most], self.queued_when[most:]
            columns = pb.ScalarColumns(
                tags=self.tags,
                tag_index=self.tag_index * len(steps),
                step=[s for s in steps for _ in self.tag_index],
                wall_time=[time.time()] * (tags * len(steps)),
                value=[v + s * 0.001 for s in steps for v in self.values],
            )
            first = self.next_sequence
            self.next_sequence += tags * len(steps)
            for k in range(len(steps)):
                self.steps.append((first + (k + 1) * tags - 1, when[k]))
            request = pb.WriteRequest(first_sequence=first, scalars=columns)
            if first == 1:
                request.session_id = self.session_id
            self.in_flight += 1
            if self.measuring:
                self.counts.messages += 1
            self.queued_at = now
            await call.write(request)

    async def _read(self, call: Any, loop: asyncio.AbstractEventLoop) -> None:
        try:
            async for ack in call:
                if ack.HasField("pacing"):
                    self.pacing.advise(ack.pacing.linger_seconds, ack.pacing.max_in_flight)
                if ack.acked_sequence > self.acked:
                    now = loop.time()
                    self.acked = ack.acked_sequence
                    self.in_flight = max(0, self.in_flight - 1)
                    while self.steps and self.steps[0][0] <= self.acked:
                        _, queued_at = self.steps.popleft()
                        if queued_at != math.inf and now <= self.counting_until:
                            self.counts.acked += self.params.tags
                            self.counts.visibility.append(now - queued_at)
                self._schedule(loop.time())
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
    loop = asyncio.get_running_loop()
    start = float(await loop.run_in_executor(None, sys.stdin.readline))
    window_start, window_end = start + params.warmup, start + params.warmup + params.seconds
    clock_offset = time.time() - loop.time()
    clock, interval = Clock(loop), 1.0 / params.steps_per_second
    # Ranks step in lockstep, as data-parallel ranks do, each a little off the others (97 phases).
    phases: dict[int, list[Worker]] = {}
    for w in workers:
        phases.setdefault(w.rank % 97, []).append(w)
    for phase, members in phases.items():
        clock.at(start - clock_offset + phase / 97 * interval, Phase(members, interval))
    # The load goes on through the grace, so that the window's last steps are acked under the same load.
    end = window_end + params.grace - clock_offset
    tasks = [asyncio.ensure_future(w.play(clock, end)) for w in workers]
    ticking = asyncio.ensure_future(clock.run(end))
    await asyncio.sleep(max(0.0, window_start - time.time()))
    for w in workers:
        w.measuring = True
        w.counting_until = end
    cpu_start = _cpu()
    backlog: list[tuple[float, int]] = []
    while (now := time.time()) < window_end:
        backlog.append((now, sum(w.backlog for w in workers)))
        await asyncio.sleep(min(0.1, window_end - now))
    cpu = _cpu() - cpu_start
    for w in workers:
        w.measuring = False
    await ticking
    for w in workers:
        w.wake()
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close(None)
    # Each step's visibility, sorted and thinned to at most 2,000 values to the microsecond (quantiles keep; the
    # result stays one line well under a pipe's 64 KiB: a floor division's stride kept up to 3,999 values, and a
    # line past 64 KiB came to the parent cut at 64 KiB).
    visibility = sorted(counts.visibility)
    counts.visibility = [round(v, 6) for v in visibility[:: -(-len(visibility) // 2000) or 1]]
    return {
        **asdict(counts),
        "backlog_growth": _trend(backlog) * params.seconds,
        "generator_cpu_s": cpu,
        "linger_s": sorted(w.pacing.linger_secs for w in workers)[len(workers) // 2],
        "in_flight": sorted(w.pacing.max_in_flight for w in workers)[len(workers) // 2],
    }


def _trend(samples: list[tuple[float, int]]) -> float:
    """The least-squares slope of `(time, value)` samples, per second (0 for fewer than two)."""
    if len(samples) < 2:
        return 0.0
    times, values = zip(*samples, strict=True)
    return statistics.linear_regression(times, values).slope


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    params = LoadParams.from_json(json.loads(sys.argv[1]))
    # The clients of a real job run on their own nodes; here they share the target's cores, and the scheduler
    # gives the target its CPU first (the generators' own CPU is still measured and printed).
    os.nice(GENERATOR_NICENESS)
    # As the daemon does: with a thousand workers' objects, CPython's full collections took a tenth of the
    # generator's CPU, a cost a cluster's ranks pay on their own nodes, not the daemon's.
    tune_collector()
    result = uvloop.run(play(params))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
