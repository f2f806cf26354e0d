"""`add_embedding` writes the projector's files beside the run's event files, as torch's does.

torch's `SummaryWriter` (local files) and ours (through a real daemon, `PutFile`) get the same calls; the
projector's data files must be byte-identical and `projector_config.pbtxt` must hold the same `ProjectorConfig`.
The daemon refuses file paths that would leave the run directory or touch its own files.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from google.protobuf import text_format
from tensorboard.plugins.projector.projector_config_pb2 import ProjectorConfig
from torch.utils.tensorboard import SummaryWriter as TorchSummaryWriter

from _support import Daemon, replay, start_daemon, unused_port, wait_for
from summaryd.client import SummaryWriter
from summaryd.client._api import _torch
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc


class Inputs:
    def __init__(self) -> None:
        torch.manual_seed(7)
        self.mat = torch.randn(10, 4)
        self.mat_np = np.random.default_rng(7).normal(size=(5, 3)).astype(np.float32)
        self.labels = [f"label-{i}" for i in range(10)]
        self.images = torch.rand(10, 3, 6, 5)
        self.gray = torch.rand(5, 1, 4, 4)
        self.table = [[i, i % 3] for i in range(5)]


def exercise(writer: Any, x: Inputs) -> None:
    writer.add_embedding(x.mat, metadata=x.labels, label_img=x.images, global_step=1, tag="words")
    writer.add_embedding(x.mat, global_step=2, tag="nested/tag%")
    writer.add_embedding(x.mat_np, metadata=x.table, metadata_header=["index", "class"], label_img=x.gray)
    writer.add_embedding(x.mat * 2, metadata=x.labels, global_step=3)


def projector_files(run: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(run)): p.read_bytes()
        for p in sorted(run.rglob("*"))
        if p.is_file() and "tfevents" not in p.name and p.name != "projector_config.pbtxt"
    }


def projector_config(run: Path) -> ProjectorConfig:
    config = ProjectorConfig()
    text_format.Parse((run / "projector_config.pbtxt").read_text(), config)
    return config


def compare_with_torch(daemon: Daemon, tmp_path: Path) -> None:
    inputs = Inputs()
    with TorchSummaryWriter(str(tmp_path / "torch" / "exp")) as theirs:
        exercise(theirs, inputs)
    with SummaryWriter("exp", address=daemon.address, worker="") as ours:
        exercise(ours, inputs)
        report = ours.flush(timeout=10)
    assert not any(report.dropped.values()), report
    expected, actual = projector_files(tmp_path / "torch" / "exp"), projector_files(daemon.logdir / "exp")
    assert sorted(actual) == sorted(expected)
    assert {
        "00001/words/sprite.png",
        "00002/nested%2ftag%25/tensors.tsv",
        "00000/default/metadata.tsv",
        "00003/default/tensors.tsv",
    } <= set(expected)
    for name, content in expected.items():
        assert actual[name] == content, name
    theirs_config = projector_config(tmp_path / "torch" / "exp")
    assert len(theirs_config.embeddings) == 4
    assert projector_config(daemon.logdir / "exp") == theirs_config
    # No temporary file is left behind.
    assert not list((daemon.logdir / "exp").rglob(".summaryd*"))


def test_add_embedding_writes_torchs_projector_files(daemon: Daemon, tmp_path: Path) -> None:
    compare_with_torch(daemon, tmp_path)


def test_add_embedding_without_torchs_helpers_gives_the_same_bytes(
    daemon: Daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that has not imported torch encodes with numpy and Pillow; the files are the same."""
    monkeypatch.setattr(_torch, "builders", lambda: None)
    compare_with_torch(daemon, tmp_path)


def test_close_waits_for_the_uploads(daemon: Daemon) -> None:
    writer = SummaryWriter("closing", address=daemon.address, worker="")
    writer.add_embedding(np.eye(3), metadata=["a", "b", "c"])
    report = writer.close()
    assert report.ok, report
    assert (daemon.logdir / "closing" / "00000" / "default" / "tensors.tsv").read_text() == (
        "1.0\t0.0\t0.0\n0.0\t1.0\t0.0\n0.0\t0.0\t1.0\n"
    )
    assert (daemon.logdir / "closing" / "projector_config.pbtxt").is_file()


