"""Cross-worker aggregation end to end: worker processes log through real daemons, and TensorBoard's loader
reads back `<run>/mean|min|max|std` and `<run>/summaryd` beside the workers' own runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tensorboard.compat.proto.event_pb2 import Event

from _aggregation import (
    REDUCTIONS,
    WORKER,
    WORKERS_TIMEOUT,
    expected,
    finish,
    scalars,
    start_workers,
    wait_aggregates_closed,
)
from _support import Daemon, event_files, read_events, start_daemon, wait_for
from summaryd.cli import build_parser, config_from, main
from summaryd.client import SummaryWriter
from summaryd.server.aggregation.aggregator import AggregationSettings
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import frame_all, whole_records


def assert_steps_never_go_back(run_dir: Path) -> dict[str, list[int]]:
    """Every file of the run has each tag's steps strictly ascending; returns each tag's steps over all files."""
    steps: dict[str, list[int]] = {}
    for path in event_files(run_dir):
        last: dict[str, int] = {}
        for event in read_events(path):
            for v in event.summary.value:
                assert event.step > last.get(v.tag, -1), f"{path}: tag {v.tag} goes back to step {event.step}"
                last[v.tag] = event.step
                steps.setdefault(v.tag, []).append(event.step)
    return steps


def test_eight_workers_reductions_read_back_exactly(tmp_path: Path) -> None:
    """8 processes log `loss` at steps 0..999 (half as scalar columns, half as serialized `Summary` protos) and
    `add_scalars` sub-runs; each step's mean, min, max, std and count are exactly the independent reductions."""
    daemon = start_daemon(tmp_path)
    try:
        half = {rank: {"summary": True} for rank in range(4, 8)}
        procs, _ = start_workers(daemon, tmp_path, 8, steps=[0, 1000], scalars_steps=50, ranks=half)
        finish(procs)
        job = daemon.logdir / "job"
        for name in REDUCTIONS:
            points = scalars(job / name, "loss")
            assert [step for step, _ in points] == list(range(1000))
            assert [v for _, v in points] == [expected(step, range(8))[name] for step in range(1000)], name
            assert assert_steps_never_go_back(job / name) == {"loss": list(range(1000))}
        assert scalars(job / "summaryd", "count/loss") == [(step, 8.0) for step in range(1000)]
        for rank in range(8):
            assert scalars(job / "summaryd", f"lag_steps/rank-{rank}"), rank
            assert [s for s, _ in scalars(job / f"rank-{rank}", "loss")] == list(range(1000))
        # add_scalars: each key's sub-run is aggregated under its own path, with the chart's tag.
        for key, sign in (("a", 1.0), ("b", -1.0)):
            means = scalars(job / f"parts_{key}" / "mean", "parts")
            assert means == [(step, sign * expected(step, range(8))["mean"]) for step in range(50)]
    finally:
        daemon.stop()


def test_a_straggler_is_not_waited_for(tmp_path: Path) -> None:
    """One worker stalls past `--straggler-secs`: the steps it misses are written without it (count 7) while it
    stalls, its own late points still reach its own run, and `lag_steps/<worker>` shows the stall."""
    daemon = start_daemon(tmp_path, "--straggler-secs", "3")
    try:
        go = tmp_path / "go"
        stall = {7: {"stall": {"at": 500, "go": str(go)}}}
        procs, _ = start_workers(daemon, tmp_path, 8, steps=[0, 1000], ranks=stall)
        job = daemon.logdir / "job"
        # Written while the straggler still waits: without it.
        wait_for(
            lambda: (999, 7.0) in scalars(job / "summaryd", "count/loss"), WORKERS_TIMEOUT, "step 999 without rank-7"
        )
        go.touch()
        finish(procs)
        counts = scalars(job / "summaryd", "count/loss")
        assert counts == [(step, 8.0 if step < 500 else 7.0) for step in range(1000)]
        means = scalars(job / "mean", "loss")
        assert means == [(s, expected(s, range(8) if s < 500 else range(7))["mean"]) for s in range(1000)]
        assert [s for s, _ in scalars(job / "rank-7", "loss")] == list(range(1000))
        lag = dict(scalars(job / "summaryd", "lag_steps/rank-7"))
        assert lag[999] == 999 - 499
        assert max(dict(scalars(job / "summaryd", "lag_steps/rank-0")).values()) == 0
        for name in (*REDUCTIONS, "summaryd", "rank-7"):
            assert_steps_never_go_back(job / name)
    finally:
        daemon.stop()


