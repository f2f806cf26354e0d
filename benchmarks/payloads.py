"""Benchmark 3, histograms and images: the caller's cost per call, and calls per second until `close()`.

A histogram is `add_histogram(tag, values, step, bins=1000)` of the same 10,000 normally distributed values;
an image is `add_image(tag, img, step)` of one 3x64x64 `uint8` array (CHW, torch's default format) of noise,
which PNG cannot shrink much. Each call is timed alone on the calling thread; the run is timed from the first
call until `close()` returned (summaryd: every event acknowledged and fsynced by the daemon).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks._contenders import SUMMARYD, WriterSpec, import_training_runtime, open_writer
from benchmarks.caller_cost import percentile

HISTOGRAM = "histogram"
IMAGE = "image"
HISTOGRAM_VALUES = 10_000
HISTOGRAM_BINS = 1000
IMAGE_SHAPE = (3, 64, 64)


@dataclass(frozen=True)
class PayloadParams:
    writer: WriterSpec
    kind: str
    """`histogram` or `image`."""
    calls: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PayloadParams:
        return cls(**{**data, "writer": WriterSpec.from_json(data["writer"])})


@dataclass(frozen=True)
class PayloadResult:
    calls: int
    p50_ns: int
    p99_ns: int
    seconds: float
    """From the first call until `close()` returned."""
    delivered: int


def prepare(raw: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
    import numpy as np

    params = PayloadParams.from_json(raw)
    import_training_runtime()
    opened = open_writer(params.writer)
    writer = opened.writer
    rng = np.random.default_rng(0)
    if params.kind == HISTOGRAM:
        values = rng.normal(size=HISTOGRAM_VALUES).astype(np.float32)

        def log(step: int) -> None:
            writer.add_histogram("weights", values, step, bins=HISTOGRAM_BINS)

    elif params.kind == IMAGE:
        image = rng.integers(0, 256, size=IMAGE_SHAPE, dtype=np.uint8)

        def log(step: int) -> None:
            writer.add_image("sample", image, step)

    else:
        raise ValueError(f"unknown payload {params.kind!r}")
    latencies = array("q", bytes(8 * params.calls))

    def run() -> dict[str, Any]:
        clock = time.perf_counter_ns
        started = time.perf_counter()
        for step in range(params.calls):
            start = clock()
            log(step)
            latencies[step] = clock() - start
        delivered = opened.close().delivered
        seconds = time.perf_counter() - started
        if params.writer.kind == SUMMARYD and delivered != params.calls:
            raise RuntimeError(f"summaryd delivered {delivered} of {params.calls}")
        ordered = array("q", sorted(latencies))
        return asdict(
            PayloadResult(params.calls, percentile(ordered, 0.5), percentile(ordered, 0.99), seconds, delivered)
        )

    return run
