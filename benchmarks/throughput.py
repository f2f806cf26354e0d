"""Benchmark 2, end-to-end throughput: scalars from the first `add_scalar` until `close()` has returned.

For summaryd, `close()` returns once the daemon has written and fsynced every event; the trial fails unless
every event was delivered. torch's and tensorboardX's `close()` flush their file but do not fsync it.
Several client processes run the same trial at once and are timed from the earliest start to the latest end
(on Linux `time.monotonic` is one clock for every process).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks._contenders import SUMMARYD, WriterSpec, import_training_runtime, open_writer
from benchmarks._gc_pauses import FullCollections


@dataclass(frozen=True)
class ThroughputParams:
    writer: WriterSpec
    events: int
    import_torch: bool = True

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ThroughputParams:
        return cls(**{**data, "writer": WriterSpec.from_json(data["writer"])})


@dataclass(frozen=True)
class ThroughputResult:
    events: int
    started: float
    """`time.monotonic()` at the first call, and when `close()` had returned."""
    ended: float
    close_s: float
    delivered: int
    synced: bool
    full_gcs: int
    """Full garbage collections from the first call until `close()` returned, and their time together."""
    gc_paused_s: float


def prepare(raw: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
    params = ThroughputParams.from_json(raw)
    if params.import_torch:
        import_training_runtime()
    writer = open_writer(params.writer)

    def run() -> dict[str, Any]:
        add_scalar = writer.add_scalar
        with FullCollections() as gcs:
            started = time.monotonic()
            for step in range(params.events):
                add_scalar("loss", step * 0.001, step)
            closing = time.monotonic()
            closed = writer.close()
            ended = time.monotonic()
        if params.writer.kind == SUMMARYD and (closed.delivered != params.events or not closed.synced):
            raise RuntimeError(f"summaryd delivered {closed.delivered} of {params.events} (synced {closed.synced})")
        result = ThroughputResult(
            params.events,
            started,
            ended,
            ended - closing,
            closed.delivered,
            closed.synced,
            gcs.count,
            gcs.total_ns / 1e9,
        )
        return asdict(result)

    return run
