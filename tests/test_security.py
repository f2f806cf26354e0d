"""Auth, TLS and safe defaults: tokens with run prefixes, TLS and mutual TLS, and the non-loopback refusal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from _credentials import ALICE, BOB, ROOT_TOKEN, Pki, tls_credentials, token_file
from _support import Daemon, event_files, read_events, start_daemon, wait_healthy
from summaryd.client import SummaryWriter
from summaryd.server.security.refusals import RefusalInterceptor
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Daemon]:
    tokens = token_file(tmp_path / "tokens", f"{ALICE} team-a/ shared/eval", f"{ROOT_TOKEN} *", f"{BOB} team-ab/")
    daemon = start_daemon(tmp_path, "--token-file", str(tokens))
    try:
        yield daemon
    finally:
        daemon.terminate()


def _open(address: str, run: str, token: str | None, session_id: str | None = None) -> str:
    session_id = session_id or str(uuid.uuid4())
    metadata = [("authorization", f"Bearer {token}")] if token else None
    with grpc.insecure_channel(address) as channel:
        pb_grpc.SummariesStub(channel).OpenSession(
            pb.OpenSessionRequest(session_id=session_id, run=run), timeout=10, metadata=metadata
        )
    return session_id


def _code(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    return caught.value.code()  # type: ignore[no-any-return]


def test_missing_and_wrong_tokens_are_unauthenticated(guarded: Daemon) -> None:
    assert _code(lambda: _open(guarded.address, "team-a/x", None)) == grpc.StatusCode.UNAUTHENTICATED
    assert _code(lambda: _open(guarded.address, "team-a/x", "not-a-real-token-xxxxxx")) == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    assert ALICE not in guarded.log() and ROOT_TOKEN not in guarded.log(), "tokens must never be logged"


def test_token_outside_its_prefixes_is_permission_denied(guarded: Daemon) -> None:
    assert _code(lambda: _open(guarded.address, "team-b/x", ALICE)) == grpc.StatusCode.PERMISSION_DENIED
    assert _code(lambda: _open(guarded.address, "shared/evaluation", ALICE)) == grpc.StatusCode.PERMISSION_DENIED
    assert not (guarded.logdir / "team-b").exists()


def test_right_token_writes_and_sessions_answer_only_tokens_of_their_run(guarded: Daemon) -> None:
    session = _open(guarded.address, "team-a/run1", ALICE)
    _open(guarded.address, "shared/eval/r", ALICE)
    event = Event(wall_time=1.0, step=1, summary=Summary(value=[Summary.Value(tag="t", simple_value=2.0)]))
    request = pb.WriteRequest(session_id=session, first_sequence=1, events=[event.SerializeToString()])
    with grpc.insecure_channel(guarded.address) as channel:
        stub = pb_grpc.SummariesStub(channel)
        other = [("authorization", f"Bearer {BOB}")]
        assert _code(lambda: list(stub.Write(iter([request]), timeout=10, metadata=other))) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        put = pb.PutFileRequest(session_id=session, path="projector_config.pbtxt", content=b"")
        assert _code(lambda: stub.PutFile(put, timeout=10, metadata=other)) == grpc.StatusCode.PERMISSION_DENIED
        own = [("authorization", f"Bearer {ALICE}")]
        assert [a.acked_sequence for a in stub.Write(iter([request]), timeout=10, metadata=own)] == [1]
        stub.PutFile(put, timeout=10, metadata=own)
        stub.CloseSession(pb.CloseSessionRequest(session_id=session), timeout=10, metadata=own)
    [path] = event_files(guarded.logdir / "team-a" / "run1")
    assert [e.step for e in read_events(path) if e.HasField("summary")] == [1]


def test_the_client_sends_its_token(guarded: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """SummaryWriter takes the token from SUMMARYD_TOKEN; without it everything is refused and reported."""
    monkeypatch.setenv("SUMMARYD_TOKEN", ALICE)
    with SummaryWriter("team-a/client", address=guarded.address, worker="") as writer:
        writer.add_scalar("x", 1.0, 1)
    assert writer.close().delivered == 1
    monkeypatch.delenv("SUMMARYD_TOKEN")
    writer = SummaryWriter("team-a/anonymous", address=guarded.address, worker="")
    writer.add_scalar("x", 1.0, 1)
    report = writer.close(timeout=5)
    assert report.delivered == 0 and report.error is not None and "UNAUTHENTICATED" in report.error


def test_health_needs_no_token(guarded: Daemon) -> None:
    wait_healthy(guarded.address)


def test_token_file_is_reread_on_sighup(guarded: Daemon, tmp_path: Path) -> None:
    _open(guarded.address, "team-a/before", ALICE)
    token_file(tmp_path / "tokens", f"{ROOT_TOKEN} *")
    os.kill(guarded.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while True:
        try:
            _open(guarded.address, "team-a/after", ALICE)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAUTHENTICATED
            break
        assert time.monotonic() < deadline, "SIGHUP did not reload the token file"
        time.sleep(0.05)
    _open(guarded.address, "anything", ROOT_TOKEN)


def _tls_open(address: str, pki: Pki, *, client_cert: bool) -> None:
    with grpc.secure_channel(address, tls_credentials(pki, client_cert=client_cert)) as channel:
        pb_grpc.SummariesStub(channel).OpenSession(
            pb.OpenSessionRequest(session_id=str(uuid.uuid4()), run="tls"), timeout=10
        )


def test_tls(tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = start_daemon(
        tmp_path,
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        credentials=tls_credentials(pki, client_cert=False),
    )
    try:
        _tls_open(daemon.address, pki, client_cert=False)
        assert _code(lambda: _open(daemon.address, "plain", None)) == grpc.StatusCode.UNAVAILABLE
        monkeypatch.setenv("SUMMARYD_TLS_CA", str(pki.ca))
        with SummaryWriter("over-tls", address=daemon.address, worker="") as writer:
            writer.add_scalar("x", 1.0, 1)
        assert writer.close().delivered == 1
    finally:
        daemon.terminate()


def test_mutual_tls_refuses_a_client_without_certificate(tmp_path: Path, pki: Pki) -> None:
    daemon = start_daemon(
        tmp_path,
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        "--tls-client-ca",
        str(pki.ca),
        credentials=tls_credentials(pki, client_cert=True),
    )
    try:
        assert _code(lambda: _tls_open(daemon.address, pki, client_cert=False)) == grpc.StatusCode.UNAVAILABLE
        _tls_open(daemon.address, pki, client_cert=True)
    finally:
        daemon.terminate()


def test_non_loopback_without_auth_is_refused(tmp_path: Path) -> None:
    """Binding beyond loopback with neither token nor TLS: exit 2 before listening, saying what to do."""
    result = subprocess.run(
        [sys.executable, "-m", "summaryd.server", "serve", "--logdir", str(tmp_path / "runs"), "--listen", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "--token-file" in result.stderr and "--tls-cert" in result.stderr and "--insecure" in result.stderr


def test_insecure_non_loopback_starts_with_a_warning(tmp_path: Path) -> None:
    """With --insecure it serves and warns. Run in a private network namespace, where 0.0.0.0 reaches only lo."""
    port_file = tmp_path / "port"
    script = (
        "ip link set lo up && exec "
        + sys.executable
        + " -m summaryd.server serve --logdir "
        + str(tmp_path / "runs")
        + " --listen 0.0.0.0:0 --insecure --port-file "
        + str(port_file)
    )
    log_path = tmp_path / "daemon.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["unshare", "--net", "sh", "-c", script], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        assert "WARNING" in log_path.read_text() and "--insecure" in log_path.read_text()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0


def test_refused_callers_are_logged_once_per_kind_without_their_token(guarded: Daemon) -> None:
    """Wrong tokens and other tenants' tokens, again and again: one WARNING line per kind at the default level,
    naming the status and never the token offered."""
    wrong = "wrong-token-0123456789abcdef"
    for _ in range(5):
        assert _code(lambda: _open(guarded.address, "team-a/x", wrong)) == grpc.StatusCode.UNAUTHENTICATED
        assert _code(lambda: _open(guarded.address, "team-a/x", BOB)) == grpc.StatusCode.PERMISSION_DENIED
    guarded.terminate()
    warnings = [line for line in guarded.log().splitlines() if " WARNING " in line]
    for code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        assert len([line for line in warnings if code in line]) == 1, warnings
    assert wrong not in guarded.log() and BOB not in guarded.log()


class _Failing(pb_grpc.SummariesServicer):
    """A servicer whose every call raises what no layer answers, its text naming a store and a state path (a
    fault made on purpose: the daemon's own layers answer every raise they expect)."""

    async def OpenSession(self, request: pb.OpenSessionRequest, context: Any) -> pb.OpenSessionResponse:
        raise RuntimeError("s3://private-bucket/runs/.summaryd/leases/x at /var/lib/summaryd/state")

    async def Write(self, requests: Any, context: Any) -> AsyncIterator[pb.WriteAck]:
        async for _ in requests:
            raise RuntimeError("s3://private-bucket/runs/.summaryd/leases/x at /var/lib/summaryd/state")
        yield pb.WriteAck()


async def test_a_raise_no_layer_answers_reaches_the_client_without_its_text() -> None:
    server = grpc.aio.server(interceptors=[RefusalInterceptor()])
    pb_grpc.add_SummariesServicer_to_server(_Failing(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.SummariesStub(channel)
            with pytest.raises(grpc.RpcError) as opened:
                await stub.OpenSession(pb.OpenSessionRequest(session_id="s"), timeout=30)
            with pytest.raises(grpc.RpcError) as wrote:
                async for _ in stub.Write(iter([pb.WriteRequest(session_id="s")]), timeout=30):
                    pass
    finally:
        await server.stop(0)
    for refused in (opened.value, wrote.value):
        assert refused.code() == grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]
        assert refused.details() == "the daemon failed this call (RuntimeError); its log says why"  # type: ignore[attr-defined]
