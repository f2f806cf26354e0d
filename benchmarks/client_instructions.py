"""The client's cost per scalar in instructions, all threads, beside the queue's floor: figures load does not move.

    python -m benchmarks.client_instructions [--scalars 50000,150000] [--functions 12] [--repeats 3]

CPU seconds per scalar (`hot_paths client`, section 8) swing by a third between runs on a shared machine; the
instructions a process executes move by a few percent (how valgrind interleaves the threads). Under valgrind's
callgrind (which must be installed), each driver runs `add_scalar("loss", value, step)` back to back, then
`close()`, against a fresh daemon outside valgrind, and the floor (a tuple into a deque, section 8's contender)
the same number of times. Each runs at two counts; the difference of the totals over the difference of the
counts is the cost of one scalar, without the start-up and the close. Printed: instructions per scalar by thread
(the caller's, the sender's, gRPC's), the ratio to the floor, each measurement's and their median, and the C
functions the sender thread spends them in (`PYTHONHASHSEED` fixed, one BLAS thread).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._run import running_daemon

_DRIVER = """
import sys, time
from collections import deque

def summaryd(address, count):
    from summaryd.client import SummaryWriter
    writer = SummaryWriter("instructions", address)
    writer.add_scalar("warm-up", 0.0, 0)
    writer.flush(timeout=30)
    add_scalar = writer.add_scalar
    for step in range(count):
        add_scalar("loss", step * 0.001, step)
    writer.close(timeout=600)

def floor(count):
    import summaryd.client  # the same modules loaded
    queue = deque()
    append, now = queue.append, time.time
    def add_scalar(tag, value, step):
        append((2, tag, value, step, now(), 24 + len(tag)))
    for step in range(count):
        add_scalar("loss", step * 0.001, step)
    queue.clear()

if sys.argv[1] == "floor":
    floor(int(sys.argv[2]))
else:
    summaryd(sys.argv[1], int(sys.argv[2]))
"""

_TOTAL = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)
_FUNCTION = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S+)", re.MULTILINE)


def _profile(workdir: Path, who: str, count: int) -> list[Path]:
    """Run the driver under callgrind, one output file per thread; the files, the main thread's first."""
    prefix = workdir / f"{'floor' if who == 'floor' else 'summaryd'}.{count}"
    # numpy (which both drivers import) starts OpenBLAS's worker thread, which spins for a while after it starts:
    # tens of millions of instructions, more or fewer by how the threads interleave, nothing to do with logging.
    # It moved the floor's figure by a fifth between runs (2,586-3,218 a scalar, its main thread at 2,775 in
    # each); with one BLAS thread it does not start.
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--separate-threads=yes",
            f"--callgrind-out-file={prefix}.%p",
            sys.executable,
            str(workdir / "driver.py"),
            who,
            str(count),
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return sorted(workdir.glob(f"{prefix.name}.*"))


def _thread(path: Path) -> int:
    """The thread's number in callgrind's file name (`.<pid>-<thread>`; the main thread's file may have none)."""
    match = re.search(r"-(\d+)$", path.name)
    return int(match.group(1)) if match else 1


def _totals(files: list[Path]) -> collections.Counter[int]:
    totals: collections.Counter[int] = collections.Counter()
    for path in files:
        match = _TOTAL.search(path.read_text(errors="replace"))
        if match:
            totals[_thread(path)] += int(match.group(1))
    return totals


def _functions(path: Path) -> collections.Counter[str]:
    """Instructions by C function (self cost), from `callgrind_annotate`."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", str(path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    by_function: collections.Counter[str] = collections.Counter()
    for count, where in _FUNCTION.findall(text):
        if where == "PROGRAM":
            continue
        name = re.sub(r"'\d+$", "", where.rsplit("/", 1)[-1])
        by_function[name] += int(count.replace(",", ""))
    return by_function


def _run_once(workdir: Path, counts: tuple[int, int]) -> tuple[dict[int, float], float, dict[int, list[Path]]]:
    """One measurement: instructions a scalar by thread, the floor's, and the profiles of summaryd's runs."""
    low, high = counts
    span = high - low
    (workdir / "driver.py").write_text(_DRIVER)
    with running_daemon(workdir) as daemon:
        ours = {count: _profile(workdir, daemon.address, count) for count in counts}
    floor = {count: _profile(workdir, "floor", count) for count in counts}
    per_thread = {
        thread: (_totals(ours[high])[thread] - _totals(ours[low])[thread]) / span for thread in _totals(ours[high])
    }
    floor_per = (sum(_totals(floor[high]).values()) - sum(_totals(floor[low]).values())) / span
    return per_thread, floor_per, ours


def measure(counts: tuple[int, int], functions: int, repeats: int) -> str:
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        raise SystemExit("valgrind (callgrind) is not installed: apt install valgrind")
    low, high = counts
    span = high - low
    lines: list[str] = []
    ratios: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(repeats):
            workdir = Path(scratch) / str(repeat)
            workdir.mkdir()
            per_thread, floor_per, ours = _run_once(workdir, counts)
            ours_per = sum(per_thread.values())
            ratios.append((ours_per, floor_per))
            shown = ", ".join(f"thread {t} {cost:,.0f}" for t, cost in sorted(per_thread.items()) if abs(cost) >= 5)
            lines.append(
                f"{low:,} and {high:,} scalars: summaryd {ours_per:,.0f} instructions a scalar, all threads "
                f"({shown}); the floor (a tuple into a deque) {floor_per:,.0f}; {ours_per / floor_per:.2f}x"
            )
        # The run's interleaving of threads under valgrind moves a build's figures by a few percent: the median.
        ours_median = statistics.median(o for o, _ in ratios)
        floor_median = statistics.median(f for _, f in ratios)
        ratio = ours_median / floor_median
        lines.append(
            f"median of {repeats}: summaryd {ours_median:,.0f}, the floor {floor_median:,.0f}: {ratio:.2f}x (target "
            f"≤ 2x: {'met' if ratio <= 2 else 'not met'})"
        )
        # The sender thread, of the last run: the busiest after the caller's (thread 1).
        sender = max((t for t in per_thread if t != 1), key=lambda t: per_thread[t], default=None)
        if sender is not None and functions:
            pick = {count: next(p for p in ours[count] if _thread(p) == sender) for count in counts}
            before, after = _functions(pick[low]), _functions(pick[high])
            spent = {name: (after[name] - before[name]) / span for name in after}
            lines.append(f"thread {sender}'s instructions a scalar by C function (self cost), the last run:")
            lines += [
                f"  {cost:7,.0f}  {name}" for name, cost in sorted(spent.items(), key=lambda kv: -kv[1])[:functions]
            ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    parser.add_argument("--scalars", default="50000,150000", help="the two counts, comma-separated")
    parser.add_argument("--functions", type=int, default=12, help="C functions of the sender thread to list")
    parser.add_argument("--repeats", type=int, default=3, help="measurements, their median printed last")
    args = parser.parse_args(argv)
    low, high = sorted(int(part) for part in args.scalars.split(","))
    print(measure((low, high), args.functions, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
