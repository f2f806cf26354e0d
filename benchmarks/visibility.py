"""Benchmark 4, visibility: from `add_scalar` returning until TensorBoard's own reader yields the point.

The trial logs one point every `interval_ms` and a reader thread polls the run directory every millisecond
with `tensorboard.backend.event_processing.event_file_loader.EventFileLoader`, the loader TensorBoard's
`--load_fast=false` path reads event files with (it tails a growing file). A point's latency is the time from
its `add_scalar` returning until the reader first yields it; a point not seen `wait_s` after the last one was
logged counts as not visible (tensorboardX buffers its file: `max_queue` events or `flush_secs`).
"""

from __future__ import annotations

import glob
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks._contenders import WriterSpec, open_writer

TAG = "visible"


@dataclass(frozen=True)
class VisibilityParams:
    writer: WriterSpec
    run_dir: str
    """Where the writer's event files appear (the daemon's logdir joined with the run, or the local dir)."""
    points: int
    interval_ms: float
    wait_s: float


@dataclass(frozen=True)
class VisibilityResult:
    points: int
    latencies_s: list[float]
    """One per point seen, in step order of the points seen."""
    unseen: int


class _Reader(threading.Thread):
    """Polls the run directory with TensorBoard's loader, one loader per event file, noting when each step of
    `TAG` first comes out."""

    def __init__(self, run_dir: str) -> None:
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.seen: dict[int, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        loaders: dict[str, EventFileLoader] = {}
        while not self.stop.is_set():
            for path in sorted(glob.glob(os.path.join(self.run_dir, "*tfevents*"))):
                loader = loaders.get(path)
                if loader is None:
                    loader = loaders[path] = EventFileLoader(path)
                for event in loader.Load():
                    now = time.monotonic()
                    for value in event.summary.value:
                        if value.tag == TAG:
                            self.seen.setdefault(event.step, now)
            time.sleep(0.001)


def prepare(raw: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
    params = VisibilityParams(**{**raw, "writer": WriterSpec.from_json(raw["writer"])})
    # Imported here, outside the timed part (torch's writer imports it too).
    import tensorboard.backend.event_processing.event_file_loader  # noqa: F401

    writer = open_writer(params.writer)
    reader = _Reader(params.run_dir)

    def run() -> dict[str, Any]:
        reader.start()
        logged: list[float] = []
        for step in range(params.points):
            writer.add_scalar(TAG, float(step), step)
            logged.append(time.monotonic())
            time.sleep(params.interval_ms / 1000)
        deadline = time.monotonic() + params.wait_s
        while len(reader.seen) < params.points and time.monotonic() < deadline:
            time.sleep(0.005)
        reader.stop.set()
        reader.join()
        writer.close()
        seen = dict(reader.seen)
        latencies = [max(0.0, seen[step] - logged[step]) for step in range(params.points) if step in seen]
        return asdict(VisibilityResult(params.points, latencies, params.points - len(latencies)))

    return run
