"""Aggregation through a real daemon at the edges: infinities and NaN across workers, one point far ahead of
the other workers' steps (and a daemon restart after it), and more tags than a run may hold."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

from _aggregation import scalars, wait_aggregates_closed
from _support import Daemon, metrics_port, scrape, start_daemon, wait_for
from summaryd.cli import build_parser, config_from
from summaryd.client import SummaryWriter

INF = math.inf


def writers(daemon: Daemon, world: int, count: int = 2) -> list[SummaryWriter]:
    return [SummaryWriter("job", address=daemon.address, worker=f"rank-{r}", world_size=world) for r in range(count)]


def log_steps(ranks: list[SummaryWriter], steps: range, value: float) -> None:
    for step in steps:
        for writer in ranks:
            writer.add_scalar("loss", value, step)


def double(value: float) -> Summary:
    """A float64 scalar tensor (TF2's `tf.summary.scalar` of a double): a value beyond float32's range."""
    tensor = TensorProto(dtype=2, tensor_shape=TensorShapeProto(), double_val=[value])
    return Summary(value=[Summary.Value(tag="loss", tensor=tensor)])


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("world", [2, 3], ids=["complete", "straggler"])
def test_infinities_and_nan_across_workers_lose_no_step(tmp_path: Path, world: int) -> None:
    """+inf on one worker and -inf on the other, a NaN, and ±1e308 (float64): every one of 200 steps is written
    with the documented IEEE reductions (stored as float32), whether the steps complete or wait out the
    straggler timeout (a world of 3 with 2 workers), and the aggregator's timer goes on to close the run."""
    daemon = start_daemon(tmp_path, "--straggler-secs", "0.5")
    try:
        ranks = writers(daemon, world)
        specials = {50: (INF, -INF), 60: (math.nan, 1.0), 70: (INF, 2.0)}
        for step in range(200):
            for rank, writer in enumerate(ranks):
                if step == 80:
                    writer.add_summary(double(1e308 if rank == 0 else -1e308), step)
                else:
                    writer.add_scalar("loss", specials.get(step, (1.0, 3.0))[rank], step)
        for writer in ranks:
            assert writer.close().ok
        wait_aggregates_closed(daemon)
        job = daemon.logdir / "job"
        got = {name: dict(scalars(job / name, "loss")) for name in ("mean", "min", "max", "std")}
        assert all(sorted(points) == list(range(200)) for points in got.values()), {n: len(p) for n, p in got.items()}
        want = {
            50: (math.nan, -INF, INF, math.nan),  # IEEE: inf + -inf is NaN
            60: (math.nan,) * 4,  # a NaN makes every reduction NaN, whatever the workers' order
            70: (INF, 2.0, INF, math.nan),
            80: (0.0, -INF, INF, INF),  # exact in float64 (std 1e308), beyond float32 once stored
            0: (2.0, 1.0, 3.0, 1.0),
        }
        for step, reductions in want.items():
            found = tuple(got[name][step] for name in ("mean", "min", "max", "std"))
            assert all(same(a, b) for a, b in zip(found, reductions, strict=True)), (step, found)
        assert "not aggregated" not in daemon.log()
    finally:
        daemon.stop()


def test_one_point_far_ahead_never_makes_later_steps_late(tmp_path: Path) -> None:
    """One worker logs a point at step 10^12 among steps 0..149 and the timeout passes: the later steps are
    all aggregated, the far step is held (logged) and not written, also across the aggregator's stop and a
    daemon restart that reads back what was written; the worker's own run keeps its point."""
    daemon = start_daemon(tmp_path, "--straggler-secs", "0.5")
    daemons = [daemon]
    try:
        ranks = writers(daemon, 3)  # a world of 3, 2 workers: only the timeout finalises steps
        log_steps(ranks, range(50), 1.0)
        ranks[0].add_scalar("loss", 5.0, 10**12)
        for writer in ranks:
            writer.flush(timeout=30)
        job = daemon.logdir / "job"
        # The far step is overdue: held now (or, wrongly, written).
        wait_for(lambda: "steps held" in daemon.log() or 10**12 in dict(scalars(job / "mean", "loss")), 60, "timeout")
        log_steps(ranks, range(50, 100), 1.0)
        for writer in ranks:
            assert writer.close().ok
        wait_aggregates_closed(daemon)
        assert daemon.terminate() == 0
        daemon = start_daemon(tmp_path, "--straggler-secs", "0.5", logdir=daemon.logdir)
        daemons.append(daemon)
        ranks = writers(daemon, 3)
        log_steps(ranks, range(100, 150), 3.0)
        for writer in ranks:
            assert writer.close().ok
        wait_aggregates_closed(daemon)
        assert [s for s, _ in scalars(job / "mean", "loss")] == list(range(150))
        assert scalars(job / "summaryd", "count/loss") == [(s, 2.0) for s in range(150)]
        assert (10**12, 5.0) in scalars(job / "rank-0", "loss")
        assert "pending steps not written so far" in daemons[0].log()
    finally:
        for d in daemons:
            d.stop()


def test_a_run_aggregates_at_most_its_tag_limit_and_frees_it(tmp_path: Path) -> None:
    """Two workers log 300 tags with `--aggregate-max-tags 100`: 100 are aggregated, the others are counted,
    logged once and still in the workers' own runs; the state held is 100 tags while the run lives and none
    once it ended (the daemon's metrics say so)."""
    daemon = start_daemon(tmp_path, "--aggregate-max-tags", "100", "--metrics-listen", "127.0.0.1:0")
    try:
        port = metrics_port(daemon)
        ranks = writers(daemon, 2)
        tags = [f"tag-{i:03d}" for i in range(300)]
        for step in range(2):
            for writer in ranks:
                for tag in tags:
                    writer.add_scalar(tag, 1.0, step)
                writer.flush(timeout=30)
        job = daemon.logdir / "job"
        wait_for(lambda: scalars(job / "mean", "tag-099") == [(0, 1.0), (1, 1.0)], 60, "the aggregates")
        metrics = scrape(port)
        assert metrics[("summaryd_aggregation_tags", ())] == 100
        assert metrics[("summaryd_aggregation_points_refused_total", ())] == 2 * 2 * 200
        assert "--aggregate-max-tags" in daemon.log()
        assert daemon.log().count("others not aggregated") == 1  # rate-limited
        for writer in ranks:
            assert writer.close().ok
        wait_aggregates_closed(daemon)
        metrics = scrape(port)
        assert metrics[("summaryd_aggregation_tags", ())] == 0  # freed with the run
        assert metrics[("summaryd_aggregation_remembered_tags", ())] == 100
        assert scalars(job / "mean", "tag-100") == []
        assert [s for s, _ in scalars(job / "rank-1", "tag-299")] == [0, 1]
        assert np.float32(scalars(job / "mean", "tag-000")[1][1]) == 1.0
    finally:
        daemon.stop()


def test_the_tag_limit_flag_and_its_variable() -> None:
    parser, _ = build_parser()
    default = parser.parse_args(["serve"])
    assert config_from(default, {}).aggregation.max_tags == 10_000
    assert config_from(default, {"SUMMARYD_AGGREGATE_MAX_TAGS": "50"}).aggregation.max_tags == 50
    with pytest.raises(ValueError, match="--aggregate-max-tags must be positive"):
        config_from(parser.parse_args(["serve", "--aggregate-max-tags", "0"]), {})
