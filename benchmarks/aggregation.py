"""Benchmarks 10 and 12, what cross-worker aggregation and the watch cost the daemon: its CPU per event with each
on and off.

The feeder plays `workers` workers of one job (sessions `rank-0` .. `rank-N-1` of one run, `world_size` N) over
the raw gRPC stream: round after round, each worker sends its next `batch_steps` steps of one scalar tag as
scalar columns, as the client does; every session is closed at the end (with aggregation on, the last close
writes the last aggregates). The daemon's CPU (user + system, all its threads, from `/proc/<pid>/stat`) over the
feed, divided by the events fed, is the figure; the daemon runs with `--aggregate` or `--no-aggregate` (and, for
the watch, `--no-aggregate` with `--watch` or `--no-watch`).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc

from benchmarks._report import Spread, table
from benchmarks._run import Run, Target, alternate, median, running_daemon
from benchmarks._trials import run_trial
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

_TICK = os.sysconf("SC_CLK_TCK")
_TIMEOUT = 600.0
WORKER_COUNTS = (8, 64)
ON, OFF = "on", "off"


@dataclass(frozen=True)
class AggregationParams:
    address: str
    daemon_pid: int
    workers: int
    events: int
    """Scalars in all, split evenly over the workers."""
    batch_steps: int = 500

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AggregationParams:
        return cls(**data)


def daemon_cpu(pid: int) -> float:
    """CPU seconds of process `pid`, all its threads."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def prepare(raw: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
    params = AggregationParams.from_json(raw)
    channel = grpc.insecure_channel(params.address)
    stub = pb_grpc.SummariesStub(channel)
    run, world = f"agg-{uuid.uuid4().hex[:8]}", params.workers
    sessions = [str(uuid.uuid4()) for _ in range(world)]
    for rank, session_id in enumerate(sessions):
        request = pb.OpenSessionRequest(session_id=session_id, run=run, worker=f"rank-{rank}", world_size=world)
        stub.OpenSession(request, timeout=30)
    steps = params.events // world
    now = time.time()

    def batch(rank: int, first_step: int, count: int) -> pb.ScalarColumns:
        return pb.ScalarColumns(
            tags=["loss"],
            tag_index=[0] * count,
            step=range(first_step, first_step + count),
            wall_time=[now] * count,
            value=[rank + step * 0.001 for step in range(first_step, first_step + count)],
        )

    def feed() -> dict[str, Any]:
        started, cpu_before = time.perf_counter(), daemon_cpu(params.daemon_pid)
        for first in range(0, steps, params.batch_steps):
            count = min(params.batch_steps, steps - first)
            for rank, session_id in enumerate(sessions):
                request = pb.WriteRequest(
                    session_id=session_id, first_sequence=first + 1, scalars=batch(rank, first, count)
                )
                for _ in stub.Write(iter([request]), timeout=60):
                    pass
        for session_id in sessions:
            stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), timeout=60)
        seconds = time.perf_counter() - started
        cpu = daemon_cpu(params.daemon_pid) - cpu_before
        channel.close()
        return {"events": steps * world, "seconds": seconds, "daemon_cpu_s": cpu}

    return feed


def aggregation(run: Run) -> str:
    """Section 10: the daemon's CPU per event fed by 8 and 64 workers, aggregation on and off."""
    return _on_and_off(run, "aggregation", WORKER_COUNTS, ["--aggregate"], ["--no-aggregate"])


def watch(run: Run) -> str:
    """Section 12: the daemon's CPU per event fed by 8 and 256 workers, the watch on and off (aggregation off)."""
    # The watch's target (issue: "daemon CPU per scalar with watching on vs off, 8 and 256 workers ≤ +1 µs").
    return _on_and_off(
        run, "watch", (8, 256), ["--no-aggregate", "--watch"], ["--no-aggregate", "--no-watch"], added_bound=1.0
    )


_TITLES = {"aggregation": "10. Daemon CPU of cross-worker aggregation", "watch": "12. Daemon CPU of the watch"}


def _on_and_off(
    run: Run,
    section: str,
    worker_counts: tuple[int, ...],
    on: list[str],
    off: list[str],
    added_bound: float | None = None,
) -> str:
    """The daemon's CPU per scalar fed by each of `worker_counts` workers with the flags `on` and `off`; with
    `added_bound`, a target that `on` adds at most that many µs per scalar to `off` (medians)."""
    plan = run.plan
    rows = []
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    labels = {ON: f"{section} on", OFF: f"{section} off"}
    for workers in worker_counts:

        def one(label: str, round_: int, workers: int = workers) -> dict[str, Any]:
            with running_daemon(run.workdir, *(on if label == labels[ON] else off)) as daemon:
                params = AggregationParams(daemon.address, daemon.pid, workers, plan.cpu_events)
                result = run_trial("aggregation_feed", asdict(params), run.workdir, _TIMEOUT)
            return {**result, "cpu_us_per_event": result["daemon_cpu_s"] * 1e6 / result["events"]}

        found = alternate(f"{section}: {workers} workers", list(labels.values()), plan.cpu_repeats, one)
        results[str(workers)] = found
        yes, no = found[labels[ON]], found[labels[OFF]]
        added = median(yes, "cpu_us_per_event") - median(no, "cpu_us_per_event")
        if added_bound is not None:
            name = f"daemon CPU per scalar, {section} on - off, {workers} workers"
            run.targets.append(Target(name, added, added_bound, at_least=False, unit=" µs"))
        rows.append(
            [
                str(workers),
                Spread.of([r["cpu_us_per_event"] for r in yes]).cell(lambda v: f"{v:.2f}"),
                Spread.of([r["cpu_us_per_event"] for r in no]).cell(lambda v: f"{v:.2f}"),
                f"{added:+.2f}",
            ]
        )
    run.results[section] = results
    about = (
        f"{plan.cpu_events:,} scalars per trial split over the workers of one run, sent as scalar columns of "
        f"{AggregationParams.__dataclass_fields__['batch_steps'].default} steps per batch, each worker in turn; "
        f"a fresh daemon per trial, {plan.cpu_repeats} trials per setting; median (min-max) over trials of the "
        "daemon's CPU (all threads) from the first batch until every session was closed, per scalar fed."
    )
    headers = ["workers", "daemon CPU µs/event, on", "off", "on - off µs"]
    return "\n".join([f"### {_TITLES[section]}", "", about, "", table(headers, rows)])
