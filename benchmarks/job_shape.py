"""The job-shape benchmark: one run of N workers against one daemon, beside the bare servicer's floor.

`python -m benchmarks.job_shape [--workers 64,256,1024] [--seconds 20] [--targets floor,on,off] [--short]`
`python -m benchmarks.job_shape --workers 4096 --targets relayed --relays 4`

Each worker logs `--tags` scalars a step at `--steps-per-second`, one batch of scalar columns per step unless
the daemon's pacing makes it linger (`_job_load`, many workers per generator process, at nice 10: a job's
ranks run on their own nodes, and here they must not take the CPU of the target they measure). Each row is one target
fed alone: the bare `grpc.aio` servicer that only acks (`_bare_servicer`, the floor of one Python process), and
the daemon with its defaults, aggregation on (`--aggregate`) and off (`--no-aggregate`). Figures over the
measured window (after a warm-up): the share of the window's offered scalars acknowledged by 3 s after its end
(the longest linger the pacing asks and a second; the load goes on meanwhile), the backlog's growth over the
window (queued and unacknowledged scalars, a least-squares trend, in seconds of the offered load), the target's
cores and its CPU per message and per scalar, each step's visibility (queued to acknowledged) p50/p99, the
target's RSS at the end, and the generators' CPU.

The `relayed` target is a job's topology for thousands of ranks: `--relays` relay processes (`summaryd serve
--upstream`, a node's relay each) in front of one owner daemon (aggregation on), each generator's workers on one
relay; the target's figures are the owner's, the relays' cores beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _daemon import stop_process
from benchmarks._bare_servicer import running as bare_servicer
from benchmarks._job_load import LoadParams
from benchmarks._machine import load_average
from benchmarks._report import table
from benchmarks._run import Run, Target, progress, running_daemon
from benchmarks.aggregation import daemon_cpu

FLOOR, ON, OFF, UNPACED, RELAYED = "floor", "on", "off", "unpaced", "relayed"
_RELAYED_WARMUP_PER_RANK = 0.01  # seconds of the relayed target's warm-up per rank, at least (--warmup otherwise)
TARGET_LABELS = {
    FLOOR: "bare servicer (floor)",
    ON: "daemon, aggregation on",
    OFF: "daemon, aggregation off",
    UNPACED: "daemon, aggregation on, no pacing",
    RELAYED: "one owner through relays, aggregation on",
}
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Shape:
    workers: int
    tags: int = 20
    steps_per_second: float = 5.0
    warmup: float = 5.0
    seconds: float = 20.0
    generators: int = 2
    relays: int = 4

    @property
    def offered_per_second(self) -> float:
        return self.workers * self.tags * self.steps_per_second


@dataclass(frozen=True)
class Row:
    target: str
    shape: Shape
    offered: int
    acked: int
    messages: int
    backlog_growth_s: float
    cores: float
    cpu_per_message_us: float
    cpu_per_scalar_us: float
    visibility_p50_s: float
    visibility_p99_s: float
    rss_mib: float
    generator_cores: float
    linger_s: float
    in_flight: int
    cpu_wait: float
    """Seconds a second the target's threads waited, runnable, for a CPU (others on the machine took it)."""
    relay_cores: float = 0.0
    """The relays' cores together (the `relayed` target)."""

    @property
    def acknowledged(self) -> float:
        return self.acked / self.offered if self.offered else 0.0


