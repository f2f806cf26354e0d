"""What the parity tests share: the same inputs for torch's (or tensorboardX's) writer and ours, every public
method of torch's `SummaryWriter` called on either, each run of a logdir read back with TensorBoard's own loader
(without wall times and `file_version` records), and the comparison of two logdirs event by event."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from matplotlib.figure import Figure
from onnx import TensorProto, helper
from tensorboard.compat.proto.event_pb2 import Event

from _support import event_files, read_events


def figure(seed: int) -> Figure:
    figure = Figure(figsize=(2, 1.5), dpi=40)
    figure.add_subplot().plot(np.random.default_rng(seed).normal(size=20))
    return figure


def _onnx_model(path: Path) -> str:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4, 3], np.ones(12, dtype=np.float32).tolist())
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    onnx.save(helper.make_model(helper.make_graph(nodes, "tiny", [x], [y], [weight])), str(path))
    return str(path)


class Inputs:
    """The arguments of every call, made once, so both writers get the very same objects' values."""

    def __init__(self, tmp_path: Path) -> None:
        rng = np.random.default_rng(4)
        torch.manual_seed(4)
        self.image_chw = torch.rand(3, 24, 32)
        self.image_hwc = rng.integers(0, 256, (16, 12, 3), dtype=np.uint8)
        self.image_hw = rng.random((10, 14))
        self.images = torch.rand(5, 3, 8, 8)
        self.images_nhwc = rng.integers(0, 256, (3, 6, 6, 1), dtype=np.uint8)
        self.boxes = torch.tensor([[2.0, 2.0, 14.0, 12.0], [10.0, 8.0, 30.0, 22.0]])
        self.video = torch.rand(3, 4, 3, 8, 8)
        self.audio = torch.sin(torch.arange(800) / 10.0).unsqueeze(0) * 0.8
        self.histogram = torch.randn(1000)
        self.histogram_bf16 = torch.randn(200).to(torch.bfloat16)
        self.labels = torch.from_numpy(rng.integers(0, 2, 100))
        self.predictions = torch.from_numpy(rng.random(100))
        self.mesh_vertices = torch.tensor([[[1.0, 1, 1], [-1, -1, 1], [1, -1, -1], [-1, 1, -1]]])
        self.mesh_colors = torch.tensor([[[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 0, 255]]], dtype=torch.int)
        self.mesh_faces = torch.tensor([[[0, 2, 3], [0, 3, 1], [0, 1, 2], [1, 3, 2]]], dtype=torch.int)
        self.embedding = torch.randn(9, 5)
        self.embedding_images = torch.rand(9, 3, 4, 4)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        self.model_input = torch.randn(1, 4)
        self.onnx_path = _onnx_model(tmp_path / "tiny.onnx")
        values = np.repeat(np.arange(10) + 0.5, np.arange(10))
        counts, limits = np.histogram(values, bins=np.arange(11))
        self.raw_histogram = {
            "min": values.min(),
            "max": values.max(),
            "num": len(values),
            "sum": values.sum(),
            "sum_squares": values.dot(values),
            "bucket_limits": limits[1:].tolist(),
            "bucket_counts": counts.tolist(),
        }
        tp = np.array([10.0, 8, 5, 1]), np.array([9.0, 4, 2, 0])
        self.raw_curve = (tp[0], tp[1], 9 - tp[1], 10 - tp[0], tp[0] / np.maximum(tp[0] + tp[1], 1), tp[0] / 10)


