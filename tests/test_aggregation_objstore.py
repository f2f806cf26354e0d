"""Cross-worker aggregation on a bucket logdir (SeaweedFS, as `test_objstore`): the aggregate runs go up as
segments like any run's, and a restarted daemon reads their last steps back from the bucket, whose staged copies
are emptied once uploaded, so no aggregate step is written twice."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from _aggregation import REDUCTIONS, WORKERS_TIMEOUT, finish, start_workers
from _bucket import start_bucket_daemon, steps_from_bucket
from _seaweed import SeaweedServer
from _support import Daemon, wait_for

pytestmark = pytest.mark.objstore


def test_a_restarted_bucket_daemon_writes_no_aggregate_step_twice(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    daemons.append(start_bucket_daemon(tmp_path, logdir_url, "--straggler-secs", "600"))
    go = tmp_path / "go"
    stalls = {rank: {"stall": {"at": 250 if rank == 1 else 500, "go": str(go)}} for rank in range(2)}
    procs, barrier = start_workers(daemons[0], tmp_path, 2, steps=[0, 1000], ranks=stalls)
    wait_for(lambda: len(list(barrier.glob("stalled-*"))) == 2, WORKERS_TIMEOUT, "both workers to stall")
    # A clean shutdown finalises steps 250..499 with rank-0 alone and uploads everything staged.
    assert daemons[0].terminate() == 0
    restart = ("--listen", f"127.0.0.1:{daemons[0].port}", "--straggler-secs", "600")
    daemons.append(start_bucket_daemon(tmp_path, logdir_url, *restart))
    go.touch()
    finish(procs)
    daemons[1].terminate()
    for name in REDUCTIONS:
        steps = steps_from_bucket(seaweed, logdir_url, f"job/{name}", tmp_path / "read" / name)
        assert steps == collections.Counter(range(1000)), f"{name}: lost or doubled steps"
    for rank in range(2):
        steps = steps_from_bucket(seaweed, logdir_url, f"job/rank-{rank}", tmp_path / "read" / str(rank))
        assert steps == collections.Counter(range(1000))
