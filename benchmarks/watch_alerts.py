"""How soon the watch tells, and that it tells nothing of a healthy job (issue 28's targets): real writer processes
(`tests/_watch_worker.py`, summaryd's `SummaryWriter`) on a real daemon with `--metrics-listen` and
`--watch-webhook` to a loopback HTTP server that takes Alertmanager's webhook JSON, every rule at its defaults.

- `hang`: a job of `--ranks` ranks logging a step every `--step-s` (each value in turn); once each rank is past
  step 40, every rank is SIGSTOPped at once (the run goes silent as a whole, its streams open but idle); the
  figure is from the SIGSTOP until the webhook received the silence finding (target: 2x the step interval + 5 s).
  The ranks are SIGCONTed and closed after each trial.
- `nan`: a job of 2 ranks at 20 steps a second; rank 1 logs NaN from a moment on; the figures are from that
  NaN's `add_scalar` (its wall time, written by the worker) until the finding is in `/metrics`
  (`summaryd_watch_firing`, scraped every 10 ms) and until the webhook received it (target: 1 s each).
- `steady`: a job of `--ranks` ranks for `--steady-s` seconds (600 for the target) with a training run's loss:
  decaying, 5% noise, a lone spike of up to 3x now and then, step times jittered by 20%, a 2 s evaluation pause
  every 1,000 steps; the figure is the findings fired over it, by the webhook, `/metrics` and the daemon's log
  (target: 0).

    python -m benchmarks.watch_alerts [--only hang,nan,steady] [--ranks 4] [--step-s 0.1,1] [--trials 3]
        [--steady-s 600]

Rows go to stdout as Markdown (for RESULTS.md), progress to stderr; the exit code is 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _webhook_receiver import Receiver

from _daemon import Daemon, start_daemon
from benchmarks._machine import load_average
from benchmarks._report import table

WORKER = Path(__file__).resolve().parent.parent / "tests" / "_watch_worker.py"
_WAIT_S = 60.0


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _watching(workdir: Path) -> Iterator[tuple[Daemon, Receiver, int]]:
    """A daemon with every rule at its defaults, its webhook receiver and its metrics port."""
    workdir.mkdir(parents=True, exist_ok=True)
    receiver = Receiver()
    daemon = start_daemon(workdir, "--metrics-listen", "127.0.0.1:0", "--watch-webhook", receiver.url)
    try:
        deadline = time.monotonic() + 10
        while not (match := re.search(r"metrics on http://[^:]+:(\d+)/metrics", daemon.log())):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no metrics address in the daemon's log:\n{daemon.log()}")
            time.sleep(0.05)
        yield daemon, receiver, int(match.group(1))
    finally:
        daemon.stop()
        receiver.close()


class _Job:
    """`ranks` writer processes of one run, each `_watch_worker.py` with `spec` (plus its rank)."""

    def __init__(self, workdir: Path, daemon: Daemon, run: str, ranks: int, **spec: Any) -> None:
        self.until = workdir / f"{run}.until"
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(WORKER),
                    json.dumps(
                        {
                            "address": daemon.address,
                            "run": run,
                            "rank": rank,
                            "world": ranks,
                            "seed": int(time.time()),
                            "until": str(self.until),
                            **spec,
                            **spec.get(f"rank{rank}", {}),
                        }
                    ),
                ]
            )
            for rank in range(ranks)
        ]

    def marked(self, step: int) -> bool:
        return all(Path(f"{self.until}.rank-{rank}.at-{step}").exists() for rank in range(len(self.procs)))

    def stop(self) -> None:
        """Let every rank go on (by pid) and close; killed when one does not."""
        self.until.touch()
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)


def _wait(condition: Any, what: str, timeout: float = _WAIT_S, every: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:.0f}s")
        time.sleep(every)


def _alerts(receiver: Receiver, rule: str | None = None) -> list[tuple[float, dict[str, Any]]]:
    """(arrival, alert) of every alert the receiver got, of `rule` when given."""
    return [
        (arrival, alert)
        for arrival, body in zip(list(receiver.arrivals), list(receiver.bodies), strict=False)
        for alert in json.loads(body)["alerts"]
        if rule is None or alert["labels"]["rule"] == rule
    ]


def _firing(port: int, rule: str) -> float:
    """`summaryd_watch_firing` of `rule` summed over runs, as `/metrics` says now."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    pattern = rf'^summaryd_watch_firing{{rule="{rule}",run="[^"]*"}} (\S+)$'
    return sum(float(m.group(1)) for m in re.finditer(pattern, text, re.MULTILINE))


def _fired_total(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(r"^summaryd_watch_fired_total{[^}]*} (\S+)$", text, re.M))


# ---- hang --------------------------------------------------------------------------------------------------