def test_a_refused_upload_is_counted_not_raised(daemon: Daemon) -> None:
    writer = SummaryWriter("refused", address=daemon.address, worker="")
    writer.add_embedding(np.eye(2), tag="x")
    # A tag the daemon refuses as a path component: control characters.
    writer.add_embedding(np.eye(2), tag="bad\x01tag")
    report = writer.close()
    assert report.dropped == {"files": 1}
    assert (daemon.logdir / "refused" / "00000" / "x" / "tensors.tsv").is_file()


@pytest.fixture
def stub(daemon: Daemon) -> Iterator[pb_grpc.SummariesStub]:
    with grpc.insecure_channel(daemon.address) as channel:
        yield pb_grpc.SummariesStub(channel)


@pytest.fixture(scope="module")
def refusing_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for every bad path: each case opens a run of its own, and a file that any case let through
    is still found by the later cases' look at the whole logdir."""
    d = start_daemon(tmp_path_factory.mktemp("refusing"))
    try:
        yield d
    finally:
        d.stop(15)


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/etc/passwd",
        "../escape.txt",
        "a/../../escape.txt",
        "a//b.txt",
        "./a.txt",
        "dir/",
        "a/b/c/d/e.txt",
        "events.out.tfevents.1.host",
        "sub/x.tfevents.y",
        ".summaryd-put-0123",
        "sub/.summaryd",
        "bad\nname",
        "back\\slash",
    ],
)
def test_put_file_refuses_bad_paths(refusing_daemon: Daemon, path: str) -> None:
    daemon = refusing_daemon
    session_id = str(uuid.uuid4())
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.SummariesStub(channel)
        stub.OpenSession(pb.OpenSessionRequest(session_id=session_id, run=f"files-{session_id}"), timeout=10)
        with pytest.raises(grpc.RpcError) as raised:
            stub.PutFile(pb.PutFileRequest(session_id=session_id, path=path, content=b"x"), timeout=10)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details()
    assert not [
        p
        for p in daemon.logdir.rglob("*")
        if p.is_file()
        and p.name != "projector_config.pbtxt"
        and "tfevents" not in p.name
        and not p.is_relative_to(daemon.logdir / ".summaryd")
    ]


