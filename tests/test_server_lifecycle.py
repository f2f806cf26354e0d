"""The daemon's lifecycle in this process: a start-up that fails at any step releases everything it took
(descriptors under the logdir, the state directory's lock, the I/O threads, the gRPC and metrics ports), and
a shutdown releases them too."""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from summaryd.server.config import Config
from summaryd.server.server import ListenError, Server, StartupError
from summaryd.server.storage.state import StateError


def _descriptors_under(path: Path) -> list[str]:
    """What this process holds open below `path` (the logdir, the state directory inside it, their files)."""
    root = os.path.realpath(path)
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
        if target == root or target.startswith(root + os.sep):
            held.append(target)
    return held


def _io_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("summaryd-io")]


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _lock_is_free(state_dir: Path) -> bool:
    fd = os.open(state_dir / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a lock held by another open file refuses, in-process too
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


async def test_a_port_in_use_stops_start_up_before_anything_is_taken(tmp_path: Path, taken_port: int) -> None:
    logdir = tmp_path / "runs"
    server = Server(Config(logdir=str(logdir), listen=f"127.0.0.1:{taken_port}"))
    with pytest.raises(ListenError, match="cannot listen on"):
        await server.serve()
    assert not logdir.exists()
    assert _io_threads() == []


async def test_a_metrics_port_in_use_releases_the_grpc_port(tmp_path: Path, taken_port: int) -> None:
    logdir = tmp_path / "runs"
    server = Server(Config(logdir=str(logdir), listen="127.0.0.1:0", metrics_listen=f"127.0.0.1:{taken_port}"))
    with pytest.raises(ListenError, match="cannot serve metrics"):
        await server.serve()
    assert server.port is not None and _bindable(server.port)
    assert not logdir.exists()
    assert _io_threads() == []


@pytest.mark.parametrize("failure", ["port file", "recovery"])
async def test_a_start_up_failing_after_the_state_is_open_releases_everything(tmp_path: Path, failure: str) -> None:
    """The port file cannot be written (the last step), or recovery refuses the state directory (a middle one):
    no descriptor under the logdir stays open, no I/O thread runs, the lock and both ports are free again."""
    logdir = tmp_path / "runs"
    if failure == "port file":
        config = Config(
            logdir=str(logdir),
            listen="127.0.0.1:0",
            metrics_listen="127.0.0.1:0",
            port_file=str(tmp_path / "missing" / "port"),
        )
        expected: type[Exception] = StartupError
        state_dir = logdir / ".summaryd"
    else:  # the state directory is the logdir itself: found when recovery compares the two
        config = Config(logdir=str(logdir), listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", state_dir=str(logdir))
        expected = StateError
        state_dir = logdir
    server = Server(config)
    with pytest.raises(expected):
        await server.serve()
    assert _descriptors_under(logdir) == []
    assert _io_threads() == []
    assert _lock_is_free(state_dir)
    assert server.port is not None and _bindable(server.port)
    assert server.metrics_port is not None and _bindable(server.metrics_port)


async def test_shutdown_releases_everything_start_up_took(tmp_path: Path) -> None:
    logdir = tmp_path / "runs"
    server = Server(Config(logdir=str(logdir), listen="127.0.0.1:0", metrics_listen="127.0.0.1:0"))
    serving = asyncio.create_task(server.serve())
    port = await server.wait_started()
    assert _descriptors_under(logdir) != [] and _io_threads() != []
    server.request_shutdown()
    await serving
    assert _descriptors_under(logdir) == []
    assert _io_threads() == []
    assert _lock_is_free(logdir / ".summaryd")
    assert _bindable(port)
    assert server.metrics_port is not None and _bindable(server.metrics_port)