def test_a_restarted_worker_writes_no_aggregate_step_twice(tmp_path: Path) -> None:
    """A worker restarts mid-run (a new session whose steps start lower): every aggregate step is written once,
    and no file has a tag's steps going backwards."""
    daemon = start_daemon(tmp_path, "--straggler-secs", "2")
    try:
        first = {3: {"steps": [0, 600]}}
        procs, barrier = start_workers(daemon, tmp_path, 4, steps=[0, 1000], ranks=first)
        assert procs[3].wait(WORKERS_TIMEOUT) == 0
        again = {
            "address": daemon.address,
            "run": "job",
            "rank": 3,
            "world": 4,
            "barrier": str(barrier),
            "steps": [300, 1000],
        }
        restarted = subprocess.Popen([sys.executable, str(WORKER), json.dumps(again)])
        finish([*procs, restarted])
        job = daemon.logdir / "job"
        for name in REDUCTIONS:
            assert assert_steps_never_go_back(job / name) == {"loss": list(range(1000))}
        counts = dict(scalars(job / "summaryd", "count/loss"))
        assert sorted(counts) == list(range(1000)) and set(counts.values()) <= {1.0, 2.0, 3.0, 4.0}
        assert len(event_files(job / "rank-3")) == 2
        assert assert_steps_never_go_back(job / "rank-3")["loss"] == [*range(600), *range(300, 1000)]
    finally:
        daemon.stop()


def test_a_worker_whose_lease_runs_out_leaves_the_world(tmp_path: Path) -> None:
    """A worker that goes silent (its process stopped by SIGSTOP) is released when its lease runs out: the world
    shrinks and the steps no longer wait for it (the straggler timeout is far away). Back, it joins again."""
    daemon = start_daemon(tmp_path, "--session-lease", "2", "--straggler-secs", "600")
    try:
        go = [tmp_path / "go-0", tmp_path / "go-1"]
        stalls = {0: {"stall": {"at": 20, "go": str(go[0])}}, 1: {"stall": {"at": 10, "go": str(go[1])}}}
        procs, barrier = start_workers(daemon, tmp_path, 2, steps=[0, 21], ranks=stalls)
        wait_for(lambda: len(list(barrier.glob("stalled-*"))) == 2, WORKERS_TIMEOUT, "both workers to stall")
        os.kill(procs[1].pid, signal.SIGSTOP)  # no heartbeats: its session is released after the lease
        try:
            job = daemon.logdir / "job"
            wait_for(lambda: (19, 1.0) in scalars(job / "summaryd", "count/loss"), 60, "steps without rank-1")
        finally:
            os.kill(procs[1].pid, signal.SIGCONT)
        assert "released after" in daemon.log()
        go[1].touch()  # rank-1 resumes its session (back in the world), logs 10..20 (10..19 late) and closes
        finish(procs[1:])
        go[0].touch()
        finish(procs[:1])
        counts = scalars(job / "summaryd", "count/loss")
        assert counts == [(step, 1.0 if 10 <= step < 20 else 2.0) for step in range(21)]
        assert [s for s, _ in scalars(job / "rank-1", "loss")] == list(range(21))
    finally:
        daemon.stop()


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_a_daemon_restart_writes_no_aggregate_step_twice(tmp_path: Path, stop: str) -> None:
    """The daemon restarts while steps are pending (one worker behind): pending steps may be finalised early
    (at a clean shutdown), never written twice; a killed daemon's are taken up from the workers' runs, so each
    is exact over all four workers (the three ahead, told their points were written, do not send them again);
    the workers' runs lose nothing."""
    daemons = [start_daemon(tmp_path, "--straggler-secs", "60")]
    try:
        go = tmp_path / "go"
        stalls = {rank: {"stall": {"at": 250 if rank == 3 else 500, "go": str(go)}} for rank in range(4)}
        procs, barrier = start_workers(daemons[0], tmp_path, 4, steps=[0, 1000], ranks=stalls)
        wait_for(lambda: len(list(barrier.glob("stalled-*"))) == 4, WORKERS_TIMEOUT, "every worker to stall")
        job = daemons[0].logdir / "job"
        # The steps every worker reached are written before the stop: what is pending is 250..499 alone.
        wait_for(lambda: 249 in dict(scalars(job / "mean", "loss")), WORKERS_TIMEOUT, "steps up to 249 aggregated")
        if stop == "sigterm":
            assert daemons[0].terminate() == 0
        else:
            daemons[0].proc.kill()
            daemons[0].proc.wait(30)
        daemons.append(start_daemon(tmp_path, "--listen", f"127.0.0.1:{daemons[0].port}", logdir=daemons[0].logdir))
        go.touch()
        finish(procs)
        for name in REDUCTIONS:
            steps = assert_steps_never_go_back(job / name)["loss"]
            assert len(steps) == len(set(steps)), name
            assert set(range(250)) <= set(steps) or stop == "sigkill"
            assert set(range(500, 1000)) <= set(steps)
        if stop == "sigkill":
            wait_aggregates_closed(daemons[1])
            for name in REDUCTIONS:
                points = dict(scalars(job / name, "loss"))
                assert [points.get(step) for step in range(250, 500)] == [
                    expected(step, range(4))[name] for step in range(250, 500)
                ], name
        for rank in range(4):
            assert sorted(s for s, _ in scalars(job / f"rank-{rank}", "loss")) == list(range(1000))
    finally:
        for daemon in daemons:
            daemon.stop()