def exercise(w: Any, x: Inputs, *, tensor_hparams: bool = True) -> None:
    """Every public method of torch's SummaryWriter, on either writer (hyperparameters given as tensors only
    with `tensor_hparams`: a process without torch has none)."""
    w.add_scalar("scalar/float", 0.5, 1)
    w.add_scalar("scalar/tensor", torch.tensor(2.5), 2, walltime=1_700_000_000.5)
    w.add_scalar("scalar/numpy", np.float32(1.25), 3)
    w.add_scalar("scalar/new_style", 3.25, 4, new_style=True)
    w.add_scalar("scalar/double", 1 / 3, 5, new_style=True, double_precision=True)
    for step in range(3):
        w.add_scalars("pair/loss", {"train": step * 1.5, "val": torch.tensor(step + 0.25)}, step)
    w.add_tensor("tensor/float", torch.arange(6, dtype=torch.float32).reshape(2, 3), 1)
    w.add_tensor("tensor/int64", torch.tensor([[1, -2], [3, 4]]), 2)
    w.add_tensor("tensor/half", torch.tensor([0.5, 1.5], dtype=torch.float16), 3)
    w.add_tensor("tensor/bool", torch.tensor([True, False]), 4)
    w.add_histogram("histogram/default", x.histogram, 1)
    w.add_histogram("histogram/auto", x.histogram.numpy() * 2, 2, bins="auto")
    w.add_histogram("histogram/max_bins", x.histogram, 3, bins=64, max_bins=10)
    w.add_histogram("histogram/bfloat16", x.histogram_bf16, 4)
    w.add_histogram_raw("histogram/raw", global_step=5, **x.raw_histogram)
    w.add_image("image/chw", x.image_chw, 1)
    w.add_image("image/hwc", x.image_hwc, 2, dataformats="HWC")
    w.add_image("image/hw", x.image_hw, 3, dataformats="HW")
    w.add_images("images/nchw", x.images, 1)
    w.add_images("images/nhwc", x.images_nhwc, 2, dataformats="NHWC")
    w.add_image_with_boxes("boxes/labelled", x.image_chw, x.boxes, 1, labels=["cat", "dog"])
    w.add_image_with_boxes("boxes/rescaled", x.image_chw, x.boxes, 2, rescale=2, labels="ignored: one label")
    w.add_figure("figure/one", figure(1), 1)
    w.add_figure("figure/list", [figure(2), figure(3)], 2)
    w.add_video("video", x.video, 1, fps=5)
    w.add_audio("audio", x.audio, 1, sample_rate=8000)
    w.add_text("text", "hello *world*", 1)
    w.add_text("text", "second", 2)
    w.add_graph(x.model, x.model_input)
    w.add_onnx_graph(x.onnx_path)
    w.add_embedding(x.embedding, metadata=list("abcdefghi"), label_img=x.embedding_images, global_step=1, tag="e")
    w.add_pr_curve("pr/curve", x.labels, x.predictions, 1)
    w.add_pr_curve("pr/few_thresholds", x.labels, x.predictions, 2, num_thresholds=10, weights=0.5)
    w.add_pr_curve_raw("pr/raw", *x.raw_curve, global_step=3, num_thresholds=4)
    w.add_custom_scalars({"losses": {"pair": ["Multiline", ["pair/loss"]]}})
    w.add_custom_scalars_multilinechart(["scalar/float", "scalar/numpy"], category="cat", title="lines")
    w.add_custom_scalars_marginchart(["scalar/float", "scalar/numpy", "scalar/tensor"])
    w.add_mesh("mesh", x.mesh_vertices, colors=x.mesh_colors, faces=x.mesh_faces, global_step=1)
    w.add_mesh("mesh/points", x.mesh_vertices, config_dict={"camera": {"cls": "PerspectiveCamera", "fov": 75}})
    w.add_hparams(
        {"lr": 0.1, "batch": 32, "optimizer": "adam", "nesterov": True, "none": None}
        | ({"dropout": torch.tensor([0.25])} if tensor_hparams else {}),
        {"hparam/accuracy": 0.75, "hparam/loss": torch.tensor(0.5) if tensor_hparams else 0.5},
        hparam_domain_discrete={"optimizer": ["adam", "sgd"], "batch": [16, 32]},
        run_name="hp",
        global_step=7,
    )
    w.add_hparams({"lr": 0.2}, {"hparam/accuracy": 0.5}, run_name="hp-2")


def runs(root: Path) -> dict[str, list[Event]]:
    """Every run under `root` (a directory holding event files), its events in order, without wall times and
    without `file_version` records."""
    found: dict[str, list[Event]] = {}
    for directory in sorted({p.parent for p in root.rglob("*tfevents*")}):
        events = []
        for path in event_files(directory):
            for event in read_events(path):
                if event.HasField("file_version"):
                    continue
                event.wall_time = 0
                events.append(event)
        found[directory.relative_to(root).as_posix()] = events
    return found


def describe(event: Event) -> str:
    kind = event.WhichOneof("what")
    if kind == "summary":
        parts = [f"{v.tag}:{v.WhichOneof('value')}:{v.metadata.plugin_data.plugin_name}" for v in event.summary.value]
        return f"step {event.step} summary {' '.join(parts)}"
    return f"step {event.step} {kind}"


def assert_same_events(actual: dict[str, list[Event]], expected: dict[str, list[Event]]) -> None:
    """Every run of `expected` has the same events in `actual`, in the same order: first as a list of what each
    is (so that a failure shows where the two part), then each whole."""
    for run, events in expected.items():
        assert [describe(e) for e in actual[run]] == [describe(e) for e in events], run
        for ours_event, their_event in zip(actual[run], events, strict=True):
            assert ours_event == their_event, f"{run}: {describe(their_event)} differs"
