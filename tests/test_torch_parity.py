"""Every method of torch's `SummaryWriter`, called with the same arguments on torch's
writer (local files) and on ours (through a real daemon), gives the same TensorBoard data.

Both logdirs are read with TensorBoard's own loader and compared event by event: the same runs (relative
layout), and in each run the same events in the same order — steps, tags, summary kinds, plugin metadata and
payloads, PNG, GIF and WAV bytes included. Only wall times and file names may differ, plus the differences the
README lists: torch's own `file_version` records (the daemon writes that record itself). The projector files
of `add_embedding` are compared byte for byte (tests/test_torch_embedding.py covers them in depth).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from torch.utils.tensorboard import SummaryWriter as TorchSummaryWriter

from _parity import Inputs, assert_same_events, exercise, runs
from _support import Daemon, event_files, read_events, start_daemon
from summaryd.client import SummaryWriter

pytestmark = [
    pytest.mark.no_findings,  # healthy workloads: the watch finds nothing in them
    # torch.jit.trace (add_graph) is deprecated in favour of torch.export, and says so; torch's own add_graph
    # is what we compare with, so its warning is expected here.
    pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.*"),
    pytest.mark.filterwarnings("ignore::FutureWarning:torch.*"),
]


def test_every_method_gives_the_same_tensorboard_data_as_torch(daemon: Daemon, tmp_path: Path) -> None:
    inputs = Inputs(tmp_path)
    with TorchSummaryWriter(str(tmp_path / "torch" / "exp"), purge_step=0) as theirs:
        exercise(theirs, inputs)
    with SummaryWriter("exp", address=daemon.address, worker="", purge_step=0) as ours:
        exercise(ours, inputs)
        report = ours.flush(timeout=10)
    assert report.delivered > 0 and report.undelivered == 0
    assert not any(report.dropped.values())

    expected, actual = runs(tmp_path / "torch"), runs(daemon.logdir)
    assert (
        sorted(actual)
        == sorted(expected)
        == [
            "exp",
            "exp/hp",
            "exp/hp-2",
            "exp/pair_loss_train",
            "exp/pair_loss_val",
        ]
    )
    assert_same_events(actual, expected)

    # Every method was exercised: each summary kind and plugin torch wrote is in the comparison.
    main = expected["exp"]
    kinds = {e.WhichOneof("what") for e in main}
    assert kinds == {"session_log", "summary", "graph_def", "tagged_run_metadata"}
    plugins = {v.metadata.plugin_data.plugin_name for e in main for v in e.summary.value}
    assert plugins == {"", "scalars", "tensor", "text", "pr_curves", "custom_scalars", "mesh"}
    values = {v.WhichOneof("value") for e in main for v in e.summary.value}
    assert values == {"simple_value", "tensor", "histo", "image", "audio"}
    video = next(v for e in main for v in e.summary.value if v.tag == "video")
    assert video.image.encoded_image_string.startswith(b"GIF8")  # moviepy 1.x encoded it, for both writers

    # add_embedding: the projector's files, beside the event files, the same bytes as torch's.
    for name in ("projector_config.pbtxt", "00001/e/tensors.tsv", "00001/e/metadata.tsv", "00001/e/sprite.png"):
        torch_file, our_file = tmp_path / "torch" / "exp" / name, daemon.logdir / "exp" / name
        assert our_file.read_bytes() == torch_file.read_bytes(), name


def test_torch_purge_step_records_differ_only_by_file_version(daemon: Daemon, tmp_path: Path) -> None:
    """torch writes `file_version` again at the purge step; the daemon refuses client file_version records,
    so ours has only the START that does the purging."""
    with TorchSummaryWriter(str(tmp_path / "torch"), purge_step=12) as theirs:
        theirs.add_scalar("x", 1.0, 12)
    with SummaryWriter("purged", address=daemon.address, worker="", purge_step=12) as ours:
        ours.add_scalar("x", 1.0, 12)
    [torch_file] = event_files(tmp_path / "torch")
    [our_file] = event_files(daemon.logdir / "purged")
    torch_events, our_events = read_events(torch_file), read_events(our_file)
    assert [(e.step, e.WhichOneof("what")) for e in torch_events] == [
        (0, "file_version"),
        (12, "file_version"),
        (12, "session_log"),
        (12, "summary"),
    ]
    assert [(e.step, e.WhichOneof("what")) for e in our_events] == [
        (0, "file_version"),
        (12, "session_log"),
        (12, "summary"),
    ]
    assert our_events[1].session_log == torch_events[2].session_log
    assert math.isclose(our_events[2].summary.value[0].simple_value, 1.0)


BAD_SCALARS = [
    (1, 0.5, 0),  # a tag that is not text
    (b"\xff", 0.5, 0),  # bytes that are not UTF-8
    ("t", "abc", 0),
    ("t", 0.5, "x"),
]  # (None as the value raises TypeError here, where torch's make_np raises NotImplementedError)


@pytest.fixture(scope="module")
def bad_scalars_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for every bad scalar: each case writes a run of its own."""
    d = start_daemon(tmp_path_factory.mktemp("bad-scalars"))
    try:
        yield d
    finally:
        d.stop(15)


@pytest.mark.parametrize("args", BAD_SCALARS, ids=repr)
def test_add_scalar_raises_at_the_call_what_torch_raises(
    bad_scalars_daemon: Daemon, tmp_path: Path, args: tuple[Any, ...]
) -> None:
    """The event is built on the sender thread, but a bad argument still raises to the caller, as in torch."""
    daemon, run = bad_scalars_daemon, f"bad-{uuid.uuid4().hex[:8]}"
    with TorchSummaryWriter(str(tmp_path / "torch")) as theirs, pytest.raises(Exception) as torch_raised:
        theirs.add_scalar(*args)
    with SummaryWriter(run, address=daemon.address, worker="") as ours:
        with pytest.raises(torch_raised.type):
            ours.add_scalar(*args)
        ours.add_scalar(b"bytes-tag", 2.0, 3)  # torch takes a UTF-8 bytes tag too
        report = ours.flush(timeout=10)
    assert report.delivered == 1 and not any(report.dropped.values())
    [event] = [e for e in read_events(event_files(daemon.logdir / run)[0]) if e.HasField("summary")]
    assert (event.step, event.summary.value[0].tag, event.summary.value[0].simple_value) == (3, "bytes-tag", 2.0)