def cut_records_from(run_dir: Path, step: int) -> None:
    """Drop the run's events at `step` and beyond from its files, as if the daemon had never written them."""
    for path in event_files(run_dir):
        kept = [r for r in whole_records(path.read_bytes()) if Event.FromString(r).step < step]
        path.write_bytes(frame_all(kept))


def test_a_daemon_killed_between_the_aggregate_runs_writes_completes_each_of_them_once(tmp_path: Path) -> None:
    """The daemon writes a finalised step to the five aggregate runs one after the other, so a SIGKILL can fall
    between them, leaving some runs steps ahead of others. The next daemon aggregates the steps the runs lack
    again from the workers' runs and writes them only where they are missing: every run has every step once,
    exact. (A real SIGKILL hits that moment only by chance: the files here are cut as it would leave them.)"""
    daemon = start_daemon(tmp_path)
    procs, _ = start_workers(daemon, tmp_path, 4, steps=[0, 300])
    finish(procs)
    wait_aggregates_closed(daemon)
    assert daemon.terminate() == 0
    job = daemon.logdir / "job"
    cut_records_from(job / "summaryd", 200)  # the counts and lags of 200..299 never reached the disk
    cut_records_from(job / "max", 250)
    daemon = start_daemon(tmp_path, logdir=daemon.logdir)
    try:
        procs, _ = start_workers(daemon, tmp_path, 4, steps=[300, 400])
        finish(procs)
        wait_aggregates_closed(daemon)
        for name in REDUCTIONS:
            assert assert_steps_never_go_back(job / name) == {"loss": list(range(400))}, name
            points = scalars(job / name, "loss")
            assert [v for _, v in points] == [expected(step, range(4))[name] for step in range(400)], name
        assert scalars(job / "summaryd", "count/loss") == [(step, 4.0) for step in range(400)]
    finally:
        daemon.stop()


@pytest.fixture
def stub(daemon: Daemon) -> Iterator[pb_grpc.SummariesStub]:
    with grpc.insecure_channel(daemon.address) as channel:
        yield pb_grpc.SummariesStub(channel)


