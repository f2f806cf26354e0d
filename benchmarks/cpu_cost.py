"""Benchmark 8, what logging costs the training process: CPU of every thread, and the wall time a GIL-bound
step loop loses.

`back_to_back`: `add_scalar` called `events` times in a row, then `close()`; the process's CPU time (user +
system, all threads, from `/proc/self/stat`, which keeps the time of threads that ended) over the loop and the
close, and each live thread's share (`/proc/self/task/*/stat`, read just before `close()`), by thread name.
`gil_loop`: a step loop whose step is pure Python (it holds the GIL, as data pipelines, RL environments and
small-op models do) logging `per_step` scalars a step; its wall time, to compare with the same loop calling an
empty function. The other calls (`CALLS`: histograms, images, serialized summaries) are measured as
`back_to_back` is, but the threads' shares are read after `flush()`, which waits for the work that lags
behind the calls.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks._contenders import SUMMARYD, OpenWriter, WriterSpec, import_training_runtime, open_writer
from benchmarks.payloads import HISTOGRAM, HISTOGRAM_BINS, HISTOGRAM_VALUES, IMAGE, IMAGE_SHAPE

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuParams:
    writer: dict[str, Any]
    events: int
    mode: str
    """`back_to_back` or `gil_loop` (`add_scalar`), or one of `CALLS`: that call back to back."""
    per_step: int = 20
    step_work: int = 300
    """Iterations of the pure-Python step body (a few tens of microseconds)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CpuParams:
        return cls(**data)


@dataclass(frozen=True)
class CpuResult:
    events: int
    loop_s: float
    """Wall time of the loop alone."""
    cpu_s: float
    """CPU of the process, all threads, over the loop and `close()`."""
    threads: dict[str, float]
    """CPU of each live thread over the loop, by name."""


def _cpu_seconds(stat: str) -> float:
    # The command name (field 2) may hold spaces: the fields counted from after its closing parenthesis.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def process_cpu() -> float:
    return _cpu_seconds(Path("/proc/self/stat").read_text())


def threads_cpu() -> dict[str, float]:
    """CPU seconds of each live thread, by its Python name (the OS name for threads Python did not start)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            comm = (task / "comm").read_text().strip()
        except FileNotFoundError:  # ended meanwhile
            continue
        name = names.get(int(task.name), comm)
        name = "main" if name == "MainThread" else name.split("[")[0]  # one row per kind of thread
        out[name] = out.get(name, 0.0) + _cpu_seconds(stat)
    return out


def _step(work: int) -> float:
    total = 0.0
    for i in range(work):
        total += i * 0.5
    return total


SUMMARY = "summary"
CALLS = (HISTOGRAM, IMAGE, SUMMARY)
"""The other calls audited beside `add_scalar`: `add_histogram` and `add_image` as in the payloads section, and
`add_summary` of a serialized one-scalar `Summary`, the path of the TF-style hooks (torch: its file writer's
`add_summary` of the `Summary` proto, the same call of torch's own)."""


def _other_call(mode: str, opened: OpenWriter, kind: str) -> Callable[[int], None]:
    """One call of `mode` for the writer `opened` (of `kind`), given the step."""
    import numpy as np
    from tensorboard.compat.proto.summary_pb2 import Summary

    writer = opened.writer
    rng = np.random.default_rng(0)
    if mode == HISTOGRAM:
        values = rng.normal(size=HISTOGRAM_VALUES).astype(np.float32)
        return lambda step: writer.add_histogram("weights", values, step, bins=HISTOGRAM_BINS)
    if mode == IMAGE:
        image = rng.integers(0, 256, size=IMAGE_SHAPE, dtype=np.uint8)
        return lambda step: writer.add_image("sample", image, step)
    summary = Summary(value=[Summary.Value(tag="loss", simple_value=0.5)])
    if kind == SUMMARYD:
        data = summary.SerializeToString()
        return lambda step: writer.add_summary(data, step)
    file_writer = writer._get_file_writer()
    return lambda step: file_writer.add_summary(summary, step)


def prepare(raw: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
    params = CpuParams.from_json(raw)
    import_training_runtime()
    spec = WriterSpec.from_json(params.writer)
    writer = open_writer(spec)
    other = _other_call(params.mode, writer, spec.kind) if params.mode in CALLS else None

    def run() -> dict[str, Any]:
        add_scalar = writer.add_scalar
        threads_before = threads_cpu()
        cpu_before = process_cpu()
        began = time.perf_counter()
        if other is not None:
            for step in range(params.events):
                other(step)
        elif params.mode == "back_to_back":
            for step in range(params.events):
                add_scalar("loss", step * 0.001, step)
        else:
            tags = [f"metric/{i}" for i in range(params.per_step)]
            for step in range(params.events // params.per_step):
                _step(params.step_work)
                for tag in tags:
                    add_scalar(tag, step * 0.001, step)
        loop_s = time.perf_counter() - began
        if other is not None:
            # Their work may lag behind the calls (summaryd builds them on its sender thread): wait for it, so
            # that the threads' shares cover it before `close()` ends the threads.
            if spec.kind == SUMMARYD:
                writer.writer.flush(timeout=60)
            else:  # torch's and tensorboardX's flush() hand everything to the OS and take no timeout
                writer.writer.flush()
        threads_after = threads_cpu()
        writer.close()
        cpu_s = process_cpu() - cpu_before
        threads = {name: seconds - threads_before.get(name, 0.0) for name, seconds in threads_after.items()}
        threads = {name: seconds for name, seconds in threads.items() if seconds > 0}
        return asdict(CpuResult(params.events, loop_s, cpu_s, threads))

    return run
