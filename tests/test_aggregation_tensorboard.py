"""A real TensorBoard shows the aggregates beside the workers: its HTTP API serves `<run>/mean|min|max|std` with
the workers' `loss` tag, and a headless Chromium screenshot of the scalars dashboard is kept as an artifact.

Slow tier: it starts TensorBoard and Chromium (Debian's `chromium` package). The screenshot goes to
`$SUMMARYD_ARTIFACTS_DIR` (default `artifacts/` at the repository root) as `aggregates-scalars.png`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from _support import ARTIFACTS, Daemon, TensorBoard, screenshot, stop_process, wait_for
from summaryd.client import SummaryWriter

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WORLD, STEPS = 4, 200


def loss(rank: int, step: int) -> float:
    return float(np.float32(2.0 * np.exp(-step / 60) + 0.1 * rank + 0.05 * np.sin(step / 5 + rank)))


@pytest.fixture
def tensorboard(daemon: Daemon, tmp_path: Path) -> Iterator[TensorBoard]:
    tb = TensorBoard(["--logdir", str(daemon.logdir), "--reload_interval", "1", "--load_fast=false"], tmp_path)
    try:
        yield tb
    finally:
        stop_process(tb.proc, 10)


def test_tensorboard_draws_the_aggregates_beside_the_workers(daemon: Daemon, tensorboard: TensorBoard) -> None:
    writers = [
        SummaryWriter("job", address=daemon.address, worker=f"rank-{rank}", world_size=WORLD) for rank in range(WORLD)
    ]
    for step in range(STEPS):
        for rank, writer in enumerate(writers):
            writer.add_scalar("loss", loss(rank, step), step)
    for writer in writers:
        assert writer.close().ok

    runs = {f"job/rank-{rank}" for rank in range(WORLD)} | {f"job/{n}" for n in ("mean", "min", "max", "std")}
    wait_for(lambda: runs | {"job/summaryd"} <= set(tensorboard.get("/data/runs")), 60, "TensorBoard to list runs")
    tags = tensorboard.get("/data/plugin/scalars/tags")
    for run in runs:
        assert "loss" in tags[run], (run, tags[run])
    assert {"count/loss", *(f"lag_steps/rank-{rank}" for rank in range(WORLD))} <= set(tags["job/summaryd"])

    def served(run: str) -> list[tuple[int, float]]:
        return [
            (step, value) for _, step, value in tensorboard.get("/data/plugin/scalars/scalars", run=run, tag="loss")
        ]

    wait_for(lambda: len(served("job/mean")) == STEPS, 60, "every step of job/mean")
    values = np.array([[loss(rank, step) for rank in range(WORLD)] for step in range(STEPS)], dtype=np.float64)
    for name, reduce in (("mean", np.mean), ("min", np.min), ("max", np.max)):
        want = [(step, float(np.float32(v))) for step, v in enumerate(reduce(values, axis=1))]
        assert served(f"job/{name}") == want, name
    assert [step for step, _ in served("job/std")] == list(range(STEPS))

    # The dashboard, filtered to the `loss` chart: every run's line in one chart.
    shot = ARTIFACTS / "aggregates-scalars.png"
    profile = Path(tensorboard.log_path.parent) / "chromium-profile"
    screenshot(f"{tensorboard.url}/#scalars&tagFilter=%5Eloss%24", shot, profile)
    print(f"screenshot of the scalars dashboard: {shot}")
