"""Multi-worker jobs for the aggregation tests: worker processes (`_aggregate_worker.py`) started on a daemon,
the points TensorBoard's loader reads back, and the wait for a job's aggregate runs to close."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import uuid
from pathlib import Path

import grpc
import numpy as np
from _aggregate_worker import value
from tensorboard.backend.event_processing import event_accumulator

from _support import Daemon, event_files, wait_for
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

WORKER = Path(__file__).with_name("_aggregate_worker.py")


REDUCTIONS = ("mean", "min", "max", "std")


WORKERS_TIMEOUT = 90.0


def start_workers(
    daemon: Daemon, tmp_path: Path, world: int, **spec: object
) -> tuple[list[subprocess.Popen[bytes]], Path]:
    """`world` worker processes of the run `job` logging `spec["steps"]`; `spec` per rank as `{rank: {...}}`
    under "ranks". Returns them and their barrier directory."""
    barrier = tmp_path / f"barrier-{uuid.uuid4().hex[:8]}"
    barrier.mkdir()
    per_rank: dict[int, dict[str, object]] = spec.pop("ranks", {})  # type: ignore[assignment]
    procs = []
    for rank in range(world):
        worker = {
            "address": daemon.address,
            "run": "job",
            "rank": rank,
            "world": world,
            "barrier": str(barrier),
            **spec,
            **per_rank.get(rank, {}),
        }
        procs.append(subprocess.Popen([sys.executable, str(WORKER), json.dumps(worker)]))
    return procs, barrier


def finish(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        assert proc.wait(WORKERS_TIMEOUT) == 0


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """A run's points of `tag`, as TensorBoard's loader reads them (every file of the run, in name order)."""
    if not event_files(run_dir):  # not written yet
        return []
    accumulator = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    if tag not in accumulator.Tags()["scalars"]:
        return []
    return [(e.step, e.value) for e in accumulator.Scalars(tag)]


def wait_aggregates_closed(daemon: Daemon) -> None:
    """Until the aggregator of the run `job` stopped: its aggregate runs are no longer open."""
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.SummariesStub(channel)

        def closed() -> bool:
            runs = stub.GetStatus(pb.GetStatusRequest(), timeout=10).runs
            return not any(run.run_dir.startswith("job/") for run in runs)

        wait_for(closed, 60, "the aggregate runs to be closed")


def stored(x: float) -> float:
    """A value as TensorBoard stores a scalar: float32."""
    return float(np.float32(x))


def expected(step: int, ranks: range | list[int]) -> dict[str, float]:
    """The reductions of a step over `ranks`, computed here with numpy in float64."""
    values = np.array([np.float32(value(rank, step)) for rank in ranks], dtype=np.float64)
    return {
        "mean": stored(values.mean()),
        "min": stored(values.min()),
        "max": stored(values.max()),
        "std": stored(math.sqrt(math.fsum((values - math.fsum(values) / len(values)) ** 2) / len(values))),
    }