def run_queue_wait(pid: int) -> float:
    """Seconds the threads of process `pid` have spent runnable but waiting for a CPU (`/proc/.../schedstat`):
    on a shared machine, what the others took from it."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (FileNotFoundError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return total / 1e9


def rss_mib(pid: int) -> float:
    """Resident memory of process `pid` in MiB."""
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * _PAGE / 2**20


@dataclass(frozen=True)
class _Target:
    """What the generators dial (generator `i` the address `i % len`), the measured process, and its relays."""

    addresses: list[str]
    pid: int
    relays: list[int]


@contextlib.contextmanager
def _target(kind: str, workdir: Path, shape: Shape) -> Iterator[_Target]:
    if kind == FLOOR:
        with bare_servicer(workdir) as (address, pid):
            yield _Target([address], pid, [])
        return
    flags = ["--no-aggregate"] if kind == OFF else ["--aggregate"]
    if kind == UNPACED:
        flags += ["--pace-messages", "0"]  # a batch per step, as before pacing: the cost of each message
    if kind == RELAYED:
        # The owner counts a relay's sessions by the relay's address, and here every relay is 127.0.0.1: its
        # 4,096 sessions are over the 1,024 a peer may hold (on a cluster, a node's relay carries its 8 ranks).
        flags += ["--max-sessions-per-peer", str(shape.workers + 64)]
    # Its defaults but the run count: 1,024 workers' runs and the 5 aggregate runs are over --max-open-runs.
    with running_daemon(workdir, *flags, "--max-open-runs", str(max(4096, shape.workers + 64))) as daemon:
        if kind != RELAYED:
            yield _Target([daemon.address], daemon.pid, [])
            return
        with contextlib.ExitStack() as relays:
            started = [
                relays.enter_context(running_daemon(workdir, "--upstream", daemon.address)) for _ in range(shape.relays)
            ]
            yield _Target([r.address for r in started], daemon.pid, [r.pid for r in started])


def measure(kind: str, shape: Shape, workdir: Path, profile: Path | None = None) -> Row:
    """Feed one target with `shape` and measure it; with `profile`, py-spy samples it over the window into
    `profile/<target>-<workers>.txt` (collapsed stacks)."""
    with _target(kind, workdir, shape) as target:
        pid = target.pid
        run = f"job-{uuid.uuid4().hex[:8]}"
        per = -(-shape.workers // shape.generators)
        procs: list[subprocess.Popen[str]] = []
        for first in range(0, shape.workers, per):
            params = LoadParams(
                target.addresses[len(procs) % len(target.addresses)],
                run,
                shape.workers,
                first,
                min(per, shape.workers - first),
                shape.tags,
                shape.steps_per_second,
                shape.warmup,
                shape.seconds,
                aggregate=kind != OFF,
            )
            command = [sys.executable, "-m", "benchmarks._job_load", json.dumps(asdict(params))]
            procs.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        try:
            for proc in procs:
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"a load generator did not open its sessions (exit {proc.wait()})")
            start = time.time() + 0.5
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(f"{start}\n")
                proc.stdin.flush()
            time.sleep(max(0.0, start + shape.warmup - time.time()))
            spy = _profiler(pid, shape, profile / f"{kind}-{shape.workers}.txt") if profile else None
            cpu_before, wait_before = daemon_cpu(pid), run_queue_wait(pid)
            relays_before = sum(daemon_cpu(p) for p in target.relays)
            time.sleep(max(0.0, start + shape.warmup + shape.seconds - time.time()))
            cpu, waited = daemon_cpu(pid) - cpu_before, run_queue_wait(pid) - wait_before
            relay_cpu = sum(daemon_cpu(p) for p in target.relays) - relays_before
            rss = rss_mib(pid)
            if spy is not None:
                spy.wait(60)
            results = []
            for proc in procs:
                out, _ = proc.communicate(timeout=120)
                results.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for proc in procs:
                stop_process(proc)  # type: ignore[arg-type]  # a text-mode pipe; only its pid is used
    return _row(kind, shape, results, cpu, rss, waited, relay_cpu)


def _profiler(pid: int, shape: Shape, out: Path) -> subprocess.Popen[bytes]:
    out.parent.mkdir(parents=True, exist_ok=True)
    command = ["py-spy", "record", "--pid", str(pid), "--duration", str(int(shape.seconds)), "--rate", "200"]
    command += ["--format", "raw", "--output", str(out), "--nonblocking"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _row(
    kind: str, shape: Shape, results: Sequence[dict[str, Any]], cpu: float, rss: float, waited: float, relay_cpu: float
) -> Row:
    offered = sum(r["offered"] for r in results)
    acked = sum(r["acked"] for r in results)
    messages = sum(r["messages"] for r in results)
    growth = sum(r["backlog_growth"] for r in results) / shape.offered_per_second
    visibility = sorted(v for r in results for v in r["visibility"])

    def pct(q: float) -> float:
        return visibility[min(len(visibility) - 1, int(q * len(visibility)))] if visibility else float("nan")

    return Row(
        TARGET_LABELS[kind],
        shape,
        offered,
        acked,
        messages,
        growth,
        cpu / shape.seconds,
        cpu * 1e6 / messages if messages else float("nan"),
        cpu * 1e6 / acked if acked else float("nan"),
        pct(0.5),
        pct(0.99),
        rss,
        sum(r["generator_cpu_s"] for r in results) / shape.seconds,
        max(r["linger_s"] for r in results),
        min(r["in_flight"] for r in results),
        waited / shape.seconds,
        relay_cpu / shape.seconds,
    )


def report(rows: Sequence[Row]) -> str:
    headers = [
        "workers",
        "target",
        "offered/s",
        "messages/s",
        "acknowledged",
        "backlog growth",
        "cores",
        "waited for a CPU",
        "CPU/message",
        "CPU/scalar",
        "visibility p50 / p99",
        "RSS",
        "linger, in flight",
        "generators",
        "relays",
    ]
    body = [
        [
            str(r.shape.workers),
            r.target,
            f"{r.shape.offered_per_second:,.0f}",
            f"{r.messages / r.shape.seconds:,.0f}",
            f"{r.acknowledged:.3f}x",
            f"{r.backlog_growth_s:+.1f} s in {r.shape.seconds:g} s",
            f"{r.cores:.2f}",
            f"{r.cpu_wait:.2f} s/s",
            f"{r.cpu_per_message_us:,.0f} µs",
            f"{r.cpu_per_scalar_us:.1f} µs",
            f"{r.visibility_p50_s * 1e3:,.0f} / {r.visibility_p99_s * 1e3:,.0f} ms",
            f"{r.rss_mib:.0f} MiB",
            f"{r.linger_s * 1e3:.0f} ms, {r.in_flight}",
            f"{r.generator_cores:.2f} cores",
            f"{r.shape.relays}: {r.relay_cores:.2f} cores" if r.target == TARGET_LABELS[RELAYED] else "—",
        ]
        for r in rows
    ]
    return table(headers, body)


def job_targets(rows: Sequence[Row]) -> list[Target]:
    """The issue's targets, from the rows that measure them (those the rows leave out are not listed)."""
    targets = []
    floors = {r.shape.workers: r for r in rows if r.target == TARGET_LABELS[FLOOR]}  # the same messages' floor
    for r in rows:
        if r.shape.workers == 1024 and r.target == TARGET_LABELS[ON]:
            targets += [
                Target("job shape, 1,024 workers: acknowledged vs offered", r.acknowledged, 0.99, True),
                Target("job shape, 1,024 workers: backlog growth", r.backlog_growth_s, 1.0, False, unit=" s"),
                Target("job shape, 1,024 workers: daemon cores", r.cores, 1.0, False, unit=" cores"),
                Target("job shape, 1,024 workers: visibility p50", r.visibility_p50_s, 2.0, False, unit=" s"),
            ]
        floor = floors.get(256)
        if r.shape.workers == 256 and r.target == TARGET_LABELS[UNPACED] and floor is not None:
            name = "job shape, 256 workers unpaced: daemon CPU a message vs the bare servicer"
            targets.append(Target(name, r.cpu_per_message_us / floor.cpu_per_message_us, 2.0, False))
        if r.shape.workers == 4096 and r.target == TARGET_LABELS[RELAYED]:
            targets += [
                Target("job shape, 4,096 workers through relays: acknowledged", r.acknowledged, 0.99, True),
                Target("job shape, 4,096 workers through relays: owner cores", r.cores, 1.0, False, unit=" cores"),
            ]
    return targets


