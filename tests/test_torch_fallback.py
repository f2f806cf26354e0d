"""Without torch: `import summaryd.client` and logging never import it, and the fallback builders (the
`tensorboard` package's) give TensorBoard the same picture, with payloads that differ from torch's exactly where
the README says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util.tensor_util import make_ndarray
from torch.utils.tensorboard import SummaryWriter as TorchSummaryWriter

from _parity import Inputs, describe, exercise, runs
from _support import Daemon
from summaryd.client import SummaryWriter
from summaryd.client._api import _torch

pytestmark = [
    # torch.jit.trace (add_graph, in `exercise`) warns that it is deprecated; see test_torch_parity.
    pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.*"),
    pytest.mark.filterwarnings("ignore::FutureWarning:torch.*"),
]

# The README's list ("Without torch"): the tags whose payload differs from torch's, by run.
DIFFERENT = {
    "exp": {
        "scalar/new_style",  # scalar_pb: a shaped float32 tensor
        "scalar/double",
        "tensor/float",  # make_tensor_proto: packed tensor_content instead of typed value lists
        "tensor/int64",
        "tensor/half",
        "histogram/default",  # histogram_pb: a tensor histogram, not torch's legacy HistogramProto
        "histogram/auto",
        "histogram/max_bins",
        "histogram/bfloat16",
        "video",  # Pillow's GIF, not moviepy's
        "text/text_summary",  # text_pb: the tag as given, no `/text_summary` suffix
        "pr/curve",  # packed tensor_content
        "pr/few_thresholds",
        "pr/raw",
        "mesh_VERTEX",  # mesh_pb's dtypes: float32 vertices, int32 faces, uint8 colours
        "mesh/points_VERTEX",
    },
    # hparams_pb/hparams_config_pb: a start time, a session group name, no type without a discrete domain.
    "exp/hp": {"_hparams_/experiment", "_hparams_/session_start_info"},
    "exp/hp-2": {"_hparams_/experiment", "_hparams_/session_start_info"},
    "exp/pair_loss_train": set(),
    "exp/pair_loss_val": set(),
}


def test_the_fallback_differs_from_torch_only_where_the_readme_says(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same calls as the parity test, with the fallback builders forced (the process has torch, the
    builders act as if it had not); every other event is equal to torch's, byte for byte."""
    inputs = Inputs(tmp_path)
    with TorchSummaryWriter(str(tmp_path / "torch" / "exp"), purge_step=0) as theirs:
        exercise(theirs, inputs, tensor_hparams=False)
    monkeypatch.setattr(_torch, "builders", lambda: None)
    with SummaryWriter("exp", address=daemon.address, worker="", purge_step=0) as ours:
        exercise(ours, inputs, tensor_hparams=False)

    expected, actual = runs(tmp_path / "torch"), runs(daemon.logdir)
    assert sorted(actual) == sorted(expected) == sorted(DIFFERENT)
    for run, events in expected.items():
        assert len(actual[run]) == len(events), run
        different = set()
        for ours_event, torch_event in zip(actual[run], events, strict=True):
            assert ours_event.step == torch_event.step
            if ours_event != torch_event:
                different.add(torch_event.summary.value[0].tag)
                assert len(ours_event.summary.value) == len(torch_event.summary.value), describe(torch_event)
        assert different == DIFFERENT[run], run

    # TensorBoard sorts every fallback payload into the plugin torch's lands in.
    multiplexer = EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(daemon.logdir))
    multiplexer.Reload()
    reference = EventMultiplexer()
    reference.AddRunsFromDirectory(str(tmp_path / "torch"))
    reference.Reload()
    for plugin in ("scalars", "histograms", "images", "audio", "pr_curves", "custom_scalars", "mesh", "hparams"):
        ours_tags = {run: sorted(tags) for run, tags in multiplexer.PluginRunToTagToContent(plugin).items()}
        torch_tags = {run: sorted(tags) for run, tags in reference.PluginRunToTagToContent(plugin).items()}
        assert ours_tags == torch_tags and ours_tags, plugin
    assert list(multiplexer.PluginRunToTagToContent("text")["exp"]) == ["text"]


