"""TensorBoard reads the daemon: `summaryd serve --board-listen` serves TensorBoard's data provider.

A real daemon on loopback, a real `SummaryWriter`, and either TensorBoard's own gRPC stub of the provider or a
real `tensorboard --grpc_data_provider` (no `--logdir`) whose HTTP API is read back. TensorBoard without
TensorFlow is what runs here, and is all the provider needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from google.protobuf.message import DecodeError
from tensorboard.backend.event_processing import data_provider as tb_data_provider
from tensorboard.backend.event_processing import reservoir as tb_reservoir
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.data.proto import data_provider_pb2 as dp
from tensorboard.data.proto import data_provider_pb2_grpc as dp_grpc

from _credentials import Pki, tls_credentials
from _support import Daemon, TensorBoard, event_files, read_events, start_daemon, stop_process, unused_port, wait_for
from summaryd.cli import main
from summaryd.client import SummaryWriter
from summaryd.server.board.backfill import Backfill, runs_on_disk
from summaryd.server.board.index import BoardIndex, Datum, Reservoir, RunIndex, SamplesPerPlugin, ScalarPoints
from summaryd.server.board.provider import BoardService, downsample, sample_indices
from summaryd.server.config import Config
from summaryd.server.server import ListenError, Server
from summaryd.v1.wire import frame_all

pytestmark = pytest.mark.timeout(180)

# torch is imported here (add_graph, add_mesh), so add_text builds torch's summary, whose tag has its suffix.
NOTE = "note/text_summary"
STEPS = 1500  # above the scalars plugin's 1,000 points: TensorBoard's downsampling shows


def value(step: int) -> float:
    return step / 4  # exact in the float32 of `simple_value`


class Board:
    """A daemon serving the board on a free loopback port, and TensorBoard's stub of it."""

    def __init__(self, tmp_path: Path, *flags: str, logdir: Path | None = None) -> None:
        self.address = f"127.0.0.1:{unused_port()}"
        # The watch (its own tests) writes findings as runs of their own: off, so the runs here are the test's.
        self.daemon: Daemon = start_daemon(
            tmp_path, "--no-watch", "--board-listen", self.address, *flags, logdir=logdir
        )
        self._channel = grpc.insecure_channel(self.address)
        self.stub = dp_grpc.TensorBoardDataProviderStub(self._channel)

    def close(self) -> None:
        self._channel.close()
        self.daemon.stop()

    def scalars(self, run: str, tag: str, num_points: int = 10_000) -> list[tuple[int, float]]:
        answer = self.stub.ReadScalars(
            dp.ReadScalarsRequest(
                plugin_filter=dp.PluginFilter(plugin_name="scalars"),
                run_tag_filter=dp.RunTagFilter(runs=dp.RunFilter(names=[run]), tags=dp.TagFilter(names=[tag])),
                downsample=dp.Downsample(num_points=num_points),
            )
        )
        return [
            (s, v) for entry in answer.runs for t in entry.tags for s, v in zip(t.data.step, t.data.value, strict=True)
        ]


@pytest.fixture
def board(tmp_path: Path) -> Iterator[Board]:
    b = Board(tmp_path)
    try:
        yield b
    finally:
        b.close()


