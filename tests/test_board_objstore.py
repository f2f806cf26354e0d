"""On a bucket logdir, TensorBoard reads every run of the prefix through any one daemon's board address.

Two daemons on a real SeaweedFS bucket, each writing runs of its own; a real `tensorboard --grpc_data_provider`
on one daemon's board, started with no bucket credentials at all, serves both daemons' runs, the points the
other daemon logs after TensorBoard started included (the board follows the other daemon's new segments), and
what the bucket held before the daemon started.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _bucket import daemon_in
from _seaweed import SeaweedServer
from _support import Daemon, TensorBoard, stop_process, unused_port, wait_for
from summaryd.client import SummaryWriter

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
    fast = ("--seal-secs", "0.5")  # segments go up within a second: the test waits less
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
