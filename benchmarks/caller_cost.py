"""Benchmark 1, caller cost: what one `add_scalar` costs the calling thread, timed call by call.

Each call is timed alone with `time.perf_counter_ns` (the two clock reads, about 0.1 µs, are included for
every contender alike). Back to back, the calls also meet the writer's back pressure (torch's queue of 10
events blocks the caller once its writer thread lags); paced, a sleep between calls releases the GIL the way
a training step spent in native kernels does, and the writer's own thread gets to run in between.
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks._contenders import WriterSpec, import_training_runtime, open_writer
from benchmarks._gc_pauses import FullCollections


@dataclass(frozen=True)
class CallerParams:
    writer: WriterSpec
    calls: int
    pace_us: float = 0.0
    """0: back to back; otherwise `time.sleep` this long between calls."""
    import_torch: bool = True

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CallerParams:
        return cls(**{**data, "writer": WriterSpec.from_json(data["writer"])})


@dataclass(frozen=True)
class CallerResult:
    calls: int
    p50_ns: int
    p99_ns: int
    max_ns: int
    loop_s: float
    """Wall time of the whole loop (pauses included)."""
    close_s: float
    full_gcs: int
    """Full garbage collections during the loop, and the longest of them."""
    longest_gc_ns: int
    delivered: int
    undelivered: int


def percentile(sorted_values: array[int], q: float) -> int:
    """Nearest-rank percentile of already sorted values."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def prepare(raw: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
    """Open the writer (outside the timed part); the returned function runs the timed loop and closes."""
    params = CallerParams.from_json(raw)
    if params.import_torch:
        import_training_runtime()
    writer = open_writer(params.writer)
    latencies = array("q", bytes(8 * params.calls))
    pace = params.pace_us / 1e6

    def run() -> dict[str, Any]:
        add_scalar = writer.add_scalar
        clock = time.perf_counter_ns
        sleep = time.sleep
        began = time.perf_counter()
        with FullCollections() as gcs:
            for step in range(params.calls):
                value = step * 0.001
                start = clock()
                add_scalar("loss", value, step)
                latencies[step] = clock() - start
                if pace:
                    sleep(pace)
        loop_s = time.perf_counter() - began
        closed = writer.close()
        close_s = time.perf_counter() - began - loop_s
        ordered = array("q", sorted(latencies))
        return asdict(
            CallerResult(
                calls=params.calls,
                p50_ns=percentile(ordered, 0.50),
                p99_ns=percentile(ordered, 0.99),
                max_ns=ordered[-1],
                loop_s=loop_s,
                close_s=close_s,
                full_gcs=gcs.count,
                longest_gc_ns=gcs.longest_ns,
                delivered=closed.delivered,
                undelivered=closed.undelivered,
            )
        )

    return run