# torch.jit.trace (add_graph) is deprecated in favour of torch.export, and says so (see test_torch_parity).
@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.*")
@pytest.mark.filterwarnings("ignore::FutureWarning:torch.*")
def test_tensorboard_serves_every_dashboards_data_through_the_daemon(board: Board, tmp_path: Path) -> None:
    writer = SummaryWriter("exp", address=board.daemon.address)
    for step in range(STEPS):
        writer.add_scalar("loss", value(step), step)
    writer.add_histogram("weights", np.arange(100, dtype=np.float64), 7)
    image = np.zeros((3, 4, 5), dtype=np.float32)
    image[0] = 1.0  # a red image: 3 channels, 4 high, 5 wide
    writer.add_image("sample", image, 3)
    writer.add_text("note", "hello from summaryd", 2)
    writer.add_audio("clip", np.sin(np.arange(800) / 10.0).astype(np.float32), 4, sample_rate=8000)
    writer.add_pr_curve("pr", np.array([1, 0, 1, 1]), np.array([0.9, 0.2, 0.7, 0.4]), 5)
    writer.add_custom_scalars({"group": {"chart": ["Multiline", ["loss"]]}})
    writer.add_hparams({"lr": 0.1}, {"hparam/acc": 0.5}, run_name="trial")
    writer.add_graph(torch.nn.Linear(3, 2), torch.zeros(1, 3))
    vertices = torch.tensor([[[1.0, 1, 1], [-1, -1, 1], [1, -1, -1], [-1, 1, -1]]])
    faces = torch.tensor([[[0, 2, 3], [0, 3, 1], [0, 1, 2], [1, 3, 2]]], dtype=torch.int32)
    writer.add_mesh("tetrahedron", vertices=vertices, faces=faces, global_step=6)
    assert writer.close().ok

    tb = TensorBoard(["--grpc_data_provider", board.address], tmp_path)
    try:
        assert tb.get("/data/runs") == ["exp", "exp/trial"]
        # The scalars plugin reads 1,000 points of the 1,500: a sample of what was logged, the newest in it.
        served = tb.get("/data/plugin/scalars/scalars", run="exp", tag="loss")
        assert len(served) == 1000
        steps = [step for _, step, _ in served]
        assert steps == sorted(set(steps)) and steps[-1] == STEPS - 1
        assert all(v == value(step) for _, step, v in served)
        # The Time Series dashboard reads the same series (its own plugin's routes).
        assert tb.get("/data/plugin/timeseries/tags")["scalars"]["runTagInfo"]["exp"] == ["loss"]
        form = urllib.parse.urlencode({"requests": json.dumps([{"plugin": "scalars", "tag": "loss"}])}).encode()
        with urllib.request.urlopen(tb.url + "/data/plugin/timeseries/timeSeries", data=form, timeout=30) as answer:
            series = json.loads(answer.read())[0]["runToSeries"]["exp"]
        assert [(p["step"], p["value"]) for p in series] == [(step, v) for _, step, v in served]

        histograms = tb.get("/data/plugin/histograms/histograms", run="exp", tag="weights")
        assert [h[1] for h in histograms] == [7]
        buckets = histograms[0][2]
        assert sum(count for _, _, count in buckets) == 100

        images = tb.get("/data/plugin/images/images", run="exp", tag="sample")
        assert [i["step"] for i in images] == [3]
        png = tb.raw("/data/plugin/images/individualImage?" + images[0]["query"])
        on_disk = [
            v.image.encoded_image_string
            for path in event_files(board.daemon.logdir / "exp")
            for e in read_events(path)
            for v in e.summary.value
            if v.tag == "sample"
        ]
        assert on_disk == [png]

        assert tb.get("/data/plugin/text/tags") == {"exp": [NOTE]}
        text = tb.get("/data/plugin/text/text", run="exp", tag=NOTE)
        assert [t["step"] for t in text] == [2] and "hello from summaryd" in text[0]["text"]

        audio = tb.get("/data/plugin/audio/audio", run="exp", tag="clip")
        assert [a["step"] for a in audio] == [4]
        assert tb.raw("/data/plugin/audio/individualAudio?" + audio[0]["query"])[:4] == b"RIFF"  # a WAV file

        curves = tb.get("/data/plugin/pr_curves/pr_curves", run="exp", tag="pr")["exp"]
        assert [c["step"] for c in curves] == [5] and curves[0]["precision"][0] == 0.75  # 3 of the 4 are positive

        layout = tb.get("/data/plugin/custom_scalars/layout")
        assert layout["category"][0]["chart"][0]["multiline"]["tag"] == ["loss"]

        request = urllib.request.Request(
            tb.url + "/data/plugin/hparams/experiment",
            data=json.dumps({"experimentName": ""}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            experiment = json.loads(answer.read())
        assert [h["name"] for h in experiment["hparamInfos"]] == ["lr"]
        assert [m["name"]["tag"] for m in experiment["metricInfos"]] == ["hparam/acc"]

        assert tb.get("/data/plugin/graphs/info")["exp"]["run_graph"] is True
        assert b'op: "IO Node"' in tb.raw("/data/plugin/graphs/graph", run="exp")  # the graph as pbtxt

        meshes = tb.get("/data/plugin/mesh/meshes", run="exp", tag="tetrahedron", sample="0")
        assert {(m["step"], tuple(m["data_shape"])) for m in meshes} == {(6, (1, 4, 3))}
        query = {"run": "exp", "tag": "tetrahedron", "sample": "0", "step": "6"}
        vertex_bytes = tb.raw("/data/plugin/mesh/data", content_type="VERTEX", **query)
        assert np.frombuffer(vertex_bytes, dtype="<f4").tolist() == vertices.flatten().tolist()

        # Live: a point acknowledged is in TensorBoard's very next answer (a --logdir TensorBoard rereads files
        # every 5 s, the reload interval), in a run TensorBoard has not seen before.
        live = SummaryWriter("live", address=board.daemon.address)
        try:
            live.add_scalar("loss", 2.5, 7)
            assert live.flush(timeout=30).ok
            assert tb.get("/data/plugin/scalars/scalars", run="live", tag="loss")[-1][1:] == [7, 2.5]
        finally:
            live.close()
    finally:
        stop_process(tb.proc, 10)


def test_read_scalars_keeps_the_newest_point_and_honours_num_points(board: Board) -> None:
    writer = SummaryWriter("exp", address=board.daemon.address)
    for step in range(300):
        writer.add_scalar("loss", value(step), step)
    assert writer.close().ok
    assert board.scalars("exp", "loss") == [(s, value(s)) for s in range(300)]
    # TensorBoard reads "the latest value" as a read of one point.
    assert board.scalars("exp", "loss", num_points=1) == [(299, value(299))]
    some = board.scalars("exp", "loss", num_points=20)
    assert len(some) == 20 and some[-1] == (299, value(299))
    assert [s for s, _ in some] == sorted({s for s, _ in some})
    assert board.scalars("exp", "loss", num_points=0) == []


def test_a_point_is_served_as_soon_as_its_batch_is_acknowledged(board: Board) -> None:
    writer = SummaryWriter("exp", address=board.daemon.address)
    try:
        writer.add_scalar("loss", 1.5, 41)
        assert writer.flush(timeout=30).ok  # acknowledged: written, and so in the index, with no file read back
        assert board.scalars("exp", "loss") == [(41, 1.5)]
    finally:
        writer.close()


def test_a_restart_at_a_lower_step_purges_that_series_from_that_step(board: Board) -> None:
    first = SummaryWriter("exp", address=board.daemon.address)
    for step in range(100):
        first.add_scalar("loss", value(step), step)
        first.add_scalar("lr", 1.0, step)
    assert first.close().ok
    resumed = SummaryWriter("exp", address=board.daemon.address)  # resumed from the checkpoint of step 60
    for step in range(60, 80):
        resumed.add_scalar("loss", -value(step), step)
    assert resumed.close().ok
    want = [(s, value(s)) for s in range(60)] + [(s, -value(s)) for s in range(60, 80)]
    assert board.scalars("exp", "loss") == want
    # A series the restart did not log again keeps its points (TensorBoard purges by tag, RustBoard too).
    assert len(board.scalars("exp", "lr")) == 100


def test_a_session_log_start_purges_every_series_of_its_run_from_its_step(board: Board) -> None:
    # torch's `purge_step` writes SessionLog.START at that step. The run's first START is its start: a worker
    # that joins with purge_step=0 takes nothing from the points already there.
    first = SummaryWriter("exp", address=board.daemon.address)
    first.add_scalar("lr", 1.0, 0)
    assert first.close().ok
    writer = SummaryWriter("exp", address=board.daemon.address, purge_step=0)
    for step in range(50):
        writer.add_scalar("loss", value(step), step)
    assert writer.close().ok
    assert board.scalars("exp", "lr") == [(0, 1.0)]
    # A later START is a restart: TensorBoard drops every point of the run from its step on.
    purged = SummaryWriter("exp", address=board.daemon.address, purge_step=30)
    assert purged.close().ok
    assert board.scalars("exp", "loss") == [(s, value(s)) for s in range(30)]
    assert board.scalars("exp", "lr") == [(0, 1.0)]


def board_status(board: Board, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The `board` of `summaryd status --json`."""
    assert main(["status", "--json", "--address", board.daemon.address]) == 0
    found: dict[str, Any] = json.loads(capsys.readouterr().out)["board"]
    return found


def test_runs_already_on_disk_are_served_after_a_restart_and_live_points_follow_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logdir = tmp_path / "runs"
    first = start_daemon(tmp_path, "--no-watch", logdir=logdir)
    try:
        for run in ("a", "b/c"):
            writer = SummaryWriter(run, address=first.address)
            for step in range(40):
                writer.add_scalar("loss", value(step), step)
            assert writer.close().ok
    finally:
        first.stop()

    board = Board(tmp_path, logdir=logdir)
    try:
        wait_for(lambda: len(board.scalars("b/c", "loss")) == 40, 60, "the runs on disk to be read")
        # `summaryd status` shows the board and how far the reading of the runs already there is.
        wait_for(lambda: board_status(board, capsys)["runs_pending"] == 0, 30, "status to count every run read")
        assert board_status(board, capsys) == {
            "address": board.address,
            "runs": 2,
            "runs_pending": 0,
            "segments_pending": 0,
        }
        assert main(["status", "--address", board.daemon.address]) == 0
        assert f"board {board.address} (tensorboard --grpc_data_provider): 2 runs\n" in capsys.readouterr().out
        assert board.scalars("a", "loss") == [(s, value(s)) for s in range(40)]
        writer = SummaryWriter("a", address=board.daemon.address)
        writer.add_scalar("loss", 99.0, 40)
        assert writer.close().ok
        assert board.scalars("a", "loss")[-2:] == [(39, value(39)), (40, 99.0)]
        runs = board.stub.ListRuns(dp.ListRunsRequest())
        assert sorted(r.name for r in runs.runs) == ["a", "b/c"]
    finally:
        board.close()


def test_list_filters_select_runs_tags_and_plugins(board: Board) -> None:
    for run in ("a", "b"):
        writer = SummaryWriter(run, address=board.daemon.address)
        writer.add_scalar("loss", 1.0, 1)
        writer.add_scalar("acc", 0.5, 1)
        writer.add_text("note", "x", 1)
        assert writer.close().ok
    listed = board.stub.ListScalars(
        dp.ListScalarsRequest(
            plugin_filter=dp.PluginFilter(plugin_name="scalars"),
            run_tag_filter=dp.RunTagFilter(runs=dp.RunFilter(names=["b"])),
        )
    )
    assert [(r.run_name, sorted(t.tag_name for t in r.tags)) for r in listed.runs] == [("b", ["acc", "loss"])]
    assert listed.runs[0].tags[0].metadata.max_step == 1
    # Text is a tensor of the text plugin: not a scalar, and not listed under another plugin.
    tensors = board.stub.ListTensors(dp.ListTensorsRequest(plugin_filter=dp.PluginFilter(plugin_name="text")))
    assert [(r.run_name, [t.tag_name for t in r.tags]) for r in tensors.runs] == [("a", [NOTE]), ("b", [NOTE])]
    none = board.stub.ListTensors(dp.ListTensorsRequest(plugin_filter=dp.PluginFilter(plugin_name="scalars")))
    assert not none.runs
    plugins = board.stub.ListPlugins(dp.ListPluginsRequest())
    assert sorted(p.name for p in plugins.plugins) == ["scalars", "text"]


def test_a_listing_kept_for_a_run_is_made_again_when_the_run_changes(board: Board) -> None:
    """Each run's List answer is kept serialized between questions: a new point, a new tag and a restart's
    purge each show in the next answer, and the other runs' answers stay as they were."""

    def listed() -> dict[str, dict[str, int]]:
        answer = board.stub.ListScalars(dp.ListScalarsRequest(plugin_filter=dp.PluginFilter(plugin_name="scalars")))
        return {r.run_name: {t.tag_name: t.metadata.max_step for t in r.tags} for r in answer.runs}

    def log(run: str, *points: tuple[str, int]) -> None:
        writer = SummaryWriter(run, address=board.daemon.address)
        for tag, step in points:
            writer.add_scalar(tag, 1.0, step)
        assert writer.close().ok

    log("a", ("loss", 1))
    log("b", ("loss", 1))
    assert listed() == listed() == {"a": {"loss": 1}, "b": {"loss": 1}}
    log("a", ("loss", 5))
    assert listed() == {"a": {"loss": 5}, "b": {"loss": 1}}
    log("a", ("acc", 2))
    assert listed() == {"a": {"acc": 2, "loss": 5}, "b": {"loss": 1}}
    log("a", ("loss", 3))  # a restart at step 3: steps 3 and later give way
    assert listed() == {"a": {"acc": 2, "loss": 3}, "b": {"loss": 1}}
    plugins = board.stub.ListPlugins(dp.ListPluginsRequest())
    assert [p.name for p in plugins.plugins] == ["scalars"]
    log("b", ("loss", 2))
    writer = SummaryWriter("b", address=board.daemon.address)
    writer.add_text("note", "x", 1)
    assert writer.close().ok
    plugins = board.stub.ListPlugins(dp.ListPluginsRequest())
    assert sorted(p.name for p in plugins.plugins) == ["scalars", "text"]
    assert listed() == {"a": {"acc": 2, "loss": 3}, "b": {"loss": 2}}


def test_samples_per_plugin_bounds_a_series_and_all_keeps_every_point(tmp_path: Path) -> None:
    b = Board(tmp_path, "--samples-per-plugin", "scalars=25")
    try:
        writer = SummaryWriter("exp", address=b.daemon.address)
        for step in range(200):
            writer.add_scalar("loss", value(step), step)
        assert writer.close().ok
        kept = b.scalars("exp", "loss")
        assert len(kept) == 25 and kept[-1] == (199, value(199))
    finally:
        b.close()
    assert SamplesPerPlugin.parse("scalars=all,images=3").capacity("scalars") == 0
    assert SamplesPerPlugin.parse("images=3").capacity("images") == 3
    assert SamplesPerPlugin.parse("").capacity("custom") == 10


def test_a_bad_blob_key_and_a_negative_num_points_are_clear_errors(board: Board) -> None:
    with pytest.raises(grpc.RpcError) as bad_key:
        list(board.stub.ReadBlob(dp.ReadBlobRequest(blob_key="not-a-key")))
    assert bad_key.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as negative:
        board.stub.ReadScalars(dp.ReadScalarsRequest(downsample=dp.Downsample(num_points=-1)))
    assert negative.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "num_points" in (negative.value.details() or "")


def test_the_reservoir_keeps_the_newest_point_and_a_uniform_sample() -> None:
    reservoir = Reservoir(10)
    for step in range(1000):
        reservoir.offer(Datum(step, 0.0, float(step)))
    steps = [d.step for d in reservoir.items]
    assert len(steps) == 10 and steps[-1] == 999 and steps == sorted(steps)
    assert steps[0] < 500  # not simply the last ten
    assert [d.step for d in downsample(reservoir.items, 3)][-1] == 999


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["--board-listen", "0.0.0.0:6106"], "--board-listen 0.0.0.0:6106 reaches beyond this machine"),
        (["--board-listen", "localhost"], "needs HOST:PORT"),
        (["--board-listen", "127.0.0.1:0", "--samples-per-plugin", "scalars=many"], "scalars='many'"),
        (["--board-listen", "127.0.0.1:0", "--samples-per-plugin", "images"], "needs PLUGIN=N or PLUGIN=all"),
        (["--samples-per-plugin", "images=3"], "settings of --board-listen: give it too"),
        (["--board-runs", "team-a"], "settings of --board-listen: give it too"),
        (["--board-readers", "2"], "settings of --board-listen: give it too"),
        (["--board-listen", "127.0.0.1:0", "--board-readers", "-1"], "--board-readers -1: give 0 (one a core)"),
    ],
)
def test_a_bad_board_setting_is_one_usage_line(
    flags: list[str], reason: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--logdir", str(tmp_path / "runs"), *flags])
    assert exited.value.code == 2
    assert reason in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_board_runs_serves_only_the_runs_under_its_prefix(tmp_path: Path) -> None:
    b = Board(tmp_path, "--board-runs", "team-a")
    try:
        for run in ("team-a/exp", "team-b/exp", "team-ab"):
            writer = SummaryWriter(run, address=b.daemon.address)
            writer.add_scalar("loss", 1.0, 1)
            assert writer.close().ok
        assert [r.name for r in b.stub.ListRuns(dp.ListRunsRequest()).runs] == ["team-a/exp"]
        assert b.scalars("team-b/exp", "loss") == []
        assert b.scalars("team-a/exp", "loss") == [(1, 1.0)]
    finally:
        b.close()


def test_scalar_columns_sample_and_purge_exactly_as_a_list_of_points() -> None:
    columns, points = Reservoir(50, ScalarPoints()), Reservoir(50)
    offered = [*range(400), *range(300, 350), *range(200, 260)]  # two restarts, at steps 300 and 200
    for i, step in enumerate(offered):
        wall_time = 1.0e9 + (i * 7919) % 1000  # not in order: the largest one is sometimes evicted
        for reservoir in (columns, points):
            reservoir.offer(Datum(step, wall_time, step / 8))
        assert isinstance(columns.items, ScalarPoints)
        assert columns.items.max_wall_time() == max(d.wall_time for d in points.items)
    assert list(columns.items) == list(points.items)
    assert len(points.items) == 50 and points.items[-1].step == 259
    assert all(d.step < 260 for d in points.items)
    for k in (0, 1, 7, 50, 80):
        steps, wall_times, values = columns.items.columns(sample_indices(50, k))
        assert list(zip(steps, wall_times, values, strict=True)) == [
            (d.step, d.wall_time, d.value) for d in downsample(points.items, k)
        ]


async def test_a_board_port_in_use_stops_start_up_before_anything_is_made(tmp_path: Path) -> None:
    logdir = tmp_path / "runs"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = Server(Config(logdir=str(logdir), listen="127.0.0.1:0", board_listen=f"127.0.0.1:{port}"))
        with pytest.raises(ListenError, match="choose another --board-listen"):
            await server.serve()
    assert not logdir.exists()
    assert server.port is not None
    with socket.socket() as probe:  # the gRPC port it had bound is free again
        probe.bind(("127.0.0.1", server.port))


def test_a_run_on_disk_being_written_to_or_asked_for_is_read_before_the_others() -> None:
    index = BoardIndex()
    backfill = Backfill(index, {"a": [], "b": [], "c": [], "d": []})  # not started: only its choice is asked here
    assert backfill.next_run({"a": [], "b": [], "c": [], "d": []}) == "a"
    # TensorBoard asks for run d by name (a dashboard open on it): d is read next.
    request = dp.ListScalarsRequest(run_tag_filter=dp.RunTagFilter(runs=dp.RunFilter(names=["d"])))
    asyncio.run(BoardService(index, "").ListScalars(request, None))
    assert backfill.next_run({"a": [], "b": [], "c": [], "d": []}) == "d"
    index.written("c", "", [])  # a live batch of run c waits until c's older files are read: before all
    assert index.awaited() == ["c"]
    assert backfill.next_run({"a": [], "b": [], "c": [], "d": []}) == "c"
    index.backfilled("c", RunIndex(index.samples), {})
    index.backfilled("d", RunIndex(index.samples), {})
    assert index.awaited() == [] and index.wanted() == []
    assert backfill.next_run({"a": [], "b": []}) == "a"


def test_a_run_starts_at_its_first_files_first_record_as_tensorboard_dates_it(board: Board) -> None:
    writer = SummaryWriter("exp", address=board.daemon.address)
    writer.add_scalar("loss", 1.0, 1, walltime=1_000_000.0)  # a point's own time is not the run's start
    assert writer.close().ok
    (path,) = event_files(board.daemon.logdir / "exp")
    header = read_events(path)[0]
    assert header.HasField("file_version")
    (run,) = board.stub.ListRuns(dp.ListRunsRequest()).runs
    assert run.start_time == header.wall_time


@pytest.mark.parametrize("capacity", [1, 10, 1000])
def test_a_series_keeps_the_very_sample_tensorboards_reservoir_keeps_through_restarts(capacity: int) -> None:
    # TensorBoard's own reservoir (the Python loader's) over the same stream, its restart purge as the loader
    # makes it: `FilterItems` keeping the steps below the restart's.
    theirs = tb_reservoir.Reservoir(capacity, seed=0, always_keep_last=True)
    ours = Reservoir(capacity, ScalarPoints())
    stream = [*range(0, 3000), *range(1800, 2500), *range(40, 5000, 3)]  # restarts at steps 1800 and 40
    last = -1
    for step in stream:
        if step <= last:
            theirs.FilterItems(lambda item, below=step: item < below)
            ours.purge(step)
        theirs.AddItem("loss", step)
        ours.offer(Datum(step, 0.0, float(step)))
        last = step
    assert [d.step for d in ours.items] == theirs.Items("loss")
    assert ours.items[-1].step == stream[-1]


def test_num_points_picks_the_points_tensorboards_own_provider_picks() -> None:
    for n in (0, 1, 2, 10, 999, 1000, 1001, 5000):
        points = list(range(n))
        for k in (0, 1, 2, 10, 1000, 6000):
            assert [points[i] for i in sample_indices(n, k)] == tb_data_provider._downsample(points, k), (n, k)


def test_the_board_serves_tls_with_the_daemons_certificate_as_tensorboards_ssl_credentials_read_it(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    board_address = f"127.0.0.1:{unused_port()}"
    # Clients of --listen must present a certificate; TensorBoard presents none, and the board asks for none.
    daemon = start_daemon(
        tmp_path,
        *("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-client-ca", str(pki.ca)),
        *("--board-listen", board_address),
        credentials=tls_credentials(pki, client_cert=True),
    )
    try:
        monkeypatch.setenv("SUMMARYD_TLS_CA", str(pki.ca))
        monkeypatch.setenv("SUMMARYD_TLS_CERT", str(pki.client_cert))
        monkeypatch.setenv("SUMMARYD_TLS_KEY", str(pki.client_key))
        with SummaryWriter("exp", address=daemon.address) as writer:
            writer.add_scalar("loss", 1.5, 3)
        assert writer.close().ok
        # TensorBoard's `--grpc_creds_type ssl_dev`: TLS, the roots from GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, the
        # certificate checked for the name localhost. `ssl` (the system's roots) is the same for a public CA's.
        monkeypatch.setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", str(pki.ca))
        (tmp_path / "tls").mkdir()
        tb = TensorBoard(["--grpc_data_provider", board_address, "--grpc_creds_type", "ssl_dev"], tmp_path / "tls")
        try:
            assert [p[1:] for p in tb.get("/data/plugin/scalars/scalars", run="exp", tag="loss")] == [[3, 1.5]]
        finally:
            stop_process(tb.proc, 10)
        # Not in plain text: TensorBoard's default credentials (`local`) get no answer.
        (tmp_path / "plain").mkdir()
        plain = TensorBoard(["--grpc_data_provider", board_address], tmp_path / "plain")
        try:
            with pytest.raises(urllib.error.HTTPError):
                plain.get("/data/runs")
        finally:
            stop_process(plain.proc, 10)
    finally:
        daemon.stop()
    # Beyond loopback the board needs TLS (or --insecure), as --listen does.
    Config.from_options(logdir=str(tmp_path / "runs"), board_listen="0.0.0.0:6106", tls_cert="c.pem", tls_key="k.pem")
    with pytest.raises(ValueError, match="over TLS"):
        Config(logdir=str(tmp_path / "runs"), listen="127.0.0.1:0", board_listen="0.0.0.0:6106")


def _stream(seed: int) -> list[bytes]:
    """Events of three scalar tags with restarts, `SessionLog.START`s and a record that is no event."""
    rng = random.Random(seed)
    print(f"seed {seed}")
    records = [Event(wall_time=1e9, file_version="brain.Event:2").SerializeToString()]
    step = 0
    for _ in range(6000):
        step += 1
        if rng.random() < 0.002:
            step = max(0, step - rng.randrange(500))
        if rng.random() < 0.001:
            records.append(Event(step=step, session_log=SessionLog(status=SessionLog.START)).SerializeToString())
        for t in range(3):
            summary = Summary(value=[Summary.Value(tag=f"t{t}", simple_value=step / 4 + t)])
            records.append(Event(wall_time=1e9 + step, step=step, summary=summary).SerializeToString())
        if rng.random() < 0.001:
            records.append(b"\xff\xff not an event")
    return records


@pytest.mark.parametrize("capacity", [0, 7, 1000])
def test_records_read_in_bulk_keep_the_very_sample_events_one_at_a_time_keep(capacity: int) -> None:
    samples = SamplesPerPlugin({"scalars": capacity})
    records = _stream(capacity)
    one_at_a_time, bulk = RunIndex(samples), RunIndex(samples)
    for record in records:
        with contextlib.suppress(DecodeError):
            one_at_a_time.add_event(Event.FromString(record))
    bulk.add_records(records)
    assert sorted(bulk.series) == ["t0", "t1", "t2"]
    for tag, series in one_at_a_time.series.items():
        assert list(bulk.series[tag].reservoir.items) == list(series.reservoir.items), tag
        assert bulk.series[tag].reservoir.seen == series.reservoir.seen


def test_a_restarted_board_takes_its_saved_index_up_and_reads_only_what_the_files_gained(tmp_path: Path) -> None:
    logdir = tmp_path / "runs"
    first = Board(tmp_path, logdir=logdir)
    try:
        for run in ("a", "b/c"):
            writer = SummaryWriter(run, address=first.daemon.address)
            for step in range(40):
                writer.add_scalar("loss", value(step), step)
            writer.add_image("picture", np.zeros((3, 4, 4), dtype=np.uint8), 0)
            assert writer.close().ok
    finally:
        first.close()
    assert "saved 2 runs' samples" in first.daemon.log()
    # Meanwhile a daemon without a board logs more to run a (a new file the saved index does not know).
    plain = start_daemon(tmp_path, "--no-watch", logdir=logdir)
    try:
        writer = SummaryWriter("a", address=plain.address)
        for step in range(40, 50):
            writer.add_scalar("loss", value(step), step)
        assert writer.close().ok
    finally:
        plain.stop()

    def served(board: Board) -> None:
        wait_for(lambda: board.daemon.log().count("runs already on disk") == 1, 60, "the runs on disk to be read")
        assert board.scalars("a", "loss") == [(s, value(s)) for s in range(50)]
        assert board.scalars("b/c", "loss") == [(s, value(s)) for s in range(40)]
        blobs = board.stub.ListBlobSequences(
            dp.ListBlobSequencesRequest(plugin_filter=dp.PluginFilter(plugin_name="images"))
        )
        assert sorted((r.run_name, t.tag_name) for r in blobs.runs for t in r.tags) == [
            ("a", "picture"),
            ("b/c", "picture"),
        ]

    again = Board(tmp_path, logdir=logdir)
    try:
        served(again)
        assert "read 2 runs already on disk (2 taken up from the saved index)" in again.daemon.log()
    finally:
        again.close()
    # A damaged saved index is kept aside and every run is read from its files: the same answers.
    saved = logdir / ".summaryd" / "board-index"
    data = bytearray(saved.read_bytes())
    data[len(data) // 2] ^= 0xFF
    saved.write_bytes(bytes(data))
    damaged = Board(tmp_path, logdir=logdir)
    try:
        served(damaged)
        assert "(0 taken up from the saved index)" in damaged.daemon.log()
        assert "is damaged" in damaged.daemon.log()
        assert list((logdir / ".summaryd").glob("damaged-*-board-index"))
    finally:
        damaged.close()


def _backfilled(logdir: Path, samples: SamplesPerPlugin, readers: int) -> BoardIndex:
    """An index of the runs in `logdir`, read by a `Backfill` of `readers` (processes whatever the size)."""
    index = BoardIndex(samples)
    backfill = Backfill(index, runs_on_disk(str(logdir)), readers=readers, parallel_bytes=0)
    backfill.start()
    try:
        wait_for(lambda: index.pending_runs == 0, 120, "every run to be read")
    finally:
        backfill.stop()
    return index


def test_runs_read_in_processes_are_indexed_exactly_as_one_thread_reads_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`--board-readers`: the runs on disk read in reading processes give the very index the daemon's thread
    gives (the same series, samples, draws and offsets), torn and corrupt records included."""
    logdir = tmp_path / "runs"
    for number in range(5):
        run = logdir / f"run-{number}"
        run.mkdir(parents=True)
        for part in range(2):
            data = frame_all(_stream(number * 10 + part))
            torn = data[: len(data) - 7] if part == 1 else data  # the last file is cut amid its last record
            (run / f"events.out.tfevents.{1000 + part}.host").write_bytes(torn)
    samples = SamplesPerPlugin({"scalars": 50})
    one = _backfilled(logdir, samples, readers=1)
    caplog.set_level("INFO", logger="summaryd.server.board")
    several = _backfilled(logdir, samples, readers=2)
    assert "in 2 processes" in caplog.text
    on_disk = runs_on_disk(str(logdir))
    assert sorted((n, m) for n, _, m in several.marked(on_disk)) == sorted((n, m) for n, _, m in one.marked(on_disk))
    runs = dict(several.snapshot())
    for name, run in one.snapshot():
        assert sorted(runs[name].series) == sorted(run.series), name
        for tag, series in run.series.items():
            theirs = runs[name].series[tag].reservoir
            assert (list(theirs.items), theirs.seen) == (list(series.reservoir.items), series.reservoir.seen), tag


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, ended and not yet reaped, does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_reading_processes_end_with_a_daemon_killed_while_they_read(tmp_path: Path) -> None:
    """A daemon SIGKILLed while its reading processes read leaves none behind, even one stuck in a read (a
    FIFO stands in for a disk that hangs: the process opening it waits for ever)."""
    logdir = tmp_path / "runs"
    for run in ("stuck", "also-stuck"):
        (logdir / run).mkdir(parents=True)
        os.mkfifo(logdir / run / "events.out.tfevents.1.host")
    script = f"""
import multiprocessing, time
from summaryd.server.board.backfill import Backfill, runs_on_disk
from summaryd.server.board.index import BoardIndex
backfill = Backfill(BoardIndex(), runs_on_disk({str(logdir)!r}), readers=2, parallel_bytes=0)
backfill.start()
while len(multiprocessing.active_children()) < 2:
    time.sleep(0.05)
print(" ".join(str(p.pid) for p in multiprocessing.active_children()), flush=True)
time.sleep(600)
"""
    daemon = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    readers: list[int] = []
    try:
        assert daemon.stdout is not None
        readers = [int(pid) for pid in daemon.stdout.readline().split()]
        assert len(readers) == 2 and all(map(_alive, readers))
        daemon.kill()
        daemon.wait(10)
        wait_for(lambda: not any(map(_alive, readers)), 10, "the reading processes to end")
    finally:
        for pid in [daemon.pid, *readers]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        daemon.wait(10)
        if daemon.stdout is not None:
            daemon.stdout.close()
