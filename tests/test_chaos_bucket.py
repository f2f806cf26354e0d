"""Chaos on a bucket logdir: three daemons, writers and a `summaryd ship` process given every address, and a
random schedule of faults made for real (SIGKILL with the disk kept or lost, SIGSTOP past the run lease, the
store itself stopped, the shipper SIGKILLed and started again); every run read back from the bucket with
TensorBoard's loader holds every step exactly once, the shipped one too.

The shipper follows an event file that tensorboardX's SummaryWriter (no TensorFlow) writes as the test goes.
Each round also a writer that reached no daemon leaves its steps in a spool, and `summaryd replay`, given every
address, delivers the spools while the round's fault lasts (a pass cut short leaves them for the next one).
Pacing and group commit are on, as by default.

The schedule comes from a seed printed at the start (`SUMMARYD_CHAOS_SEED=N` replays one); the tier runs ten
rounds, about a minute, and `SUMMARYD_CHAOS_ROUNDS=N` runs longer.
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from _bucket import daemon_in, steps_from_bucket
from _seaweed import SeaweedServer
from _shipping import ship_argv
from _support import Daemon, log_losses, unused_port
from summaryd.client import SummaryWriter

pytestmark = pytest.mark.objstore

LEASE = 3.0
ROUNDS = int(os.environ.get("SUMMARYD_CHAOS_ROUNDS") or 10)
STEPS = 40  # per writer and round
FAULTS = ("kill", "lose its disk", "pause past the lease", "stop the store")
SHIPPER_KILLS = 0.4
"""The chance that the shipper is SIGKILLed (and started again) in a round, too, while the round's fault lasts."""


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

    def kill(self, i: int, lose_disk: bool, meanwhile: Callable[[], object] | None = None) -> None:
        """SIGKILL daemon `i` (its state and staging deleted with `lose_disk`), call `meanwhile`, restart it."""
        self.live[i].proc.kill()
        self.live[i].proc.wait(30)
        if lose_disk:
            shutil.rmtree(self.tmp_path / f"d{i}" / "state")
        if meanwhile is not None:
            meanwhile()
        self.live[i] = self._start(i)

    def stop(self) -> None:
        for daemon in self.live:
            assert daemon.terminate(60) == 0, daemon.log()[-3000:]


def spool_round(root: Path, steps: range) -> None:
    """A writer that reaches no daemon logs `steps` of run `chaos-spool` and ends: its spool stays in `root`."""
    dead = f"127.0.0.1:{unused_port()}"
    writer = SummaryWriter("chaos-spool", address=dead, spool_dir=root, spool_after=0.1, close_timeout=0.5)
    log_losses(writer, steps)
    report = writer.close(timeout=0.5)
    assert report.spooled == len(steps) and not report.dropped, report


def replay_argv(root: Path, address: str) -> list[str]:
    return [sys.executable, "-m", "summaryd.server", "replay", str(root), "--address", address, "--timeout", "10"]


class Follower:
    """`summaryd ship DIR --run RUN` following DIR, given every daemon's address; SIGKILLed and started again."""

    def __init__(self, directory: Path, run: str, address: str, log: Path) -> None:
        self.argv = ship_argv(directory, run, address, "--poll", "0.05", "--timeout", "10")
        self.log = log
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        with open(self.log, "ab") as log:
            return subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=log)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)
        self.proc = self._start()

    def finish(self) -> subprocess.CompletedProcess[str]:
        """Stop following (SIGKILL: nothing drained), then ship what is left with `--once`."""
        self.proc.kill()
        self.proc.wait(30)
        argv = [arg for arg in self.argv if arg not in ("--poll", "0.05")]
        return subprocess.run([*argv, "--once"], capture_output=True, text=True, timeout=240, check=False)


@pytest.mark.timeout(120 + 45 * ROUNDS)
def test_many_daemons_on_one_bucket_lose_and_double_nothing_whatever_befalls_them(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    from tensorboardX import SummaryWriter as PlainWriter

    seed = int(os.environ.get("SUMMARYD_CHAOS_SEED") or time.time_ns() % 2**32)
    print(f"chaos seed {seed} (replay: SUMMARYD_CHAOS_SEED={seed})")
    rng = random.Random(seed)
    cluster = Cluster(tmp_path, logdir_url, daemons)
    runs = ["chaos-a", "chaos-b"]
    writers = [SummaryWriter(run, address=cluster.address, backoff_secs=(0.05, 0.5)) for run in runs]
    local = tmp_path / "shipped"
    plain = PlainWriter(str(local), flush_secs=3600)
    follower = Follower(local, "chaos-ship", cluster.address, tmp_path / "ship.log")
    spools, replays = tmp_path / "spools", 0
    try:
        for round_ in range(ROUNDS):
            spool_round(spools, range(round_ * STEPS, (round_ + 1) * STEPS))
            for writer in writers:
                log_losses(writer, range(round_ * STEPS, (round_ + 1) * STEPS))
                writer.flush(timeout=30)
            for step in range(round_ * STEPS, (round_ + 1) * STEPS):
                plain.add_scalar("loss", step * 0.5, step)
            plain.flush()
            fault, i, shipper_too = rng.choice(FAULTS), rng.randrange(3), rng.random() < SHIPPER_KILLS
            print(f"round {round_}: {fault} (daemon {i})" + (", the shipper killed" if shipper_too else ""))
            replaying = subprocess.Popen(
                replay_argv(spools, cluster.address), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            if fault in ("kill", "lose its disk"):
                cluster.kill(i, lose_disk=fault == "lose its disk", meanwhile=follower.kill if shipper_too else None)
            else:
                pid = cluster.live[i].pid if fault == "pause past the lease" else seaweed.proc.pid
                os.kill(pid, signal.SIGSTOP)
                try:
                    if shipper_too:
                        follower.kill()
                    time.sleep(LEASE + 2)  # the writers and the shipper go on meanwhile (queues, checkpoint)
                finally:
                    os.kill(pid, signal.SIGCONT)
            replays += replaying.wait(120) == 0
    finally:
        plain.close()
        reports = [writer.close(timeout=180) for writer in writers]
        shipped = follower.finish()
    assert all(report.delivered == ROUNDS * STEPS and not report.dropped for report in reports), reports
    assert shipped.returncode == 0, (seed, shipped.stderr[-3000:])
    print(f"the shipper's last pass: {shipped.stderr.strip().splitlines()[-1:]}")
    left = len(list(spools.rglob("manifest.json")))  # spools the passes during the faults did not finish
    if left:
        argv = replay_argv(spools, cluster.address)
        replayed = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
        assert replayed.returncode == 0, (seed, replayed.stderr[-3000:])
    print(f"replay: {replays} of {ROUNDS} passes during a fault delivered every spool; {left} left for the last")
    assert not [p for p in spools.rglob("manifest.json")], "a delivered spool was left behind"
    cluster.stop()
    for run in [*runs, "chaos-ship", "chaos-spool"]:
        steps = steps_from_bucket(seaweed, logdir_url, run, tmp_path / f"read-{run}")
        lost, doubled = collections.Counter(range(ROUNDS * STEPS)) - steps, steps - collections.Counter(steps.keys())
        print(f"{run}: {sum(steps.values())} steps read back, {len(lost)} lost, {sum(doubled.values())} doubled")
        assert steps == collections.Counter(range(ROUNDS * STEPS)), (seed, run, lost, doubled)