def _shape(
    workers: int,
    kind: str,
    *,
    seconds: float,
    warmup: float,
    tags: int = 20,
    steps_per_second: float = 5.0,
    generators: int | None = None,
    relays: int = 4,
    short: bool = False,
) -> Shape:
    """The shape of one row. The relayed target gets a generator per relay (fewer would leave relays idle) and
    a warm-up long enough for thousands of ranks' runs to open their first files (a file and a synced journal
    each; 4,096 of them take the owner some 30 s here): the window is the steady state after them."""
    settle = warmup if short or kind != RELAYED else max(warmup, workers * _RELAYED_WARMUP_PER_RANK)
    default_generators = max(relays, 1) if kind == RELAYED else 2
    return Shape(workers, tags, steps_per_second, settle, seconds, generators or default_generators, relays)


def section(run: Run) -> str:
    """`benchmarks/run.py`'s section 15: the plan's rows (`Plan.job_rows`), each target fed alone."""
    plan = run.plan
    rows = []
    for workers, kind in plan.job_rows:
        shape = _shape(workers, kind, seconds=plan.job_seconds, warmup=plan.job_warmup)
        progress(f"[job shape] {workers} workers, {TARGET_LABELS[kind]} (load {load_average()})")
        rows.append(measure(kind, shape, run.workdir))
    run.results["job_shape"] = [asdict(r) for r in rows]
    run.targets += job_targets(rows)
    about = (
        "One run of N workers, each logging 20 scalar tags a step at 5 steps/s as one batch of scalar columns, sent "
        "as the client's sender sends them and following the daemon's pacing (`python -m benchmarks.job_shape`, "
        f"README item 12): each row one target fed alone, after a {plan.job_warmup:g} s warm-up (the relayed "
        f"target's longer), over a {plan.job_seconds:g} s window: the bare `grpc.aio` servicer that only acks "
        "(the floor), the daemon with aggregation on and off, on without pacing, and one owner through 4 relays."
    )
    return "\n".join(["### 15. The job shape", "", about, "", report(rows)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="64,256,1024")
    parser.add_argument("--targets", default=f"{FLOOR},{ON},{OFF},{UNPACED}", help="of " + ", ".join(TARGET_LABELS))
    parser.add_argument("--tags", type=int, default=20)
    parser.add_argument("--steps-per-second", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    # A thousand ranks' first seconds, before the pacing reaches them through their acks, are a flood of small
    # batches the daemon drains for some seconds: the window is the steady state after it.
    parser.add_argument("--warmup", type=float, default=15.0)
    # The relayed target dials relay `i % relays` from generator `i`: fewer generators than relays would leave
    # relays idle and put thousands of ranks on one (one generator per relay unless asked otherwise).
    parser.add_argument("--generators", type=int, help="load generator processes (2; the relayed target: --relays)")
    parser.add_argument("--relays", type=int, default=4, help="relay processes of the relayed target")
    parser.add_argument("--short", action="store_true", help="8 workers, 2 s: a check that it runs, no figures")
    parser.add_argument("--profile", type=Path, help="sample each target with py-spy into this directory")
    args = parser.parse_args(argv)
    counts = [8] if args.short else [int(n) for n in args.workers.split(",")]
    seconds, warmup = (2.0, 1.0) if args.short else (args.seconds, args.warmup)
    rows = []
    with tempfile.TemporaryDirectory(prefix="summaryd-jobshape-") as tmp:
        for workers in counts:
            for kind in args.targets.split(","):
                shape = _shape(
                    workers,
                    kind,
                    seconds=seconds,
                    warmup=warmup,
                    tags=args.tags,
                    steps_per_second=args.steps_per_second,
                    generators=args.generators,
                    relays=args.relays,
                    short=args.short,
                )
                print(f"job shape: {workers} workers, {TARGET_LABELS[kind]} (load {load_average()})", file=sys.stderr)
                rows.append(measure(kind, shape, Path(tmp), args.profile))
                print(report(rows[-1:]).splitlines()[-1], file=sys.stderr)
    print(report(rows))
    for target in job_targets(rows):
        print(
            f"- {target.name}: {target.value:.3g}{target.unit} (target {'≥' if target.at_least else '≤'} "
            f"{target.bound:g}{target.unit}): {'met' if target.met else 'NOT met'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