def hang(workdir: Path, ranks: int, step_s: float, trials: int) -> tuple[list[str], bool]:
    """Seconds from SIGSTOPping every rank until the webhook has the silence finding, over `trials` jobs."""
    found: list[float] = []
    for trial in range(trials):
        with _watching(workdir / f"hang-{step_s}-{trial}") as (daemon, receiver, _):
            job = _Job(workdir, daemon, f"hang-{step_s}-{trial}", ranks, step_secs=step_s, mark=[40])
            try:
                _wait(lambda job=job: job.marked(40), "every rank past step 40", 60 + 60 * step_s)
                stopped = time.time()
                for proc in job.procs:
                    os.kill(proc.pid, signal.SIGSTOP)
                _wait(lambda r=receiver: _alerts(r, "silence"), "the silence finding", every=0.02)
                [(arrival, alert)] = _alerts(receiver, "silence")
                found.append(arrival - stopped)
                _progress(f"hang {step_s}s/step trial {trial}: webhook after {found[-1]:.2f}s: {alert['labels']}")
            finally:
                job.stop()
            if len(_alerts(receiver)) != 2:  # the silence finding, and its resolution once the ranks went on
                raise RuntimeError(f"hang trial {trial}: the webhook got {_alerts(receiver)}")
    bound = 2 * step_s + 5
    median = sorted(found)[len(found) // 2]
    met = max(found) <= bound
    row = [
        f"every rank of {ranks} SIGSTOPped at once, {step_s:g} s a step → webhook received",
        f"{median:.2f} s ({min(found):.2f}-{max(found):.2f}, {trials} trials)",
        f"≤ {bound:g} s (2x the step + 5 s)",
        "met" if met else "missed",
    ]
    return row, met


# ---- nan ---------------------------------------------------------------------------------------------------


def nan(workdir: Path, trials: int) -> tuple[list[list[str]], bool]:
    """Seconds from a NaN's `add_scalar` until the finding is in `/metrics`, and in the webhook."""
    in_metrics: list[float] = []
    in_webhook: list[float] = []
    for trial in range(trials):
        with _watching(workdir / f"nan-{trial}") as (daemon, receiver, port):
            sick = workdir / f"nan-{trial}.sick"
            job = _Job(workdir, daemon, f"nan-{trial}", 2, step_secs=0.05, mark=[40], rank1={"nan_on": str(sick)})
            try:
                _wait(lambda job=job: job.marked(40), "every rank past step 40")
                sick.touch()
                _wait(lambda p=port: _firing(p, "nonfinite") > 0, "the finding in /metrics", every=0.01)
                seen = time.time()
                _wait(lambda r=receiver: _alerts(r, "nonfinite"), "the finding in the webhook", every=0.01)
                logged = float(Path(f"{sick}.logged").read_text())
                in_metrics.append(seen - logged)
                in_webhook.append(_alerts(receiver, "nonfinite")[0][0] - logged)
                _progress(f"nan trial {trial}: metrics after {in_metrics[-1]:.3f}s, webhook {in_webhook[-1]:.3f}s")
            finally:
                job.stop()
    rows, met = [], True
    for where, times in (("/metrics (scraped every 10 ms)", in_metrics), ("the webhook", in_webhook)):
        ok = max(times) <= 1.0
        met &= ok
        rows.append(
            [
                f"a NaN logged → finding in {where}",
                f"{sorted(times)[len(times) // 2]:.3f} s ({min(times):.3f}-{max(times):.3f}, {trials} trials)",
                "≤ 1 s",
                "met" if ok else "missed",
            ]
        )
    return rows, met


# ---- steady ------------------------------------------------------------------------------------------------


def steady(workdir: Path, ranks: int, seconds: float) -> tuple[list[str], bool]:
    """Findings over a healthy job of `ranks` ranks that logs for `seconds`."""
    with _watching(workdir / "steady") as (daemon, receiver, port):
        job = _Job(workdir, daemon, "steady", ranks, step_secs=0.1, realistic=True, eval_every=1000, eval_secs=2.0)
        started = time.monotonic()
        try:
            while time.monotonic() - started < seconds:
                time.sleep(min(10.0, seconds - (time.monotonic() - started)))
                if any(p.poll() is not None for p in job.procs):
                    raise RuntimeError("a rank of the steady job exited before its end")
                _progress(f"steady: {time.monotonic() - started:.0f}s, {_fired_total(port):g} findings fired")
        finally:
            job.stop()
        codes = [p.returncode for p in job.procs]
        time.sleep(1.0)  # what a tick after the close could find
        fired = _fired_total(port)
        steps = sum(1 for _ in re.finditer(r" firing run ", daemon.log()))
    alerts = _alerts(receiver)
    count = max(len(alerts), int(fired), steps)
    for _, alert in alerts:
        _progress(f"steady: a finding: {alert['labels']} {alert['annotations']['summary']}")
    met = count == 0 and codes == [0] * ranks
    row = [
        f"findings over a steady job: {ranks} ranks, {seconds:g} s at ~10 steps/s, noisy loss with lone spikes",
        f"{count} (webhook {len(alerts)}, /metrics {fired:g}, log {steps}; ranks exited {codes})",
        "0",
        "met" if met else "missed",
    ]
    return row, met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default="hang,nan,steady", help="which measures, of hang, nan, steady")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--step-s", default="0.1,1", help="the hang jobs' step intervals, comma-separated")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steady-s", type=float, default=600.0, help="how long the steady job logs")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    rows, met = [], True
    before = load_average()
    with tempfile.TemporaryDirectory(prefix="watch-alerts-") as tmp:
        workdir = Path(tmp)
        if "nan" in only:
            found, ok = nan(workdir, args.trials)
            rows += found
            met &= ok
        if "hang" in only:
            for step_s in (float(s) for s in args.step_s.split(",")):
                row, ok = hang(workdir, args.ranks, step_s, args.trials)
                rows.append(row)
                met &= ok
        if "steady" in only:
            row, ok = steady(workdir, args.ranks, args.steady_s)
            rows.append(row)
            met &= ok
    print(table(["measure", "figure, median (min-max)", "target", ""], rows))
    print(f"\nload average before {before}, after {load_average()}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
