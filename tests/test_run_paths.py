"""Run paths are confined to the logdir: bad ones get INVALID_ARGUMENT and create nothing anywhere."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import grpc
import pytest

from _support import Daemon
from summaryd.client import SummaryWriter
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc


def _open(daemon: Daemon, run: str, worker: str = "") -> pb.OpenSessionResponse:
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.SummariesStub(channel)
        answer: pb.OpenSessionResponse = stub.OpenSession(
            pb.OpenSessionRequest(session_id=str(uuid.uuid4()), run=run, worker=worker), timeout=10
        )
        return answer


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


BAD_RUNS = {
    "../x": "'..'",
    "/etc/x": "absolute",
    "a/../../b": "'..'",
    "a\0b": "U+0000",
    "x" * 300: "longer than 255 bytes",
    "/".join(["d"] * 17): "deeper than 16",
    "a//b": "empty",
    "a\\..\\b": "U+005C",
    "": "empty",
    "e\u0301": "NFC",
    "line\nbreak": "U+000A",
}


@pytest.mark.parametrize("run", list(BAD_RUNS), ids=[repr(r)[:24] for r in BAD_RUNS])
def test_bad_run_paths_are_refused(daemon: Daemon, tmp_path: Path, run: str) -> None:
    """Each escape or malformed path gets INVALID_ARGUMENT naming the problem; nothing is created."""
    before = _tree(tmp_path)
    with pytest.raises(grpc.RpcError) as caught:
        _open(daemon, run)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert BAD_RUNS[run] in caught.value.details()
    assert _tree(tmp_path) == before
    assert not Path("/etc/x").exists()


@pytest.mark.parametrize("worker", ["../up", "a/b", "..", "w\x07"])
def test_bad_worker_labels_are_refused(daemon: Daemon, worker: str) -> None:
    """A worker label is one plain path component."""
    with pytest.raises(grpc.RpcError) as caught:
        _open(daemon, "exp", worker)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "worker label" in caught.value.details()


def test_symlink_out_of_the_logdir_is_refused(daemon: Daemon, tmp_path: Path) -> None:
    """A symlink inside the logdir that leads out is never followed, even one level down."""
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, daemon.logdir / "escape")
    (daemon.logdir / "real").mkdir()
    os.symlink(outside, daemon.logdir / "real" / "deeper")
    for run in ("escape", "escape/x", "real/deeper/y"):
        with pytest.raises(grpc.RpcError) as caught:
            _open(daemon, run)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "symlink" in caught.value.details()
    assert list(outside.iterdir()) == []


def test_good_nested_run_resolves_inside_the_logdir(daemon: Daemon) -> None:
    """A nested run path plus worker label maps to `<run>/<worker>` under the logdir, made at its first event."""
    answer = _open(daemon, "sweep/lr-0.1", "rank-2")
    assert answer.run_dir == "sweep/lr-0.1/rank-2"
    assert not (daemon.logdir / "sweep").exists()
    with SummaryWriter("sweep/lr-0.1", address=daemon.address, worker="rank-2") as writer:
        writer.add_scalar("loss", 1.0, 0)
    assert (daemon.logdir / "sweep" / "lr-0.1" / "rank-2").is_dir()


def test_writer_on_a_run_over_the_daemons_limits_reports_the_refusal_without_raising(daemon: Daemon) -> None:
    """A run path only the daemon's configuration refuses (deeper than --max-run-depth): the training loop never
    sees the error; close() reports what was refused and why. (Paths no daemon takes raise at construction:
    test_user_errors.py.)"""
    writer = SummaryWriter("d/" * 20 + "run", address=daemon.address, worker="")
    for step in range(5):
        writer.add_scalar("loss", 1.0, step)
    report = writer.close(timeout=10)
    assert report.delivered == 0
    assert report.dropped == {"rejected": 5}
    assert report.error is not None and "INVALID_ARGUMENT" in report.error and "--max-run-depth" in report.error
