"""A forged lease in a real bucket sends no credential anywhere, and a daemon with `--peers` names no forged owner.

Anyone who can write the bucket prefix can write a run's lease naming any address. Here such a lease is
written into a real SeaweedFS bucket, naming a capture server (a real gRPC server on loopback that records the
metadata of every call, `test_redirect.Loopback`); a real daemon on the bucket, with a token file, then refuses
the run's sessions naming that address. The writer, `summaryd ship` and `summaryd replay`, given only the
daemon, must send the capture server nothing.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import grpc
import pytest

from _bucket import start_bucket_daemon
from _credentials import TOKEN
from _shipping import VERSION_RECORD, append, scalar
from _support import Daemon, Loopback, leave_a_spool, log_losses, unused_port
from summaryd.cli import main
from summaryd.client import SummaryWriter
from summaryd.server.storage.bucket.leases import RunLeases
from summaryd.server.storage.bucket.store import Bucket
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import OWNER_ADDRESS_KEY

pytestmark = pytest.mark.objstore


def forge_lease(url: str, run: str, address: str) -> None:
    """What a bucket writer who is no daemon can do: a live lease of `run` naming `address`."""
    asyncio.run(RunLeases(Bucket(url), "forger", address, 3600.0).acquire(run))


def daemon_on(tmp_path: Path, url: str, daemons: list[Daemon], *flags: str) -> Daemon:
    """A daemon on the bucket that takes only `TOKEN`."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN} *\n")
    daemons.append(start_bucket_daemon(tmp_path, url, "--token-file", str(tokens), *flags))
    return daemons[-1]


def refusal(address: str, session_id: str, run: str) -> grpc.RpcError:
    with grpc.insecure_channel(address) as channel:
        request = pb.OpenSessionRequest(session_id=session_id, run=run, next_sequence=1)
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.SummariesStub(channel).OpenSession(request, metadata=(("authorization", f"Bearer {TOKEN}"),))
    return caught.value


def test_a_writer_sends_nothing_to_the_address_of_a_forged_lease(
    tmp_path: Path, logdir_url: str, capture: Loopback, daemons: list[Daemon]
) -> None:
    daemon = daemon_on(tmp_path, logdir_url, daemons)
    forge_lease(logdir_url, "forged", capture.address)
    writer = SummaryWriter("forged", address=daemon.address, token=TOKEN, backoff_secs=(0.05, 0.2))
    log_losses(writer, range(10))
    report = writer.close(timeout=2)
    assert capture.recorder.calls == []
    assert report.delivered == 0 and report.error is not None and "not followed" in report.error


def test_summaryd_ship_and_replay_send_nothing_to_the_address_of_a_forged_lease(
    tmp_path: Path,
    logdir_url: str,
    capture: Loopback,
    daemons: list[Daemon],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    daemon = daemon_on(tmp_path, logdir_url, daemons)
    for run in ("shipped", "left"):  # `left`: the run of the spool
        forge_lease(logdir_url, run, capture.address)
    spool = leave_a_spool(tmp_path / "spool", unused_port())
    append(tmp_path / "logs" / "events.out.tfevents.1.host", VERSION_RECORD, *(scalar(s) for s in range(5)))
    monkeypatch.setenv("SUMMARYD_TOKEN", TOKEN)
    capsys.readouterr()
    assert main(["ship", str(tmp_path / "logs"), "--run", "shipped", "--once", "--address", daemon.address]) == 1
    assert "not followed" in capsys.readouterr().err.splitlines()[-1]
    assert main(["replay", str(spool), "--address", daemon.address]) == 1
    assert "not followed" in capsys.readouterr().out and spool.is_dir()
    assert capture.recorder.calls == []


def test_a_daemon_with_peers_names_no_lease_address_outside_them(
    tmp_path: Path, logdir_url: str, capture: Loopback, daemons: list[Daemon]
) -> None:
    peer = "10.255.0.9:6065"
    daemon = daemon_on(tmp_path, logdir_url, daemons, "--peers", peer)
    forge_lease(logdir_url, "forged", capture.address)
    error = refusal(daemon.address, str(uuid.uuid4()), "forged")
    assert error.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    assert OWNER_ADDRESS_KEY not in dict(error.trailing_metadata() or ())  # type: ignore[attr-defined]
    assert capture.address not in error.details()  # type: ignore[attr-defined]
    assert f"names the address '{capture.address}', not one of --peers" in daemon.log_path.read_text()
    forge_lease(logdir_url, "elsewhere", peer)  # a peer's lease is still a redirect to it
    error = refusal(daemon.address, str(uuid.uuid4()), "elsewhere")
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    assert dict(error.trailing_metadata())[OWNER_ADDRESS_KEY] == peer  # type: ignore[attr-defined]


def test_a_session_id_that_could_leave_its_key_is_refused_without_naming_the_store(
    tmp_path: Path, logdir_url: str, daemons: list[Daemon]
) -> None:
    daemon = daemon_on(tmp_path, logdir_url, daemons)
    for session_id in ("../../leases/x", "a/b", "a\\b", "."):
        error = refusal(daemon.address, session_id, "run")
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert error.details() == "session_id may not contain '/', '\\' or '..', nor be '.'; send a UUID"  # type: ignore[attr-defined]


def test_a_daemon_without_peers_names_no_lease_address_that_is_no_host_and_port(
    tmp_path: Path, logdir_url: str, daemons: list[Daemon]
) -> None:
    daemon = daemon_on(tmp_path, logdir_url, daemons)
    for number, address in enumerate(("", "unix:/tmp/summaryd.sock", "http://evil.example:1/", "evil.example")):
        run = f"odd-{number}"
        forge_lease(logdir_url, run, address)
        error = refusal(daemon.address, str(uuid.uuid4()), run)
        assert error.code() == grpc.StatusCode.UNAVAILABLE, address  # type: ignore[attr-defined]
        assert OWNER_ADDRESS_KEY not in dict(error.trailing_metadata() or ())  # type: ignore[attr-defined]
