"""Sections 4-9 of the suite: histograms and images, visibility, `close()` latency, memory, what logging costs
the training process, many sessions at once."""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from benchmarks._contenders import DEQUE, FLOOR, LIVE, NO_WRITER, PEERS, QUEUE_FLOOR, SUMMARYD, TORCH, WriterSpec
from benchmarks._report import Spread, micros, rate, ratio, table
from benchmarks._run import (
    Results,
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
from benchmarks._trials import run_trial
from benchmarks.close_latency import CloseParams
from benchmarks.cpu_cost import CALLS, SUMMARY, CpuParams
from benchmarks.memory import ClientMemoryParams, DaemonMemoryParams
from benchmarks.payloads import HISTOGRAM, HISTOGRAM_BINS, HISTOGRAM_VALUES, IMAGE, IMAGE_SHAPE, PayloadParams
from benchmarks.sessions import SessionsParams
from benchmarks.visibility import VisibilityParams

_TIMEOUT = 600.0


def _peer_spec(run: Run, label: str, name: str) -> WriterSpec:
    return WriterSpec(PEERS[label], str(run.workdir / name))


# ---- 4. histograms and images ------------------------------------------------------------------------------


def payloads(run: Run) -> str:
    plan = run.plan
    labels = [LIVE, "torch"]  # the peer named for these; tensorboardX measured level with torch (0.98x, 1.04x)
    rows = []
    results_by_kind = {}
    with running_daemon(run.workdir) as daemon:
        for kind in (HISTOGRAM, IMAGE):

            def one(label: str, round_: int, kind: str = kind) -> dict[str, Any]:
                name = f"{kind}-{slug(label)}-{round_}"
                spec = WriterSpec(SUMMARYD, name, daemon.address) if label == LIVE else _peer_spec(run, label, name)
                try:
                    params = asdict(PayloadParams(spec, kind, plan.payload_calls))
                    result = run_trial("payload", params, run.workdir, _TIMEOUT)
                finally:
                    remove_output(spec, daemon)
                return {**result, "rate": result["calls"] / result["seconds"]}

            results = alternate(f"payloads: {kind}", labels, plan.payload_repeats, one)
            results_by_kind[kind] = results
            torch_p50, torch_p99 = median(results["torch"], "p50_ns"), median(results["torch"], "p99_ns")
            torch_rate = median(results["torch"], "rate")
            for label in labels:
                rs = results[label]
                rows.append(
                    [
                        kind,
                        label,
                        Spread.of([r["p50_ns"] for r in rs]).cell(micros),
                        Spread.of([r["p99_ns"] for r in rs]).cell(micros),
                        Spread.of([r["rate"] for r in rs]).cell(rate),
                        ratio(median(rs, "p50_ns"), torch_p50),
                        ratio(median(rs, "p99_ns"), torch_p99),
                        ratio(median(rs, "rate"), torch_rate),
                    ]
                )
            run.targets.append(
                Target(
                    f"{kind}: caller p50 vs torch, daemon live",
                    median(results[LIVE], "p50_ns") / torch_p50,
                    1.0,
                    at_least=False,
                )
            )
    run.results["payloads"] = results_by_kind
    about = (
        f"`add_histogram(tag, values, step, bins={HISTOGRAM_BINS})` of the same {HISTOGRAM_VALUES:,} normal values, "
        f"and `add_image(tag, img, step)` of one {'x'.join(map(str, IMAGE_SHAPE))} `uint8` image of noise (CHW): "
        f"{plan.payload_calls:,} calls back to back per trial, each timed alone; calls/s from the first call until "
        "`close()` returned (summaryd: acknowledged and fsynced by the daemon). "
        f"{plan.payload_repeats} trials per contender; median (min-max)."
    )
    headers = ["payload", "contender", "p50 µs", "p99 µs", "calls/s"]
    headers += ["p50 vs torch", "p99 vs torch", "calls/s vs torch"]
    right = [False, False, True, True, True, True, True, True]
    return "\n".join(["### 4. Histograms and images", "", about, "", table(headers, rows, right)])


# ---- 5. visibility --------------------------------------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile; infinity when there is no value."""
    if not values:
        return math.inf
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def visibility(run: Run) -> str:
    plan = run.plan
    labels = [LIVE, *PEERS]
    wait = plan.visibility_wait_s
    with running_daemon(run.workdir) as daemon:

        def one(label: str, round_: int) -> dict[str, Any]:
            name = f"visibility-{slug(label)}-{round_}"
            if label == LIVE:
                spec = WriterSpec(SUMMARYD, name, daemon.address)
                run_dir = str(daemon.logdir / name)
            else:
                spec = _peer_spec(run, label, name)
                run_dir = spec.target
            params = VisibilityParams(spec, run_dir, plan.visibility_points, plan.visibility_interval_ms, wait)
            try:
                return run_trial("visibility", asdict(params), run.workdir, _TIMEOUT)
            finally:
                remove_output(spec, daemon)

        results = alternate("visibility", labels, plan.visibility_repeats, one)
    run.results["visibility"] = results

    def latency(value: float) -> str:
        return f"not within {wait:g} s" if math.isinf(value) else f"{value * 1000:,.1f}"

    # Pooled over the trials; a point never seen counts as infinitely late.
    pooled = {
        label: [x for r in rs for x in r["latencies_s"]] + [math.inf] * sum(r["unseen"] for r in rs)
        for label, rs in results.items()
    }
    rows = [
        [
            label,
            f"{sum(len(r['latencies_s']) for r in results[label]):,} of {len(pooled[label]):,}",
            latency(_quantile(pooled[label], 0.5)),
            latency(_quantile(pooled[label], 0.99)),
        ]
        for label in labels
    ]
    run.targets.append(
        Target("visibility p50, daemon live, seconds", _quantile(pooled[LIVE], 0.5), 1.0, False, unit=" s")
    )
    about = (
        f"One `add_scalar` every {plan.visibility_interval_ms:g} ms ({plan.visibility_points} points per trial); "
        "a thread of the same process polls the run directory every millisecond with TensorBoard's own "
        "`EventFileLoader`. Latency: from `add_scalar` returning until the loader first yields the point; points "
        f"not yielded {wait:g} s after the last was logged count as not visible. Pooled over "
        f"{plan.visibility_repeats} trials per contender."
    )
    headers = ["contender", "points seen", "p50 ms", "p99 ms"]
    return "\n".join(["### 5. Visibility", "", about, "", table(headers, rows)])


# ---- 6. close() latency ---------------------------------------------------------------------------------------


def close_latency(run: Run) -> str:
    plan = run.plan
    labels = [LIVE, "torch"]
    rows = []
    by_size: dict[str, Any] = {}
    with running_daemon(run.workdir) as daemon:
        for size in plan.close_sizes:

            def one(label: str, round_: int, size: int = size) -> dict[str, Any]:
                name = f"close-{size}-{slug(label)}-{round_}"
                spec = WriterSpec(SUMMARYD, name, daemon.address) if label == LIVE else _peer_spec(run, label, name)
                try:
                    return run_trial("close_latency", asdict(CloseParams(spec, size)), run.workdir, _TIMEOUT)
                finally:
                    remove_output(spec, daemon)

            results = alternate(f"close: {size:,} pending", labels, plan.close_repeats, one)
            by_size[str(size)] = results
            torch_close = median(results[TORCH], "close_s")
            for label in labels:
                rs = results[label]
                unacked = (
                    Spread.of([r["unacked_at_close"] for r in rs]).cell(lambda v: f"{v:,.0f}") if label == LIVE else ""
                )
                rows.append(
                    [
                        f"{size:,}",
                        label,
                        unacked,
                        Spread.of([r["close_s"] * 1000 for r in rs]).cell(lambda v: f"{v:,.1f}"),
                        ratio(median(rs, "close_s"), torch_close),
                    ]
                )
            if size == 10_000:
                run.targets.append(
                    Target("close() with 10,000 pending, seconds", median(results[LIVE], "close_s"), 0.5, False, " s")
                )
    run.results["close"] = by_size
    about = (
        "`add_scalar` N times back to back, then `close()` timed alone. summaryd's `close()` returns once every "
        "event is acknowledged and fsynced by the daemon; *not yet acknowledged* is how many of the N were still "
        "queued or in flight when `close()` was called. torch's `close()` writes its queue and flushes its file "
        f"(no fsync). {plan.close_repeats} trials per contender; median (min-max)."
    )
    headers = ["pending (N)", "contender", "not yet acknowledged", "close ms", "vs torch"]
    right = [True, False, True, True, True]
    return "\n".join(["### 6. `close()` latency", "", about, "", table(headers, rows, right)])


# ---- 7. memory ------------------------------------------------------------------------------------------------


def _mb(value: float) -> str:
    return f"{value:,.0f}"


def memory(run: Run) -> str:
    plan = run.plan
    daemon_results = []
    for round_ in range(plan.memory_repeats):
        workdir = run.workdir / f"memory-{round_}"
        workdir.mkdir()
        try:
            with running_daemon(workdir) as daemon:
                params = DaemonMemoryParams(
                    daemon.address,
                    daemon.pid,
                    "memory",
                    plan.memory_runs,
                    plan.memory_streaming,
                    plan.memory_batches,
                    plan.batch_events,
                )
                daemon_results.append(run_trial("daemon_memory", asdict(params), run.workdir, _TIMEOUT))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    flood_events = plan.memory_streaming * plan.memory_batches * plan.batch_events
    daemon_rows = [
        ["idle, just started", Spread.of([r["idle_mb"] for r in daemon_results]).cell(_mb)],
        [
            f"{plan.memory_runs:,} runs open, {plan.memory_runs:,} sessions, at rest",
            Spread.of([r["runs_open_mb"] for r in daemon_results]).cell(_mb),
        ],
        [
            f"peak while {plan.memory_streaming} sessions stream {flood_events:,} events at once",
            Spread.of([r["flood_peak_mb"] for r in daemon_results]).cell(_mb),
        ],
        ["after the flood", Spread.of([r["after_mb"] for r in daemon_results]).cell(_mb)],
    ]
    worst = max(max(r["runs_open_mb"], r["flood_peak_mb"]) for r in daemon_results)
    run.targets.append(
        Target(
            f"daemon RSS with {plan.memory_runs:,} runs and {plan.memory_streaming} sessions streaming, MB (worst)",
            worst,
            300,
            False,
            " MB",
        )
    )

    labels = [LIVE, "summaryd, no daemon", TORCH]
    with running_daemon(run.workdir) as daemon, refused_address() as refused:

        def one(label: str, round_: int) -> dict[str, Any]:
            name = f"client-memory-{slug(label)}-{round_}"
            if label == LIVE:
                spec = WriterSpec(SUMMARYD, name, daemon.address)
            elif label == TORCH:
                spec = _peer_spec(run, label, name)
            else:
                spec = WriterSpec(SUMMARYD, name, refused, close_timeout=1.0)
            try:
                params = asdict(ClientMemoryParams(spec, plan.memory_client_events))
                return run_trial("client_memory", params, run.workdir, _TIMEOUT)
            finally:
                remove_output(spec, daemon)

        client_results = alternate("memory: client", labels, plan.memory_repeats, one)
    run.results["memory"] = {"daemon": daemon_results, "client": client_results}
    client_rows = [
        [
            label,
            Spread.of([r["before_mb"] for r in client_results[label]]).cell(_mb),
            Spread.of([r["added_peak_mb"] for r in client_results[label]]).cell(lambda v: f"{v:,.1f}"),
        ]
        for label in labels
    ]
    about = (
        f"Daemon: one process opens {plan.memory_runs:,} sessions, each on its own run with one event written "
        "(an open event file, journal and directory per run), then the first "
        f"{plan.memory_streaming} sessions each stream {plan.memory_batches} batches of {plan.batch_events:,} "
        "scalars at once without waiting for acks. Resident size of the daemon process (`VmRSS`; the peak is "
        f"`VmHWM`, reset before the flood); a fresh daemon per trial, {plan.memory_repeats} trials. "
        f"Client: {plan.memory_client_events:,} `add_scalar` back to back in a process that imported torch; the "
        "peak resident size while logging above the size before the first call."
    )
    return "\n".join(
        [
            "### 7. Memory",
            "",
            about,
            "",
            table(["daemon", "MB"], daemon_rows, [False, True]),
            "",
            table(["client", "MB before", "MB added at peak"], client_rows),
        ]
    )


# ---- 8. what logging costs the training process ---------------------------------------------------------------


def process_cpu(run: Run) -> str:
    plan = run.plan
    labels = [FLOOR, QUEUE_FLOOR, LIVE, *PEERS]
    modes = ("back_to_back", "gil_loop")
    with running_daemon(run.workdir) as daemon:

        def one(label: str, round_: int) -> dict[str, Any]:
            name = f"cpu-{slug(label)}-{round_}"
            if label == LIVE:
                spec = WriterSpec(SUMMARYD, name, daemon.address)
            elif label == FLOOR:
                spec = WriterSpec(NO_WRITER, name)
            elif label == QUEUE_FLOOR:
                spec = WriterSpec(DEQUE, name)
            else:
                spec = _peer_spec(run, label, name)
            out: dict[str, Any] = {}
            for mode in modes:
                params = asdict(CpuParams(asdict(spec), plan.cpu_events, mode))
                try:
                    out[mode] = run_trial("cpu_cost", params, run.workdir, _TIMEOUT)
                finally:
                    remove_output(spec, daemon)
            return out

        results = alternate("cpu", labels, plan.cpu_repeats, one)

        def other(mode: str) -> Callable[[str, int], dict[str, Any]]:
            calls = plan.cpu_events // 4 if mode == SUMMARY else plan.payload_calls

            def one_call(label: str, round_: int) -> dict[str, Any]:
                name = f"cpu-{mode}-{slug(label)}-{round_}"
                spec = WriterSpec(SUMMARYD, name, daemon.address) if label == LIVE else _peer_spec(run, label, name)
                try:
                    params = asdict(CpuParams(asdict(spec), calls, mode))
                    return {"back_to_back": run_trial("cpu_cost", params, run.workdir, _TIMEOUT)}
                finally:
                    remove_output(spec, daemon)

            return one_call

        others = {mode: alternate(f"cpu: {mode}", [LIVE, TORCH], plan.cpu_repeats, other(mode)) for mode in CALLS}
    run.results["cpu"] = {**results, "calls": others}

    def per_event(label: str, mode: str, key: str, of: Results = results) -> Spread:
        return Spread.of([r[mode][key] / r[mode]["events"] * 1e9 for r in of[label]])

    def threads(label: str, of: Results = results) -> str:
        trials = [r["back_to_back"] for r in of[label]]
        names = sorted({name for r in trials for name in r["threads"]})
        shares = [
            (name, Spread.of([r["threads"].get(name, 0.0) / r["events"] * 1e9 for r in trials]).median)
            for name in names
        ]
        return ", ".join(f"{name} {micros(ns)}" for name, ns in shares if ns >= 1)

    torch_cpu = per_event("torch", "back_to_back", "cpu_s").median
    cpu_rows = [
        [
            label,
            per_event(label, "back_to_back", "cpu_s").cell(micros),
            threads(label),
            ratio(per_event(label, "back_to_back", "cpu_s").median, torch_cpu),
        ]
        for label in labels
    ]
    floor_loop = per_event(FLOOR, "gil_loop", "loop_s").median
    gil_rows = [
        [
            label,
            per_event(label, "gil_loop", "loop_s").cell(micros),
            micros(per_event(label, "gil_loop", "loop_s").median - floor_loop),
        ]
        for label in labels
    ]
    call_rows = [
        [f"add_scalar (above, {plan.cpu_events:,} calls)", label, *cpu_rows[i][1:]]
        for i, label in enumerate(labels)
        if label in (LIVE, TORCH)
    ]
    for mode, of in others.items():
        torch_call = per_event(TORCH, "back_to_back", "cpu_s", of).median
        ours_call = per_event(LIVE, "back_to_back", "cpu_s", of).median
        for label in (LIVE, TORCH):
            call_rows.append(
                [
                    f"{_CALL_NAMES[mode]} ({of[label][0]['back_to_back']['events']:,} calls)",
                    label,
                    per_event(label, "back_to_back", "cpu_s", of).cell(micros),
                    threads(label, of),
                    ratio(per_event(label, "back_to_back", "cpu_s", of).median, torch_call),
                ]
            )
        run.targets.append(
            # A tiny run may take less than a clock tick of CPU.
            Target(
                f"{_CALL_NAMES[mode]}: client CPU per call vs torch", ours_call / (torch_call or math.nan), 1.0, False
            )
        )
    ours_cpu = per_event(LIVE, "back_to_back", "cpu_s").median
    run.targets.append(Target("client CPU per scalar, all threads (µs)", ours_cpu / 1000, 1.5, False, unit=" µs"))
    run.targets.append(Target("client CPU per scalar vs torch", ours_cpu / torch_cpu, 0.1, False))
    deque_cpu = per_event(QUEUE_FLOOR, "back_to_back", "cpu_s").median
    run.targets.append(
        Target("client CPU per scalar vs a tuple into a deque", ours_cpu / (deque_cpu or math.nan), 2.0, False)
    )
    slowdown = per_event(LIVE, "gil_loop", "loop_s").median - floor_loop
    run.targets.append(Target("GIL-bound loop slowdown per scalar (µs)", slowdown / 1000, 1.5, False, unit=" µs"))
    about = (
        f"(a) {plan.cpu_events:,} `add_scalar` back to back in a process that imported torch, then `close()`: the "
        "process's CPU (user + system, every thread, `/proc/self/stat`) per event over the loop and the close, and "
        "each thread's CPU over the loop (`/proc/self/task/*/stat`, by thread name). (b) A step loop whose step is "
        f"pure Python (holds the GIL) logging 20 scalars a step, {plan.cpu_events:,} in all: its wall time per "
        "scalar, and the slowdown against the same loop calling an empty function. The queue's floor: a "
        "function that appends the tuple a queued scalar is (its kind, tag, value, step, `time.time()`, size) "
        "to a deque. "
        f"{plan.cpu_repeats} trials per contender; median (min-max); figures in µs."
    )
    calls_about = (
        "(c) The other calls, each back to back in a process that imported torch, then `close()`, measured as (a): "
        "`add_histogram` and `add_image` as in section 4, and `add_summary` of a serialized one-scalar `Summary` "
        "(the path of the TF-style hooks; torch: its file writer's `add_summary` of the `Summary` proto). "
        "summaryd builds histograms and images on its sender thread; torch on the caller's."
    )
    return "\n".join(
        [
            "### 8. What logging costs the training process",
            "",
            about,
            "",
            table(["contender", "CPU µs per event, all threads", "per thread (µs per event)", "vs torch"], cpu_rows),
            "",
            table(["contender", "GIL-bound loop, µs per scalar", "slowdown µs per scalar"], gil_rows),
            "",
            calls_about,
            "",
            table(
                ["call", "contender", "CPU µs per call, all threads", "per thread (µs per call)", "vs torch"],
                call_rows,
                [False, False, True, False, True],
            ),
        ]
    )


_CALL_NAMES = {HISTOGRAM: "add_histogram", IMAGE: "add_image", SUMMARY: "add_summary (serialized, the hooks)"}


# ---- 9. many sessions at once ---------------------------------------------------------------------------------

_BACKLOG_GROWTH_S = 0.25
"""The backlog may end at most this many seconds of offered load above where it started: no growth, give or
take the batches that happen to be in flight when a sample is taken."""
_RSS_GROWTH_MB = 10.0


def many_sessions(run: Run) -> str:
    plan = run.plan
    results = []
    for count in plan.session_counts:
        sustained = count == plan.session_counts[-1]
        seconds = plan.sustain_s if sustained else plan.session_window_s
        with running_daemon(run.workdir) as daemon:
            params = SessionsParams(
                daemon.address,
                daemon.pid,
                f"sessions-{count}",
                count,
                plan.session_rate,
                seconds,
                warmup_s=plan.session_warmup_s,
            )
            began = time.monotonic()
            results.append(run_trial("sessions", asdict(params), run.workdir, _TIMEOUT + seconds))
            progress(f"[sessions] {count} sessions x {plan.session_rate:,}/s ({time.monotonic() - began:.1f}s)")
    run.results["sessions"] = results

    rows = []
    for r in results:
        rows.append(
            [
                f"{r['sessions']:,} x {plan.session_rate:,}/s",
                f"{r['seconds']:.0f}",
                rate(r["offered_rate"]),
                rate(r["acked_rate"]),
                f"{r['daemon_cpu_s'] / r['events'] * 1e6:.1f}",
                f"{r['daemon_cpu_s'] / r['seconds']:.2f}",
                f"{r['generator_cpu_s'] / r['seconds']:.2f}",
                f"{r['backlog_start']:,.0f} → {r['backlog_end']:,.0f} ({r['backlog_max']:,})",
                f"{r['rss_start_mb']:.0f} → {r['rss_end_mb']:.0f} ({r['rss_max_mb']:.0f})",
            ]
        )
        run.targets.append(
            Target(
                f"daemon CPU per scalar, {r['sessions']} sessions x {plan.session_rate:,}/s (1M/s on one core)",
                r["daemon_cpu_s"] / r["events"] * 1e6,
                1.0,
                False,
                unit=" µs",
            )
        )
    last = results[-1]
    offered = last["offered_rate"]
    how = f"{last['sessions']} sessions x {plan.session_rate:,}/s for {last['seconds']:.0f} s"
    run.targets += [
        Target(f"{how}: acknowledged vs offered", last["acked_rate"] / offered, 0.99, True),
        Target(
            f"{how}: backlog growth, seconds of load",
            (last["backlog_end"] - last["backlog_start"]) / offered,
            _BACKLOG_GROWTH_S,
            False,
            unit=" s",
        ),
        Target(
            f"{how}: daemon RSS growth, MB", last["rss_end_mb"] - last["rss_start_mb"], _RSS_GROWTH_MB, False, " MB"
        ),
    ]
    about = (
        f"N sessions each logging {plan.session_rate:,} scalars/s to their own run, from one load generator "
        "speaking the contract with grpc.aio (`benchmarks/sessions.py`: a session sends what is due as one batch "
        "of scalar columns every 50 ms, the client's default linger, with at most 8 batches unacknowledged, "
        "larger batches when it falls behind, as a client's sender does). After "
        f"{plan.session_warmup_s:g} s at full load, a window of {plan.session_window_s:g} s "
        f"({plan.sustain_s:g} s for {plan.session_counts[-1]} sessions): the daemon's CPU, all threads, per "
        "scalar acknowledged, and in cores (and the generator's: near one core, it bounds the load instead); "
        "the backlog (scalars due but not yet acknowledged, the mean of "
        "the samples of the window's first and last tenth, and the most) and the daemon's resident size, "
        "sampled once a second. A fresh daemon per row; one trial each."
    )
    headers = [
        "sessions",
        "s",
        "offered/s",
        "acknowledged/s",
        "daemon CPU µs/scalar",
        "daemon cores",
        "generator cores",
    ]
    headers += ["backlog start → end (max)", "daemon RSS MB start → end (max)"]
    return "\n".join(["### 9. Many sessions at once", "", about, "", table(headers, rows)])
