"""Benchmark 5, `close()` latency: log `pending` scalars back to back, then time `close()` alone.

The writer has been in use before (one event logged and, for summaryd, acknowledged): what is timed is
delivering what is pending and closing, not connecting.

For summaryd `close()` returns once the daemon has acknowledged and fsynced every event; the trial also
reports how many of them were not yet acknowledged when `close()` was called (`flush(timeout=0)` reports
without waiting). torch's `close()` writes out its queue and flushes its file (no fsync).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks._contenders import SUMMARYD, WriterSpec, import_training_runtime, open_writer


@dataclass(frozen=True)
class CloseParams:
    writer: WriterSpec
    pending: int


@dataclass(frozen=True)
class CloseResult:
    pending: int
    unacked_at_close: int
    """summaryd: events logged but not yet acknowledged when `close()` was called (-1 for the peers)."""
    close_s: float
    delivered: int


def prepare(raw: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
    params = CloseParams(**{**raw, "writer": WriterSpec.from_json(raw["writer"])})
    import_training_runtime()
    ours = params.writer.kind == SUMMARYD
    opened = open_writer(params.writer)
    add_scalar = opened.add_scalar
    # A writer that has been in use: for summaryd connected, its session open and its event file created.
    add_scalar("warm-up", 0.0, 0)
    if ours:
        opened.writer.flush(timeout=10)

    def run() -> dict[str, Any]:
        for step in range(params.pending):
            add_scalar("loss", step * 0.001, step)
        unacked = opened.writer.flush(timeout=0).undelivered if ours else -1
        started = time.perf_counter()
        closed = opened.close()
        close_s = time.perf_counter() - started
        delivered = closed.delivered - 1 if ours else closed.delivered  # less the warm-up event
        if ours and (delivered != params.pending or not closed.synced):
            raise RuntimeError(f"summaryd delivered {delivered} of {params.pending} (synced {closed.synced})")
        return asdict(CloseResult(params.pending, unacked, close_s, delivered))

    return run
