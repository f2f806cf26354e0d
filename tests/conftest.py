"""Fixtures: a real daemon process on a free loopback port (`_support.start_daemon`), and a clean client state
for every test. What tests share besides fixtures lives in `_support`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from _support import Daemon, start_daemon
from summaryd.client import reset_global_step
from summaryd.client.hooks import SummaryWriterCache


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon on a fresh logdir; SIGTERM'd (then killed) by pid at the end."""
    d = start_daemon(tmp_path)
    try:
        yield d
    finally:
        # Hook writers close while their daemon is still there to confirm; the autouse fixture clears later.
        SummaryWriterCache.clear()
        d.stop(15)


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Daemons a test starts and appends here; each is killed by pid at the end if still running."""
    started: list[Daemon] = []
    try:
        yield started
    finally:
        for d in started:
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait(30)


@pytest.fixture(autouse=True)
def _private_spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spools of a test stay in its own folder, never in the user's cache."""
    monkeypatch.setenv("SUMMARYD_SPOOL_DIR", str(tmp_path / "spool"))


@pytest.fixture(autouse=True)
def _fresh_client_state() -> Iterator[None]:
    """Each test starts without a global step or cached hook writers."""
    reset_global_step()
    yield
    SummaryWriterCache.clear()
    reset_global_step()
