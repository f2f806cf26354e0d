"""The two hot paths alone, to profile (`py-spy`, see benchmarks/README.md) or to time a change against:

    python -m benchmarks.hot_paths client [SCALARS]          # add_scalar back to back against a fresh daemon
    python -m benchmarks.hot_paths feed [BATCH] [BATCHES]    # scalar columns over gRPC into a fresh daemon
    python -m benchmarks.hot_paths events [BATCH] [BATCHES]  # serialized scalar events, the same way

`client` prints the client process's CPU per scalar, all threads and by thread name (as section 8 measures it),
beside the queue's floor in the same process (a tuple into a deque, section 8's contender) and their ratio;
`feed` and `events` print the daemon's CPU per scalar and per batch (`/proc/<pid>/stat` around the ceiling's feeder, its
setup included) and its pid before it starts, for `py-spy record -p`.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks._contenders import DEQUE, WriterSpec, open_writer
from benchmarks._run import running_daemon
from benchmarks._trials import run_trial
from benchmarks.ceiling import CeilingParams
from benchmarks.cpu_cost import process_cpu, threads_cpu
from benchmarks.sessions import process_cpu as cpu_of


def client(scalars: int) -> str:
    import torch  # noqa: F401  (the heap of a training process, as every benchmark has)

    from summaryd.client import SummaryWriter

    with tempfile.TemporaryDirectory() as workdir, running_daemon(Path(workdir)) as daemon:
        writer = SummaryWriter("hot-path", daemon.address)
        writer.add_scalar("warm-up", 0.0, 0)
        writer.flush(timeout=10)
        add_scalar = writer.add_scalar
        threads_before, cpu_before = threads_cpu(), process_cpu()
        began = time.perf_counter()
        for step in range(scalars):
            add_scalar("loss", step * 0.001, step)
        loop = time.perf_counter() - began
        threads = threads_cpu()
        writer.close()
        cpu = process_cpu() - cpu_before
    shares = {name: seconds - threads_before.get(name, 0.0) for name, seconds in threads.items()}
    floor = open_writer(WriterSpec(DEQUE, "")).add_scalar
    floor_before = process_cpu()
    for step in range(scalars):
        floor("loss", step * 0.001, step)
    floor_cpu = process_cpu() - floor_before
    by_thread = ", ".join(f"{name} {seconds / scalars * 1e6:.2f}" for name, seconds in shares.items() if seconds > 0)
    return (
        f"{scalars:,} scalars: loop {loop / scalars * 1e6:.2f} µs per call; CPU {cpu / scalars * 1e6:.2f} µs per "
        f"scalar, all threads; by thread (over the loop): {by_thread}; the floor (a tuple into a deque) "
        f"{floor_cpu / scalars * 1e6:.2f} µs, {cpu / (floor_cpu or float('nan')):.2f}x"
    )


def feed(batch: int, batches: int, columns: bool = True) -> str:
    with tempfile.TemporaryDirectory() as workdir, running_daemon(Path(workdir)) as daemon:
        print(f"daemon pid {daemon.pid}", file=sys.stderr, flush=True)
        params = CeilingParams(daemon.address, batches, batch, run="hot-path", columns=columns)
        before = cpu_of(daemon.pid)
        result = run_trial("daemon_feed", asdict(params), Path(workdir), 600)
        cpu = cpu_of(daemon.pid) - before
    events = result["events"]
    return (
        f"{batches:,} batches of {batch:,} scalar {'columns' if columns else 'events'}: "
        f"{events / result['seconds']:,.0f} scalars/s; daemon CPU "
        f"{cpu / events * 1e6:.2f} µs per scalar, {cpu / batches * 1e6:,.0f} µs per batch"
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["client"]:
        print(client(int(argv[1]) if len(argv) > 1 else 200_000))
    elif argv[:1] in (["feed"], ["events"]):
        batch = int(argv[1]) if len(argv) > 1 else (1000 if argv[0] == "feed" else 500)
        print(feed(batch, int(argv[2]) if len(argv) > 2 else 300, columns=argv[0] == "feed"))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
