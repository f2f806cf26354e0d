"""The node relay (`summaryd serve --upstream`): several `SummaryWriter` processes of one job write through a
relay to the daemon that holds their run, exactly once, with the aggregates exact, across a relay SIGKILLed
(restarted, or passed over for the owner itself), an owner SIGKILLed and restarted, and a token's tenancy.

Real daemons and a real relay on loopback; everything is read back with TensorBoard's own loader.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import grpc
import pytest
from _aggregate_worker import value

from _aggregation import REDUCTIONS, finish, scalars, start_workers, wait_aggregates_closed
from _support import Daemon, start_daemon, unused_port, wait_for
from summaryd.client import SummaryWriter
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from test_aggregation import expected

STEPS = 1000
WORLD = 4


def start_relay(workdir: Path, *upstream: Daemon, port: int = 0, extra: tuple[str, ...] = ()) -> Daemon:
    """A relay to `upstream` on loopback (`port` 0: one the OS picks)."""
    workdir.mkdir(exist_ok=True)
    addresses = ",".join(d.address for d in upstream)
    return start_daemon(workdir, "--upstream", addresses, "--listen", f"127.0.0.1:{port}", *extra)


def written(daemon: Daemon, run: str) -> int:
    """Events the daemon wrote of `run` so far (its open run's count)."""
    with grpc.insecure_channel(daemon.address) as channel:
        status = pb_grpc.SummariesStub(channel).GetStatus(pb.GetStatusRequest(), timeout=10)
    return sum(r.events_written for r in status.runs if r.run_dir.startswith(run))


def assert_exactly_once(owner: Daemon, world: int = WORLD, steps: int = STEPS) -> None:
    """Every rank's steps once each, in order, and each step's reductions exact over every rank."""
    job = owner.logdir / "job"
    for rank in range(world):
        assert [s for s, _ in scalars(job / f"rank-{rank}", "loss")] == list(range(steps)), rank
    for name in REDUCTIONS:
        points = scalars(job / name, "loss")
        assert [v for _, v in points] == [expected(step, range(world))[name] for step in range(steps)], name
    assert scalars(job / "summaryd", "count/loss") == [(step, float(world)) for step in range(steps)]


def test_a_job_through_a_relay_is_written_exactly_once(tmp_path: Path) -> None:
    owner = start_daemon(tmp_path / "owner" if (tmp_path / "owner").mkdir() is None else tmp_path)
    relay = start_relay(tmp_path / "relay", owner)
    try:
        procs, _ = start_workers(relay, tmp_path, WORLD, steps=[0, STEPS])
        finish(procs)
        wait_aggregates_closed(owner)
        assert_exactly_once(owner)
        assert not (relay.logdir / "job").exists()  # the relay wrote nothing of its own
    finally:
        relay.stop()
        owner.stop()
