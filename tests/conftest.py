"""Every fixture more than one test module uses: a real daemon process on a free loopback port
(`_support.start_daemon`), a clean client state for every test, a throw-away PKI, SeaweedFS and a fresh bucket
prefix, a recording gRPC server, gRPC channels closed at the end. What tests share besides fixtures lives in
`_support` and beside it (`_aggregation`, `_bucket`, `_credentials`, `_parity`, `_shipping`, the launchers
`_daemon` and `_seaweed`); test modules import nothing from each other."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

# The shared checks' assertions say what differs, as a test's own do (imported below, after this).
pytest.register_assert_rewrite("_bucket", "_parity", "_support")

from _bucket import BUCKET
from _credentials import Pki, make_pki
from _seaweed import SeaweedServer, create_bucket, start_seaweed
from _support import Daemon, Loopback, start_daemon
from summaryd.client import reset_global_step
from summaryd.client.hooks import SummaryWriterCache
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc


@pytest.fixture
def daemon(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    """A daemon on a fresh logdir (watching, every rule at its defaults); SIGTERM'd (then killed) by pid at the
    end. In a test marked `no_findings` (healthy workloads: the parity and framework tests), a finding the watch
    fired while the test ran fails it: a false finding."""
    d = start_daemon(tmp_path)
    try:
        yield d
    finally:
        # Hook writers close while their daemon is still there to confirm; the autouse fixture clears later.
        SummaryWriterCache.clear()
        d.stop(15)
    if request.node.get_closest_marker("no_findings"):
        fired = re.findall(r"^.*watch: \w+ firing run .*$", d.log(), re.MULTILINE)
        assert not fired, "the watch found something in a healthy workload:\n" + "\n".join(fired)


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


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A throw-away CA with a server certificate for 127.0.0.1 and a client certificate."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """One SeaweedFS for the session, with the tests' bucket; stopped by its pid."""
    server = start_seaweed(tmp_path_factory.mktemp("seaweed"))
    try:
        create_bucket(server, BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture
def logdir_url(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """`s3://BUCKET/PREFIX` of a fresh prefix; the standard AWS variables point this process and the daemons
    it starts at SeaweedFS."""
    for name, value in seaweed.environment().items():
        monkeypatch.setenv(name, value)
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def capture() -> Iterator[Loopback]:
    """Where a forged lease points: a gRPC server that only records what reaches it (every call UNIMPLEMENTED)."""
    server = Loopback(pb_grpc.SummariesServicer())
    yield server
    server.stop()


@pytest.fixture
def channels() -> Iterator[list[grpc.Channel]]:
    """Channels a test opens and appends here; each is closed at the end."""
    opened: list[grpc.Channel] = []
    yield opened
    for channel in opened:
        channel.close()
