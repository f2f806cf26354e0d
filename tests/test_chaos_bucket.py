"""Chaos on a bucket logdir: three daemons, writers given every address, and a random schedule of faults made
for real (SIGKILL with the disk kept or lost, SIGSTOP past the run lease, the store itself stopped); every run
read back from the bucket with TensorBoard's loader holds every step exactly once.

The schedule comes from a seed printed at the start (`SUMMARYD_CHAOS_SEED=N` replays one).
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from _bucket import daemon_in, steps_from_bucket
from _seaweed import SeaweedServer
from _support import Daemon, log_losses, unused_port
from summaryd.client import SummaryWriter

pytestmark = pytest.mark.objstore

LEASE = 3.0
ROUNDS = 10
STEPS = 40  # per writer and round
FAULTS = ("kill", "lose its disk", "pause past the lease", "stop the store")


class Cluster:
    """Three daemons on one bucket, each on a port of its own that it keeps across restarts."""

    def __init__(self, tmp_path: Path, url: str, daemons: list[Daemon]) -> None:
        self.tmp_path, self.url, self.started = tmp_path, url, daemons
        self.ports = [unused_port() for _ in range(3)]
        self.live = [self._start(i) for i in range(3)]

    @property
    def address(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def _start(self, i: int) -> Daemon:
        flags = ("--run-lease", str(LEASE), "--seal-secs", "0.2", "--listen", f"127.0.0.1:{self.ports[i]}")
        daemon = daemon_in(self.tmp_path / f"d{i}", self.url, *flags)
        self.started.append(daemon)
        return daemon

    def kill(self, i: int, lose_disk: bool) -> None:
        self.live[i].proc.kill()
        self.live[i].proc.wait(30)
        if lose_disk:
            shutil.rmtree(self.tmp_path / f"d{i}" / "state")
        self.live[i] = self._start(i)

    def stop(self) -> None:
        for daemon in self.live:
            assert daemon.terminate(60) == 0, daemon.log()[-3000:]


def test_many_daemons_on_one_bucket_lose_and_double_nothing_whatever_befalls_them(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    seed = int(os.environ.get("SUMMARYD_CHAOS_SEED") or time.time_ns() % 2**32)
    print(f"chaos seed {seed} (replay: SUMMARYD_CHAOS_SEED={seed})")
    rng = random.Random(seed)
    cluster = Cluster(tmp_path, logdir_url, daemons)
    runs = ["chaos-a", "chaos-b"]
    writers = [SummaryWriter(run, address=cluster.address, backoff_secs=(0.05, 0.5)) for run in runs]
    try:
        for round_ in range(ROUNDS):
            for writer in writers:
                log_losses(writer, range(round_ * STEPS, (round_ + 1) * STEPS))
                writer.flush(timeout=30)
            fault, i = rng.choice(FAULTS), rng.randrange(3)
            print(f"round {round_}: {fault} (daemon {i})")
            if fault in ("kill", "lose its disk"):
                cluster.kill(i, lose_disk=fault == "lose its disk")
            else:
                pid = cluster.live[i].pid if fault == "pause past the lease" else seaweed.proc.pid
                os.kill(pid, signal.SIGSTOP)
                try:
                    time.sleep(LEASE + 2)  # the writers go on logging meanwhile (their queues take it)
                finally:
                    os.kill(pid, signal.SIGCONT)
    finally:
        reports = [writer.close(timeout=180) for writer in writers]
    assert all(report.delivered == ROUNDS * STEPS and not report.dropped for report in reports), reports
    cluster.stop()
    for run in runs:
        steps = steps_from_bucket(seaweed, logdir_url, run, tmp_path / f"read-{run}")
        assert steps == collections.Counter(range(ROUNDS * STEPS)), (seed, run, steps - collections.Counter())
