"""On a bucket logdir, TensorBoard reads every run of the prefix through any one daemon's board address.

Two daemons on a real SeaweedFS bucket, each writing runs of its own; a real `tensorboard --grpc_data_provider`
on one daemon's board, started with no bucket credentials at all, serves both daemons' runs, the points the
other daemon logs after TensorBoard started included (the board follows the other daemon's new segments), and
what the bucket held before the daemon started.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from _bucket import daemon_in
from _seaweed import SeaweedServer
from _support import Daemon, TensorBoard, stop_process, unused_port, wait_for
from summaryd.client import SummaryWriter
from summaryd.server.board.follower import BucketFollower
from summaryd.server.board.index import BoardIndex
from summaryd.server.storage.bucket.store import Bucket

pytestmark = [pytest.mark.objstore, pytest.mark.timeout(300)]


def losses(tb: TensorBoard, run: str) -> list[tuple[int, float]]:
    tags = tb.get("/data/plugin/scalars/tags").get(run, {})
    if "loss" not in tags:
        return []
    return [(step, value) for _, step, value in tb.get("/data/plugin/scalars/scalars", run=run, tag="loss")]


def log(writer: SummaryWriter, steps: range, sign: float = 1.0) -> None:
    for step in steps:
        writer.add_scalar("loss", sign * step / 4, step)
    assert writer.flush(timeout=30).ok


def test_tensorboard_without_credentials_serves_both_daemons_runs_through_one_board(
    tmp_path: Path,
    seaweed: SeaweedServer,
    logdir_url: str,
    daemons: list[Daemon],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast = ("--seal-secs", "0.5", "--no-watch")  # segments go up within a second: the test waits less
    b = daemon_in(tmp_path / "b", logdir_url, *fast)
    daemons.append(b)
    # In the bucket before the board's daemon starts: read at its start.
    with SummaryWriter("before", address=b.address) as before:
        log(before, range(50))
    board_address = f"127.0.0.1:{unused_port()}"
    a = daemon_in(tmp_path / "a", logdir_url, *fast, "--board-listen", board_address)
    daemons.append(a)

    for name in seaweed.environment():  # TensorBoard gets no endpoint and no credentials
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "tb").mkdir()
    tb = TensorBoard(["--grpc_data_provider", board_address], tmp_path / "tb")
    try:
        with SummaryWriter("left", address=a.address) as left, SummaryWriter("right", address=b.address) as right:
            log(left, range(100))
            log(right, range(100))
            # This daemon's own run is served at once; the other daemon's once its segments are in the bucket.
            assert losses(tb, "left") == [(s, s / 4) for s in range(100)]
            wait_for(lambda: len(losses(tb, "right")) == 100, 60, "the other daemon's run through this board")
            assert losses(tb, "right") == [(s, s / 4) for s in range(100)]
            # Followed: what the other daemon writes later comes too.
            log(right, range(100, 150))
            wait_for(lambda: len(losses(tb, "right")) == 150, 60, "the other daemon's new segments")
        assert losses(tb, "right") == [(s, s / 4) for s in range(150)]
        assert losses(tb, "before") == [(s, s / 4) for s in range(50)]
        assert sorted(tb.get("/data/runs")) == ["before", "left", "right"]
        # The board's daemon did not read its own run back from the bucket (each point once).
        assert losses(tb, "left") == [(s, s / 4) for s in range(100)]
    finally:
        stop_process(tb.proc, 10)
    for daemon in (a, b):
        assert daemon.terminate() == 0


def test_the_board_lists_only_the_runs_whose_leases_move_after_the_last_key_it_read(
    tmp_path: Path, logdir_url: str, daemons: list[Daemon]
) -> None:
    fast = ("--seal-secs", "0.5", "--no-watch")
    writer_daemon = daemon_in(tmp_path / "w", logdir_url, *fast)
    daemons.append(writer_daemon)
    for r in range(12):
        with SummaryWriter(f"r-{r:02d}", address=writer_daemon.address) as writer:
            log(writer, range(20))
    writer_daemon.stop()  # uploads every segment, then releases (writes) every lease

    index = BoardIndex()
    follower = BucketFollower(index, Bucket(logdir_url), interval=0.0, run_lease=1.0)

    def points(run: str) -> int:
        return sum(len(s.reservoir.items) for name, r in index.snapshot() if name == run for s in r.series.values())

    async def follow() -> tuple[int, int, int]:
        await follower.poll(hold=True)  # the whole prefix: every segment, every lease
        whole = follower.listed
        assert [points(f"r-{r:02d}") for r in range(12)] == [20] * 12
        await asyncio.sleep(1.5)  # every lease older than run_lease: no run is being written
        before = follower.listings, follower.listed
        for _ in range(5):
            await follower.poll()
        return whole, follower.listings - before[0], follower.listed - before[1]

    whole, listings, listed = asyncio.run(follow())
    # Five polls of a quiet bucket: the leases' listing alone, 12 keys each time, where the whole prefix
    # answered every segment and lease.
    assert (listings, listed) == (5, 5 * 12), (listings, listed)
    assert whole > 2 * 12, whole

    # A run written again: its lease moves, and it alone is listed, from after its last key read.
    again = daemon_in(tmp_path / "again", logdir_url, *fast)
    daemons.append(again)
    with SummaryWriter("r-03", address=again.address) as writer:
        log(writer, range(20, 30))

    async def catch_up() -> tuple[int, int]:
        before = follower.listings, follower.listed
        polls = 0
        while points("r-03") < 30:
            await follower.poll()
            polls += 1
            assert polls < 200, "the run written again was not followed"
            await asyncio.sleep(0.1)
        return follower.listings - before[0] - polls, follower.listed - before[1]

    run_listings, listed = asyncio.run(catch_up())
    assert points("r-03") == 30 and points("r-04") == 20
    assert run_listings >= 1 and listed < whole, (run_listings, listed, whole)