def test_put_file_writes_replaces_and_needs_a_live_session(daemon: Daemon, stub: pb_grpc.SummariesStub) -> None:
    session_id = str(uuid.uuid4())
    stub.OpenSession(pb.OpenSessionRequest(session_id=session_id, run="files", worker="rank-1"), timeout=10)
    for content in (b"first, longer", b"second"):
        stub.PutFile(pb.PutFileRequest(session_id=session_id, path="a/b/c/d.txt", content=content), timeout=10)
    assert (daemon.logdir / "files" / "rank-1" / "a" / "b" / "c" / "d.txt").read_bytes() == b"second"

    # A name that is a directory of the run is refused with a reason.
    with pytest.raises(grpc.RpcError) as raised:
        stub.PutFile(pb.PutFileRequest(session_id=session_id, path="a/b", content=b"x"), timeout=10)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    # A symlinked directory on the way is refused, not followed.
    (daemon.logdir / "files" / "rank-1" / "link").symlink_to(daemon.logdir.parent)
    with pytest.raises(grpc.RpcError) as raised:
        stub.PutFile(pb.PutFileRequest(session_id=session_id, path="link/x.txt", content=b"x"), timeout=10)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not (daemon.logdir.parent / "x.txt").exists()

    with pytest.raises(grpc.RpcError) as raised:
        stub.PutFile(pb.PutFileRequest(session_id=str(uuid.uuid4()), path="x.txt", content=b"x"), timeout=10)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND

    stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), timeout=10)
    with pytest.raises(grpc.RpcError) as raised:
        stub.PutFile(pb.PutFileRequest(session_id=session_id, path="x.txt", content=b"x"), timeout=10)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_projector_files_wait_in_the_spool_while_the_daemon_is_away(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The daemon down for the whole run: close() keeps the projector's files in the session's files spool
    (none dropped), and `summaryd replay` uploads them with the events, byte for byte as torch writes them;
    replaying again sends nothing."""
    inputs, spool_root = Inputs(), tmp_path / "spool"
    with TorchSummaryWriter(str(tmp_path / "torch" / "exp")) as theirs:
        exercise(theirs, inputs)
    ours = SummaryWriter("exp", address=f"127.0.0.1:{unused_port()}", worker="", spool_dir=spool_root)
    exercise(ours, inputs)
    ours.add_scalar("loss", 0.5, 1)
    report = ours.close(timeout=3)
    expected = projector_files(tmp_path / "torch" / "exp")
    # Every data file, and the latest projector_config.pbtxt (torch rewrites it at each call, as we send it).
    assert (report.files_spooled, dict(report.dropped), report.spooled) == (len(expected) + 1, {}, 1)
    assert not report.ok
    assert report.spool_path is not None and Path(report.spool_path).parent == spool_root

    daemon = start_daemon(tmp_path)
    try:
        [result] = replay(spool_root, daemon.address, capsys, keep=True)
        assert (result["ok"], result["sent"], result["files"], result["synced"]) == (True, 1, len(expected) + 1, True)
        run = daemon.logdir / "exp"
        assert projector_files(run) == expected
        assert projector_config(run) == projector_config(tmp_path / "torch" / "exp")
        [again] = replay(spool_root, daemon.address, capsys)
        assert (again["ok"], again["already"], again["sent"], again["files"]) == (True, True, 0, 0)
        assert again["removed"] and list(spool_root.iterdir()) == []
    finally:
        daemon.terminate()


def test_projector_files_spooled_alone_reach_their_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The daemon stops after the events were delivered: the files wait in a files spool of their own, and
    `summaryd replay` uploads them into the run once the daemon is back."""
    spool_root = tmp_path / "spool"
    daemon = start_daemon(tmp_path)
    writer = SummaryWriter("late", address=daemon.address, worker="", spool_dir=spool_root)
    writer.add_scalar("loss", 0.5, 1)
    assert writer.flush(timeout=10).delivered == 1
    daemon.terminate()
    writer.add_embedding(np.eye(3), metadata=["a", "b", "c"])
    report = writer.close(timeout=3)
    assert (report.files_spooled, report.delivered, report.spooled, dict(report.dropped)) == (3, 1, 0, {})
    [files_spool] = spool_root.iterdir()
    assert files_spool.name.endswith(".files") and str(files_spool) == report.spool_path

    daemon = start_daemon(tmp_path, logdir=daemon.logdir)
    try:
        [result] = replay(spool_root, daemon.address, capsys, keep=True)
        assert (result["ok"], result["files"], result["events"]) == (True, 3, 0)
        assert (daemon.logdir / "late" / "00000" / "default" / "tensors.tsv").read_text() == (
            "1.0\t0.0\t0.0\n0.0\t1.0\t0.0\n0.0\t0.0\t1.0\n"
        )
        assert (daemon.logdir / "late" / "00000" / "default" / "metadata.tsv").read_text() == "a\nb\nc\n"
        assert (daemon.logdir / "late" / "projector_config.pbtxt").is_file()
        [again] = replay(spool_root, daemon.address, capsys)
        assert (again["ok"], again["already"], again["files"]) == (True, True, 0)
        assert again["removed"] and list(spool_root.iterdir()) == []
    finally:
        daemon.terminate()


def test_projector_files_reach_a_daemon_that_comes_up_later(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An embedding logged before the daemon is up: its files are kept, tried again while the writer is idle,
    and uploaded once the daemon answers, with no replay; close() then has nothing to spool."""
    port, spool_root = unused_port(), tmp_path / "spool"
    writer = SummaryWriter("early", address=f"127.0.0.1:{port}", worker="", spool_dir=spool_root)
    with caplog.at_level("INFO", logger="summaryd.client"):
        writer.add_embedding(np.eye(3), metadata=["a", "b", "c"])
        wait_for(lambda: any("kept to be uploaded later" in r.getMessage() for r in caplog.records), 30, "a file kept")
    daemon = start_daemon(tmp_path, "--listen", f"127.0.0.1:{port}")
    try:
        tensors = daemon.logdir / "early" / "00000" / "default" / "tensors.tsv"
        wait_for(tensors.is_file, 30, "the kept files to be uploaded")
        report = writer.close(timeout=10)
        assert report.ok, report
        assert tensors.read_text() == "1.0\t0.0\t0.0\n0.0\t1.0\t0.0\n0.0\t0.0\t1.0\n"
        assert (daemon.logdir / "early" / "projector_config.pbtxt").is_file()
        assert not spool_root.exists() or not list(spool_root.iterdir())
    finally:
        daemon.terminate()
