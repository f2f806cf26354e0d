"""Every method of tensorboardX's `SummaryWriter`, called with the same arguments on tensorboardX's writer
(local files) and on the one `patch()` puts in its place (through a real daemon), gives the same TensorBoard data.

As in tests/test_torch_parity.py, both logdirs are read with TensorBoard's own loader and compared event by event
(steps, tags, summary kinds, plugin metadata and payloads, PNG, GIF and WAV bytes); only wall times, file names
and the `file_version` records differ (the README lists these). The projector files are compared byte for byte.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorboardX
import tensorboardX.proto.event_pb2
import tensorboardX.summary
import tensorboardX.writer
import torch

from _parity import Inputs, assert_same_events, describe, figure, runs
from _support import Daemon
from summaryd.client import patch

pytestmark = [
    pytest.mark.no_findings,  # healthy workloads: the watch finds nothing in them
    pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.*"),
    pytest.mark.filterwarnings("ignore::FutureWarning:torch.*"),
]

TheirWriter = tensorboardX.SummaryWriter
SOUNDFILE = importlib.util.find_spec("soundfile") is not None


@pytest.fixture
def patching(monkeypatch: pytest.MonkeyPatch, daemon: Daemon, tmp_path: Path) -> Callable[[], type[Any]]:
    """`patch()` in this process when called (tensorboardX's own writer runs unpatched before), undone at the
    end; the daemon's address in the environment and a working directory of the test's own (the patched writer
    makes the framework's local directory there)."""
    import torch.utils.tensorboard
    import torch.utils.tensorboard.writer

    # patch() replaces torch's writers too (torch is imported here): undone with tensorboardX's, or the later
    # tests' torch writers would be ours.
    for module in (tensorboardX, tensorboardX.writer, torch.utils.tensorboard, torch.utils.tensorboard.writer):
        monkeypatch.setattr(module, "SummaryWriter", module.SummaryWriter)
        monkeypatch.setattr(module, "FileWriter", module.FileWriter)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setenv("SUMMARYD_ADDRESS", daemon.address)

    def patch_now() -> type[Any]:
        work = tmp_path / "work"
        work.mkdir()
        monkeypatch.chdir(work)
        patch()
        assert tensorboardX.SummaryWriter is not TheirWriter
        return tensorboardX.SummaryWriter  # type: ignore[no-any-return]

    return patch_now


def _openvino_model(path: Path) -> str:
    path.write_text(
        '<net name="tiny"><layers><layer id="0" name="x"/><layer id="1" name="matmul"/><layer id="2" name="relu"/>'
        '</layers><edges><edge from-layer="0" to-layer="1"/><edge from-layer="1" to-layer="2"/></edges></net>'
    )
    return str(path)


def exercise(w: Any, x: Inputs, openvino: str, json_path: Path) -> None:
    """Every public method of tensorboardX 2.6's SummaryWriter, with tensorboardX's own arguments."""
    w.add_scalar("scalar/float", 0.5, 1)
    w.add_scalar("scalar/tensor", torch.tensor(2.5), 2, walltime=1_700_000_000.5)
    w.add_scalar("scalar/numpy", np.float32(1.25), 3)
    w.add_scalar("scalar/named", 3.25, 4, display_name="Named", summary_description="a *described* scalar")
    w.add_scalar("scalar with spaces", 1.5, 5)  # tensorboardX cleans the tag
    with w.use_metadata(global_step=42):
        w.add_scalar("metadata/scalar", 7.0)
        w.add_text("metadata/text", "at step 42")
    for step in range(3):
        w.add_scalars("pair/loss", {"train": step * 1.5, "val": torch.tensor(step + 0.25)}, step, walltime=100 + step)
    w.export_scalars_to_json(str(json_path))
    w.add_histogram("histogram/default", x.histogram, 1)
    w.add_histogram("histogram/auto", x.histogram.numpy() * 2, 2, bins="auto")
    w.add_histogram("histogram/max_bins", x.histogram, 3, bins=64, max_bins=10)
    w.add_histogram_raw("histogram/raw", global_step=5, **x.raw_histogram)
    w.add_image("image/chw", x.image_chw, 1)
    w.add_image("image/hwc", x.image_hwc, 2, dataformats="HWC")
    w.add_image("image/hw", x.image_hw, 3, dataformats="HW")
    w.add_images("images/nchw", x.images, 1)
    w.add_images("images/nhwc", x.images_nhwc, 2, dataformats="NHWC")
    w.add_images("images/list", [x.images[i].numpy() for i in range(3)], 3, dataformats="CHW")
    w.add_image_with_boxes("boxes/labelled", x.image_chw, x.boxes, 1, labels=["cat", "dog"])
    w.add_image_with_boxes("boxes/rescaled", x.image_chw, x.boxes, 2, rescale=2, labels="ignored: one label")
    w.add_figure("figure/one", figure(1), 1)
    w.add_figure("figure/list", [figure(2), figure(3)], 2)
    w.add_video("video", x.video, 1, fps=5)
    w.add_video("video/nthwc", x.video.permute(0, 1, 3, 4, 2), 2, dataformats="NTHWC")
    if SOUNDFILE:  # tensorboardX's add_audio needs it (not installed here: see the test below)
        w.add_audio("audio", x.audio, 1, sample_rate=8000)
    w.add_text("text", "hello *world*", 1)
    w.add_graph(x.model, x.model_input)
    w.add_onnx_graph(x.onnx_path)
    w.add_openvino_graph(openvino)
    w.add_embedding(x.embedding, metadata=list("abcdefghi"), label_img=x.embedding_images, global_step=1, tag="e")
    w.add_embedding(x.embedding * 2, global_step=2, tag="plain")
    w.add_pr_curve("pr/curve", x.labels, x.predictions, 1)
    w.add_pr_curve("pr/few_thresholds", x.labels, x.predictions, 2, num_thresholds=10, weights=0.5)
    w.add_pr_curve_raw("pr/raw", *x.raw_curve, global_step=3, num_thresholds=4)
    w.add_custom_scalars({"losses": {"pair": ["Multiline", ["pair/loss"]]}})
    w.add_custom_scalars_multilinechart(["scalar/float", "scalar/numpy"], category="cat", title="lines")
    w.add_custom_scalars_marginchart(["scalar/float", "scalar/numpy", "scalar/tensor"])
    w.add_mesh("mesh", x.mesh_vertices, colors=x.mesh_colors, faces=x.mesh_faces, global_step=1)
    w.add_mesh("mesh/points", x.mesh_vertices, config_dict={"camera": {"cls": "PerspectiveCamera", "fov": 75}})
    w.add_hparams({"lr": 0.1, "batch": 32, "optimizer": "adam", "nesterov": True}, {"hp/accuracy": 0.75}, name="hp")
    w.add_hparams({"lr": 0.2}, {"hp/accuracy": 0.5}, name="hp-2", global_step=7)
    # tensorboardX's own protos, handed to the file writer as its users do (its hparams recipe).
    w.file_writer.add_summary(tensorboardX.summary.scalar("raw/summary", 2.0), 9)
    w.file_writer.add_event(
        tensorboardX.proto.event_pb2.Event(step=10, summary=tensorboardX.summary.text("raw/event", "x"))
    )
    w.flush()


def test_every_public_method_of_tensorboardx_is_there_with_its_parameters_and_defaults() -> None:
    """Names, kinds and defaults of every parameter; `flush` and `close` may take more (a timeout), optional."""
    from summaryd.client._patch import TensorboardXSummaryWriter

    def parameters(function: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]

    public = [n for n, _ in inspect.getmembers(TheirWriter, inspect.isfunction) if not n.startswith("_")]
    assert "export_scalars_to_json" in public and "add_openvino_graph" in public
    for name in [*public, "__init__"]:
        theirs, ours = parameters(getattr(TheirWriter, name)), parameters(getattr(TensorboardXSummaryWriter, name))
        if name in ("flush", "close"):
            assert all(default is not inspect.Parameter.empty for _, _, default in ours[len(theirs) :]), name
            ours = ours[: len(theirs)]
        assert ours == theirs, name


def test_every_method_gives_the_same_tensorboard_data_as_tensorboardx(
    patching: Callable[[], type[Any]], daemon: Daemon, tmp_path: Path
) -> None:
    inputs = Inputs(tmp_path)
    openvino = _openvino_model(tmp_path / "tiny.xml")
    theirs_root = tmp_path / "tensorboardX"
    with TheirWriter(str(theirs_root / "exp"), purge_step=0) as theirs:
        exercise(theirs, inputs, openvino, tmp_path / "theirs.json")
    ours = patching()("exp", purge_step=0)
    assert ours.logdir == ours.get_logdir() == "exp"
    exercise(ours, inputs, openvino, tmp_path / "ours.json")
    report = ours.close(timeout=30)
    assert report.delivered > 0 and report.undelivered == 0
    assert not any(report.dropped.values())

    expected, actual = runs(theirs_root), runs(daemon.logdir)
    assert (
        sorted(actual) == sorted(expected) == ["exp", "exp/hp", "exp/hp-2", "exp/pair/loss/train", "exp/pair/loss/val"]
    )
    assert_same_events(actual, expected)

    main = expected["exp"]
    kinds = {e.WhichOneof("what") for e in main}
    assert kinds == {"session_log", "summary", "graph_def", "tagged_run_metadata"}
    plugins = {v.metadata.plugin_data.plugin_name for e in main for v in e.summary.value}
    assert plugins == {"", "text", "pr_curves", "custom_scalars", "mesh"}
    video = next(v for e in main for v in e.summary.value if v.tag == "video")
    assert video.image.encoded_image_string.startswith(b"GIF8")
    named = next(v for e in main for v in e.summary.value if v.tag == "scalar/named")
    assert (named.metadata.display_name, named.metadata.summary_description) == ("Named", "a *described* scalar")
    assert [e.step for e in main if any(v.tag.startswith("metadata/") for v in e.summary.value)] == [42, 42]

    # export_scalars_to_json: the same values, under the same (local) writer ids.
    their_json = json.loads((tmp_path / "theirs.json").read_text())
    our_json = json.loads((tmp_path / "ours.json").read_text())
    assert (
        {os.path.relpath(k, theirs_root) for k in their_json}
        == set(our_json)
        == {"exp/pair/loss/train", "exp/pair/loss/val"}
    )
    assert {os.path.relpath(k, theirs_root): v for k, v in their_json.items()} == our_json

    for name in (
        "projector_config.pbtxt",
        "00001/e/tensors.tsv",
        "00001/e/metadata.tsv",
        "00001/e/sprite.png",
        "00002/plain/tensors.tsv",
    ):
        their_file, our_file = theirs_root / "exp" / name, daemon.logdir / "exp" / name
        assert our_file.read_bytes() == their_file.read_bytes(), name


def test_write_to_disk_false_ships_nothing_and_creates_nothing(
    patching: Callable[[], type[Any]], daemon: Daemon, tmp_path: Path
) -> None:
    """tensorboardX's way to mute a rank: every call is taken, nothing reaches the daemon or the disk."""
    inputs = Inputs(tmp_path)
    openvino = _openvino_model(tmp_path / "tiny.xml")
    writer = patching()
    before = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")}
    muted = writer("muted", write_to_disk=False)
    exercise(muted, inputs, openvino, tmp_path / "muted.json")
    report = muted.close()
    assert (report.delivered, report.undelivered) == (0, 0)
    after = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")}
    assert after - before == {Path("muted.json")}
    assert not (daemon.logdir / "muted").exists()


def test_a_log_dir_with_a_backslash_is_taken_as_tensorboardx_takes_it(
    patching: Callable[[], type[Any]], daemon: Daemon
) -> None:
    """A Windows-style `logs\\exp` is accepted, as tensorboardX accepts it; its parts become the run path's."""
    with patching()("logs\\exp") as w:
        assert w.logdir == "logs\\exp"
        w.add_scalar("x", 1.0, 1)
    assert [e.step for e in runs(daemon.logdir)["logs/exp"]] == [1]


@pytest.mark.skipif(SOUNDFILE, reason="what happens without soundfile, which tensorboardX's add_audio needs")
def test_add_audio_without_soundfile_logs_a_wav(
    patching: Callable[[], type[Any]], daemon: Daemon, tmp_path: Path
) -> None:
    """tensorboardX's add_audio raises without the soundfile package; the patched writer logs the 16-bit WAV
    torch's would (a difference the README lists), never an error on the training step."""
    inputs = Inputs(tmp_path)
    with TheirWriter(str(tmp_path / "tensorboardX")) as theirs, pytest.raises(ModuleNotFoundError):
        theirs.add_audio("audio", inputs.audio, 1, sample_rate=8000)
    with patching()("sound") as ours:
        ours.add_audio("audio", inputs.audio, 1, sample_rate=8000)
    [event] = [e for e in runs(daemon.logdir)["sound"] if e.HasField("summary")]
    audio = event.summary.value[0].audio
    assert (audio.sample_rate, audio.num_channels, audio.length_frames) == (8000, 1, 800)
    assert audio.encoded_audio_string.startswith(b"RIFF")


def test_tensorboardx_file_writer_gives_the_same_events(
    patching: Callable[[], type[Any]], daemon: Daemon, tmp_path: Path
) -> None:
    """tensorboardX's `FileWriter` API: its protos in, its graph methods, `use_metadata`."""
    from tensorboardX.onnx_graph import load_onnx_graph
    from tensorboardX.openvino_graph import load_openvino_graph
    from torch.utils.tensorboard._pytorch_graph import graph

    inputs = Inputs(tmp_path)
    profile = graph(inputs.model, inputs.model_input)
    onnx_graph, openvino_graph = (
        load_onnx_graph(inputs.onnx_path),
        load_openvino_graph(_openvino_model(tmp_path / "v.xml")),
    )

    def exercise_file_writer(w: Any) -> None:
        w.add_summary(tensorboardX.summary.scalar("x", 1.5), 3)
        w.add_event(tensorboardX.proto.event_pb2.Event(summary=tensorboardX.summary.text("t", "hi")), step=4)
        with w.use_metadata(global_step=8):
            w.add_summary(tensorboardX.summary.scalar("at-eight", 2.0))
        w.add_graph(profile)
        w.add_onnx_graph(onnx_graph)
        w.add_openvino_graph(openvino_graph)
        w.flush()

    theirs = tensorboardX.FileWriter(str(tmp_path / "tensorboardX" / "plain"))
    exercise_file_writer(theirs)
    theirs.close()
    patching()
    ours = tensorboardX.FileWriter("plain")
    exercise_file_writer(ours)
    ours.close(timeout=30)
    expected, actual = runs(tmp_path / "tensorboardX"), runs(daemon.logdir)
    assert [describe(e) for e in actual["plain"]] == [describe(e) for e in expected["plain"]]
    assert actual == expected