@pytest.mark.parametrize("label", ["mean", "min", "max", "std", "summaryd"])
def test_the_aggregate_runs_labels_are_reserved(stub: pb_grpc.SummariesStub, label: str) -> None:
    request = pb.OpenSessionRequest(session_id=str(uuid.uuid4()), run="job", worker=label, world_size=8)
    with pytest.raises(grpc.RpcError) as refused:
        stub.OpenSession(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == (
        f"worker label {label!r} is reserved for the daemon's aggregates of the run (max, mean, min, std, "
        "summaryd); label the worker otherwise, e.g. 'rank-0'"
    )


def test_too_many_tag_patterns_are_refused(stub: pb_grpc.SummariesStub) -> None:
    request = pb.OpenSessionRequest(
        session_id=str(uuid.uuid4()), run="job", worker="rank-0", world_size=8, aggregate_tags=["t*"] * 65
    )
    with pytest.raises(grpc.RpcError) as refused:
        stub.OpenSession(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "aggregate_tags has 65 patterns, over the limit of 64; merge them"


def log_two_workers(daemon: Daemon, **options: object) -> None:
    writers = [
        SummaryWriter("job", address=daemon.address, worker=f"rank-{r}", world_size=2, **options) for r in range(2)
    ]
    for step in range(5):
        for rank, writer in enumerate(writers):
            writer.add_scalar("loss", float(rank), step)
            writer.add_scalar("acc/top1", float(rank), step)
    for writer in writers:
        assert writer.close().ok


def test_no_aggregate_writes_no_aggregates_and_frees_the_labels(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--no-aggregate")
    try:
        log_two_workers(daemon)
        assert sorted(p.name for p in (daemon.logdir / "job").iterdir()) == ["rank-0", "rank-1"]
        with SummaryWriter("job", address=daemon.address, worker="mean", world_size=2) as writer:
            writer.add_scalar("loss", 1.0, 0)
        assert scalars(daemon.logdir / "job" / "mean", "loss") == [(0, 1.0)]
    finally:
        daemon.stop()


def test_a_writer_turns_aggregation_off_or_names_its_tags(daemon: Daemon) -> None:
    log_two_workers(daemon, aggregate=False)
    assert sorted(p.name for p in (daemon.logdir / "job").iterdir()) == ["rank-0", "rank-1"]
    log_two_workers(daemon, aggregate="acc/*")  # one pattern
    job = daemon.logdir / "job"
    assert scalars(job / "mean", "acc/top1") == [(step, 0.5) for step in range(5)]
    assert scalars(job / "mean", "loss") == []


def test_a_writer_refuses_patterns_no_daemon_takes() -> None:
    with pytest.raises(ValueError, match="aggregate= has 65 tag patterns, over the limit of 64"):
        SummaryWriter("job", address="127.0.0.1:1", worker="rank-0", world_size=2, aggregate=["t*"] * 65)
    with pytest.raises(ValueError, match="non-empty strings"):
        SummaryWriter("job", address="127.0.0.1:1", worker="rank-0", world_size=2, aggregate=["loss", ""])


def test_status_shows_each_aggregated_workers_lag(
    daemon: Daemon, stub: pb_grpc.SummariesStub, capsys: pytest.CaptureFixture[str]
) -> None:
    writers = [SummaryWriter("job", address=daemon.address, worker=f"rank-{r}", world_size=2) for r in range(2)]
    single = SummaryWriter("solo", address=daemon.address)
    try:
        for step in range(10):
            writers[0].add_scalar("loss", 1.0, step)
        writers[1].add_scalar("loss", 1.0, 0)
        single.add_scalar("loss", 1.0, 0)
        for writer in [*writers, single]:
            writer.flush(timeout=10)
        status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
        lags = {s.run_dir: (s.aggregated, s.lag_steps) for s in status.sessions}
        assert lags == {"job/rank-0": (True, 0), "job/rank-1": (True, 9), "solo": (False, 0)}
        assert main(["status", "--address", daemon.address]) == 0
        table = capsys.readouterr().out
        assert "LAG" in table
        [row] = [line for line in table.splitlines() if line.startswith(writers[1].sender.session_id)]
        assert row.split()[-1] == "9"
    finally:
        for writer in [*writers, single]:
            writer.close()


def test_a_world_that_never_fills_is_written_after_the_straggler_timeout(tmp_path: Path) -> None:
    """Two workers of a declared world of three log and close: the run's aggregator waits for the third (a
    restart may bring workers back) for `--straggler-secs`, then writes what is pending and closes its files."""
    daemon = start_daemon(tmp_path, "--straggler-secs", "1")
    try:
        writers = [SummaryWriter("job", address=daemon.address, worker=f"rank-{r}", world_size=3) for r in range(2)]
        for step in range(5):
            for rank, writer in enumerate(writers):
                writer.add_scalar("loss", float(rank), step)
        for writer in writers:
            assert writer.close().ok
        job = daemon.logdir / "job"
        wait_aggregates_closed(daemon)
        assert scalars(job / "mean", "loss") == [(step, 0.5) for step in range(5)]
        assert scalars(job / "summaryd", "count/loss") == [(step, 2.0) for step in range(5)]
        # Their journals are done with once the closed files' marks are in the session store, just after the
        # runs left the registry (which is what `wait_aggregates_closed` sees).
        open_dir = daemon.logdir / ".summaryd" / "open"
        wait_for(lambda: os.listdir(open_dir) == [], 30, "the aggregate runs' journals to be deleted")
    finally:
        daemon.stop()


def test_the_flags_and_their_variables() -> None:
    parser, _ = build_parser()
    default = parser.parse_args(["serve"])
    assert config_from(default, {}).aggregation == AggregationSettings(enabled=True, straggler_secs=30.0)
    assert config_from(default, {"SUMMARYD_AGGREGATE": "0"}).aggregation.enabled is False
    assert config_from(default, {"SUMMARYD_STRAGGLER_SECS": "2.5"}).aggregation.straggler_secs == 2.5
    off = parser.parse_args(["serve", "--no-aggregate", "--straggler-secs", "5"])
    assert config_from(off, {"SUMMARYD_AGGREGATE": "1"}).aggregation == AggregationSettings(False, 5.0)
    with pytest.raises(ValueError, match="--straggler-secs must be positive"):
        config_from(parser.parse_args(["serve", "--straggler-secs", "0"]), {})