NO_TORCH = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import summaryd.client
    imported_by_package = "torch" in sys.modules
    from matplotlib.figure import Figure
    from summaryd.client import SummaryWriter

    rng = np.random.default_rng(0)
    figure = Figure(figsize=(2, 1), dpi=30)
    figure.add_subplot().plot([1, 3, 2])
    vertices = np.array([[[1.0, 1, 1], [-1, -1, 1], [1, -1, -1], [-1, 1, -1]]])
    with SummaryWriter("plain", address=sys.argv[1], worker="") as w:
        w.add_scalar("loss", np.float32(0.5), 1)
        w.add_scalar("loss/double", 1 / 3, 1, new_style=True, double_precision=True)
        w.add_scalars("pair", {"a": 1, "b": 2.5}, 1)
        w.add_tensor("tensor", np.arange(6).reshape(2, 3), 1)
        w.add_histogram("hist", rng.normal(size=1000), 1)
        w.add_histogram_raw("hist/raw", 0, 2, 3, 3, 5, [1, 2], [1, 2], 1)
        w.add_image("image", rng.random((3, 8, 10)), 1)
        w.add_images("images", rng.random((4, 3, 8, 8)), 1)
        w.add_image_with_boxes("boxes", rng.random((3, 32, 32)), np.array([[1, 1, 10, 10]]), 1, labels=["a"])
        w.add_figure("figure", figure, 1)
        w.add_video("video", rng.random((2, 3, 3, 8, 8)), 1)
        w.add_audio("audio", np.sin(np.arange(800) / 10)[None], 1, sample_rate=8000)
        w.add_text("text", "hello", 1)
        w.add_pr_curve("pr", rng.integers(0, 2, 100), rng.random(100), 1)
        w.add_pr_curve_raw("pr/raw", *np.ones((6, 3)), 1, num_thresholds=3)
        w.add_custom_scalars_multilinechart(["loss", "pair"])
        w.add_mesh("mesh", vertices, colors=np.full_like(vertices, 200), faces=np.array([[[0, 1, 2]]]))
        w.add_hparams({"lr": 0.1, "optimizer": "adam"}, {"hparam/accuracy": 0.9}, run_name="hp")
        report = w.close()
    print(json.dumps({"imported_by_package": imported_by_package, "imported": "torch" in sys.modules,
                      "ok": report.ok, "delivered": report.delivered}))
    """
)


def test_without_torch_nothing_imports_it_and_tensorboard_reads_every_kind(daemon: Daemon, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH, daemon.address],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MPLBACKEND": "Agg"},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"imported_by_package": False, "imported": False, "ok": True, "delivered": 22}

    multiplexer = EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(daemon.logdir))
    multiplexer.Reload()
    assert sorted(multiplexer.Runs()) == ["plain", "plain/hp", "plain/pair_a", "plain/pair_b"]
    tags = {
        plugin: sorted(multiplexer.PluginRunToTagToContent(plugin).get("plain", {}))
        for plugin in ("scalars", "tensor", "histograms", "images", "audio", "text", "pr_curves", "mesh")
    }
    assert tags == {
        "scalars": ["loss", "loss/double"],
        "tensor": ["tensor"],
        "histograms": ["hist", "hist/raw"],
        "images": ["boxes", "figure", "image", "images", "video"],
        "audio": ["audio"],
        "text": ["text"],
        "pr_curves": ["pr", "pr/raw"],
        "mesh": ["mesh_COLOR", "mesh_FACE", "mesh_VERTEX"],
    }
    assert list(multiplexer.PluginRunToTagToContent("custom_scalars")["plain"]) == ["custom_scalars__config__"]

    def value(tag: str, run: str = "plain") -> np.ndarray:  # type: ignore[type-arg]
        return make_ndarray(multiplexer.Tensors(run, tag)[0].tensor_proto)

    assert value("loss") == np.float32(0.5) and value("loss/double") == 1 / 3
    assert value("pair", "plain/pair_b") == np.float32(2.5)
    assert value("tensor").tolist() == [[0, 1, 2], [3, 4, 5]]
    assert value("hist")[:, 2].sum() == 1000
    assert value("pr").shape == (6, 127)
    assert value("text").item() == b"hello"
    assert value("mesh_VERTEX").shape == (1, 4, 3)
    width, height, png = value("image")[:3]
    assert (int(width), int(height)) == (10, 8) and png.startswith(b"\x89PNG")
    assert value("video")[2].startswith(b"GIF8")
    assert value("audio").flatten()[0].startswith(b"RIFF")
    start = multiplexer.PluginRunToTagToContent("hparams")["plain/hp"]["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
    assert (hparams["lr"].number_value, hparams["optimizer"].string_value) == (0.1, "adam")
