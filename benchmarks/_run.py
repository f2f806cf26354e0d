"""What every section of the suite shares: the sizes of a run, its results and targets, and alternation."""

from __future__ import annotations

import contextlib
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _daemon import Daemon, start_daemon, tail
from benchmarks._contenders import SUMMARYD, SUMMARYD_HOOK, WriterSpec
from benchmarks._report import Spread

Results = dict[str, list[dict[str, Any]]]


@dataclass(frozen=True)
class Plan:
    """The sizes of one run."""

    caller_calls: int
    caller_repeats: int
    paced_calls: int
    paced_repeats: int
    pace_us: float
    events: int
    """Scalars of the end-to-end run, from one client or split evenly over `clients`."""
    clients: int
    throughput_repeats: int
    ceiling_batches: int
    ceiling_repeats: int
    payload_calls: int
    payload_repeats: int
    visibility_points: int
    visibility_wait_s: float
    visibility_repeats: int
    close_sizes: tuple[int, ...]
    close_repeats: int
    memory_runs: int
    memory_streaming: int
    memory_batches: int
    memory_client_events: int
    memory_repeats: int
    batch_events: int = 1000
    cpu_events: int = 200_000
    cpu_repeats: int = 3
    visibility_interval_ms: float = 20.0
    session_counts: tuple[int, ...] = (64, 256)
    """Concurrent sessions of the many-sessions section; the last runs for `sustain_s`, the others for
    `session_window_s`."""
    session_rate: int = 1000
    session_window_s: float = 15.0
    sustain_s: float = 60.0
    session_warmup_s: float = 5.0
    job_rows: tuple[tuple[int, str], ...] = (
        *((workers, kind) for workers in (64, 256, 1024) for kind in ("floor", "on", "off")),
        (256, "unpaced"),
        (4096, "relayed"),
    )
    """The job shape's rows (section 15), (workers, target) each: `benchmarks.job_shape.TARGET_LABELS`."""
    job_seconds: float = 20.0
    job_warmup: float = 15.0


PLANS = {
    "full": Plan(
        caller_calls=50_000,
        caller_repeats=3,
        paced_calls=10_000,
        paced_repeats=3,
        pace_us=50.0,
        events=200_000,
        clients=8,
        throughput_repeats=3,
        ceiling_batches=1_000,
        ceiling_repeats=4,
        payload_calls=1_000,
        payload_repeats=3,
        visibility_points=50,
        visibility_wait_s=3.0,
        visibility_repeats=3,
        close_sizes=(10, 10_000, 100_000),
        close_repeats=3,
        memory_runs=1_000,
        memory_streaming=256,
        memory_batches=4,
        memory_client_events=50_000,
        memory_repeats=2,
    ),
    "quick": Plan(
        cpu_events=60_000,
        cpu_repeats=2,
        caller_calls=20_000,
        caller_repeats=3,
        paced_calls=3_000,
        paced_repeats=2,
        pace_us=50.0,
        events=50_000,
        clients=8,
        throughput_repeats=2,
        ceiling_batches=200,
        ceiling_repeats=3,
        payload_calls=300,
        payload_repeats=1,
        visibility_points=30,
        visibility_wait_s=2.0,
        visibility_repeats=1,
        close_sizes=(10, 10_000, 100_000),
        close_repeats=1,
        memory_runs=1_000,
        memory_streaming=256,
        memory_batches=2,
        memory_client_events=30_000,
        memory_repeats=1,
        session_window_s=5.0,
        sustain_s=10.0,
        session_warmup_s=3.0,
        job_rows=((256, "floor"), (256, "on"), (256, "unpaced"), (1024, "on")),
        job_seconds=10.0,
        job_warmup=10.0,
    ),
    # Tiny sizes for a smoke test: every benchmark runs, no figure means anything.
    "smoke": Plan(
        cpu_events=400,
        cpu_repeats=1,
        caller_calls=300,
        caller_repeats=1,
        paced_calls=50,
        paced_repeats=1,
        pace_us=50.0,
        events=400,
        clients=2,
        throughput_repeats=1,
        ceiling_batches=3,
        ceiling_repeats=1,
        payload_calls=5,
        payload_repeats=1,
        visibility_points=3,
        visibility_wait_s=1.0,
        visibility_repeats=1,
        close_sizes=(10, 100),
        close_repeats=1,
        memory_runs=10,
        memory_streaming=4,
        memory_batches=1,
        memory_client_events=300,
        memory_repeats=1,
        batch_events=100,
        session_counts=(4, 8),
        session_window_s=1.0,
        sustain_s=2.0,
        session_warmup_s=1.0,
        job_rows=((8, "floor"), (8, "on")),
        job_seconds=2.0,
        job_warmup=1.0,
    ),
}


@dataclass(frozen=True)
class Target:
    """One target: a figure measured in this run (a ratio unless `unit` says otherwise) against the
    bound it should meet."""

    name: str
    value: float
    bound: float
    at_least: bool
    unit: str = "x"

    @property
    def met(self) -> bool:
        return self.value >= self.bound if self.at_least else self.value <= self.bound


@dataclass
class Run:
    plan: Plan
    workdir: Path
    results: dict[str, Any] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def alternate(
    section: str, labels: Sequence[str], repeats: int, run_one: Callable[[str, int], dict[str, Any]]
) -> Results:
    """Run every contender once per round, rotating the order each round."""
    results: Results = {label: [] for label in labels}
    for round_ in range(repeats):
        shift = round_ % len(labels)
        for label in [*labels[shift:], *labels[:shift]]:
            began = time.monotonic()
            results[label].append(run_one(label, round_))
            progress(f"[{section}] round {round_ + 1}/{repeats}: {label} ({time.monotonic() - began:.1f}s)")
    return results


def slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label).strip("-")


def remove_output(spec: WriterSpec, daemon: Daemon) -> None:
    path = daemon.logdir / spec.target if spec.kind in (SUMMARYD, SUMMARYD_HOOK) else Path(spec.target)
    shutil.rmtree(path, ignore_errors=True)


def median(results: list[dict[str, Any]], key: str) -> float:
    return Spread.of([r[key] for r in results]).median


@contextlib.contextmanager
def running_daemon(workdir: Path, *flags: str) -> Iterator[Daemon]:
    """A daemon for one benchmark section (logging warnings only; more `serve` flags in `flags`), stopped at the
    end; an exit other than 0 is reported on stderr with the end of its log."""
    daemon = start_daemon(workdir, "--log-level", "warning", *flags, logdir=workdir / "daemon-logdir")
    try:
        yield daemon
    finally:
        code = daemon.stop()
        if code != 0:
            print(f"warning: the daemon exited with {code}:\n{tail(daemon.log_path)}", file=sys.stderr)


@contextlib.contextmanager
def refused_address() -> Iterator[str]:
    """A loopback address that refuses connections: its port stays bound (nobody else gets it) but never listens."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"
