"""TensorBoard's dashboards drawn from the daemon's data provider: headless Chromium screenshots of the scalars,
images and histograms dashboards of a `tensorboard --grpc_data_provider` (no logdir), kept as artifacts.

Slow tier: it starts TensorBoard and Chromium (Debian's `chromium` package). The screenshots go to
`$SUMMARYD_ARTIFACTS_DIR` (default `artifacts/` at the repository root) as `board-scalars.png`,
`board-images.png` and `board-histograms.png`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from _support import ARTIFACTS, TensorBoard, screenshot, start_daemon, stop_process, unused_port
from summaryd.client import SummaryWriter

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS = 300


def test_the_scalars_images_and_histograms_dashboards_draw_from_the_board(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    print("seed 7")
    board_address = f"127.0.0.1:{unused_port()}"
    daemon = start_daemon(tmp_path, "--board-listen", board_address)
    try:
        for run, rate in (("baseline", 60.0), ("tuned", 30.0)):
            with SummaryWriter(run, address=daemon.address) as writer:
                for step in range(STEPS):
                    writer.add_scalar("loss", float(2.0 * np.exp(-step / rate) + 0.05 * rng.normal()), step)
                    writer.add_scalar("accuracy", float(1.0 - np.exp(-step / rate)), step)
                for step in range(0, STEPS, 30):
                    writer.add_histogram("weights", rng.normal(step / 100, 1.0, 2000), step)
                    # A gradient that brightens with the step: each image differs from the one before.
                    ramp = np.linspace(0.0, 1.0, 64, dtype=np.float32)
                    image = np.stack(
                        [np.outer(ramp, ramp) * step / STEPS, np.outer(ramp, 1 - ramp), np.outer(1 - ramp, ramp)]
                    )
                    writer.add_image("samples", image, step)
            assert writer.close().ok

        (tmp_path / "tb").mkdir()
        tb = TensorBoard(["--grpc_data_provider", board_address], tmp_path / "tb")
        try:
            assert sorted(tb.get("/data/runs")) == ["baseline", "tuned"]
            assert len(tb.get("/data/plugin/scalars/scalars", run="tuned", tag="loss")) == STEPS
            assert [i["step"] for i in tb.get("/data/plugin/images/images", run="tuned", tag="samples")] == list(
                range(0, STEPS, 30)
            )
            assert len(tb.get("/data/plugin/histograms/histograms", run="tuned", tag="weights")) == STEPS // 30
            profile = tmp_path / "chromium-profile"
            for dashboard in ("scalars", "images", "histograms"):
                shot = ARTIFACTS / f"board-{dashboard}.png"
                screenshot(f"{tb.url}/#{dashboard}", shot, profile)
                print(f"screenshot of the {dashboard} dashboard through the board: {shot}")
        finally:
            stop_process(tb.proc, 10)
    finally:
        daemon.stop()
