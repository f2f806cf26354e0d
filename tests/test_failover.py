"""Several daemons on one bucket logdir: run leases decide which daemon writes a run, the others redirect.

Against a real SeaweedFS (the fixtures of `test_objstore`) and real daemons; the leases are read back from the
bucket as the daemons wrote them.
"""

from __future__ import annotations

import asyncio
import collections
import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from _bucket import daemon_in, lease_of, segments, start_bucket_daemon, steps_from_bucket
from _seaweed import SeaweedServer
from _support import Daemon, log_losses, unused_port, wait_for
from summaryd.cli import main
from summaryd.client import SummaryWriter
from summaryd.server.storage.bucket.leases import RunLeases
from summaryd.server.storage.bucket.store import Bucket
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import OWNER_ADDRESS_KEY

pytestmark = pytest.mark.objstore


def open_session(address: str, run: str) -> pb.OpenSessionResponse:
    with grpc.insecure_channel(address) as channel:
        request = pb.OpenSessionRequest(session_id=str(uuid.uuid4()), run=run, next_sequence=1)
        answer: pb.OpenSessionResponse = pb_grpc.SummariesStub(channel).OpenSession(request, timeout=30)
        return answer


def refusal(address: str, run: str) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.RpcError) as caught:
        open_session(address, run)
    error = caught.value
    trailing = {key: value for key, value in (error.trailing_metadata() or ())}  # type: ignore[attr-defined]
    return error.code(), error.details(), trailing  # type: ignore[attr-defined]


def steps_of(seaweed: SeaweedServer, url: str, tmp_path: Path) -> collections.Counter[int]:
    """Steps of the run `moving` uploaded so far (read into a fresh directory each time)."""
    return steps_from_bucket(seaweed, url, "moving", tmp_path / f"peek-{uuid.uuid4().hex[:8]}")


def test_two_daemons_on_one_bucket_each_write_their_own_runs(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    daemons += [daemon_in(tmp_path / name, logdir_url) for name in ("a", "b")]
    a, b = daemons
    with SummaryWriter("left", address=a.address) as left, SummaryWriter("right", address=b.address) as right:
        log_losses(left, range(100))
        log_losses(right, range(100))
        left.flush(timeout=10)
        right.flush(timeout=10)
        # Each run's lease names the daemon writing it, while its sessions are open.
        held = {run: lease_of(logdir_url, run) for run in ("left", "right")}
        assert {run: lease.address for run, lease in held.items() if lease} == {"left": a.address, "right": b.address}
        assert all(lease is not None and lease.expires > time.time() for lease in held.values())
    for daemon in daemons:
        assert daemon.terminate() == 0
    for run in ("left", "right"):
        assert steps_from_bucket(seaweed, logdir_url, run, tmp_path / run) == collections.Counter(range(100))
        lease = lease_of(logdir_url, run)
        assert lease is not None and lease.expires < time.time()  # released when the run closed


def test_a_run_written_by_another_daemon_is_refused_naming_its_owner(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    daemons += [daemon_in(tmp_path / name, logdir_url) for name in ("a", "b")]
    a, b = daemons
    open_session(a.address, "shared")  # a owns the run while the session is live
    code, details, trailing = refusal(b.address, "shared")
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert trailing[OWNER_ADDRESS_KEY] == a.address and a.address in details
    open_session(a.address, "shared")  # a second worker of the run on its owner: taken
    open_session(b.address, "other")  # b still takes runs nobody writes


def test_an_expired_lease_is_taken_over_and_a_live_one_is_not(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    bucket = Bucket(logdir_url)
    gone = RunLeases(bucket, "gone-daemon", "10.255.0.1:6065", 30.0, clock=lambda: time.time() - 3600)
    alive = RunLeases(bucket, "live-daemon", "10.255.0.2:6065", 3600.0)
    asyncio.run(gone.acquire("stale"))
    asyncio.run(alive.acquire("held"))
    daemons.append(start_bucket_daemon(tmp_path, logdir_url))
    (daemon,) = daemons

    code, _, trailing = refusal(daemon.address, "held")
    assert (code, trailing[OWNER_ADDRESS_KEY]) == (grpc.StatusCode.FAILED_PRECONDITION, "10.255.0.2:6065")

    with SummaryWriter("stale", address=daemon.address) as writer:
        log_losses(writer, range(50))
        writer.flush(timeout=10)
        lease = lease_of(logdir_url, "stale")
        assert lease is not None and lease.address == daemon.address and lease.holder != "gone-daemon"
    daemon.terminate()
    assert steps_from_bucket(seaweed, logdir_url, "stale", tmp_path / "read") == collections.Counter(range(50))


def test_a_daemon_back_on_its_address_without_its_state_takes_its_runs_over_at_once(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    port = unused_port()
    daemons.append(daemon_in(tmp_path / "a", logdir_url, "--listen", f"127.0.0.1:{port}", "--run-lease", "3600"))
    first = daemons[0]
    with grpc.insecure_channel(first.address) as channel:
        opened = pb_grpc.SummariesStub(channel).OpenSession(
            pb.OpenSessionRequest(session_id=str(uuid.uuid4()), run="mine", next_sequence=1), timeout=30
        )
    assert opened.durable_acks
    before = lease_of(logdir_url, "mine")
    assert before is not None and before.address == first.address
    # Lost with its disk (a new id), back on the same address: the live lease is its own previous incarnation's.
    first.proc.kill()
    first.proc.wait(30)
    shutil.rmtree(tmp_path / "a" / "state")
    daemons.append(daemon_in(tmp_path / "a", logdir_url, "--listen", f"127.0.0.1:{port}", "--run-lease", "3600"))
    again = daemons[1]
    assert again.address == first.address
    with SummaryWriter("mine", address=again.address) as writer:
        log_losses(writer, range(20))
    after = lease_of(logdir_url, "mine")
    assert after is not None and after.holder != before.holder  # taken by the new id (and released at the close)
    assert again.terminate() == 0
    assert steps_from_bucket(seaweed, logdir_url, "mine", tmp_path / "read") == collections.Counter(range(20))


def test_a_held_lease_is_renewed_before_it_expires(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    daemons.append(start_bucket_daemon(tmp_path, logdir_url, "--run-lease", "1.5"))
    open_session(daemons[0].address, "kept")
    first = lease_of(logdir_url, "kept")
    assert first is not None

    def renewed() -> bool:
        later = lease_of(logdir_url, "kept")
        return later is not None and later.holder == first.holder and later.expires > first.expires

    wait_for(renewed, 30, "the lease to be renewed")  # every 0.5 s
    daemons.append(daemon_in(tmp_path / "b", logdir_url))
    _, _, trailing = refusal(daemons[1].address, "kept")
    assert trailing[OWNER_ADDRESS_KEY] == daemons[0].address


def test_two_clients_of_one_run_on_two_daemons_end_on_one_daemon(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    daemons += [daemon_in(tmp_path / name, logdir_url) for name in ("a", "b")]
    a, b = daemons
    first = SummaryWriter("job", address=a.address)
    try:
        first.add_scalar("first", 0.0, 0)
        first.flush(timeout=10)  # a owns the run from here
        # The second worker is sent to b, which refuses it naming a, one of its addresses; it follows and writes
        # there (an owner it was not given it would not follow: `test_redirect`).
        with SummaryWriter("job", address=f"{b.address},{a.address}", backoff_secs=(0.05, 0.2)) as second:
            log_losses(second, range(100), "second")
        log_losses(first, range(1, 100), "first")
    finally:
        first.close()
    for daemon in daemons:
        daemon.terminate()
    assert not (tmp_path / "b" / "state" / "staging" / "job").exists()  # b never wrote the run
    assert list((tmp_path / "a" / "state" / "staging" / "job").glob("*tfevents*"))
    assert steps_from_bucket(seaweed, logdir_url, "job", tmp_path / "read") == collections.Counter(
        [*range(100), *range(100)]
    )


def test_the_workers_of_one_run_on_two_daemons_end_on_one_daemon(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    """A run's lease covers all its workers (and their aggregates): rank-1, sent to b, is redirected to a."""
    daemons += [daemon_in(tmp_path / name, logdir_url) for name in ("a", "b")]
    a, b = daemons
    rank0 = SummaryWriter("ranks", worker="rank-0", world_size=2, address=a.address)
    try:
        rank0.add_scalar("loss", 0.0, 0)
        rank0.flush(timeout=10)  # a owns the run `ranks` from here
        code, _, trailing = refusal(b.address, "ranks")
        assert code == grpc.StatusCode.FAILED_PRECONDITION and trailing[OWNER_ADDRESS_KEY] == a.address
        allow = {"redirect_allow": a.address, "backoff_secs": (0.05, 0.2)}  # a, not listed: followed when allowed
        with SummaryWriter("ranks", worker="rank-1", world_size=2, address=b.address, **allow) as w:
            log_losses(w, range(100))
        log_losses(rank0, range(1, 100))
    finally:
        rank0.close()
    lease = lease_of(logdir_url, "ranks")
    for daemon in daemons:
        daemon.terminate()
    assert lease is not None and lease.address == a.address
    assert lease_of(logdir_url, "ranks/rank-1") is None  # no lease of its own: the run's covers it
    assert not (tmp_path / "b" / "state" / "staging" / "ranks").exists()  # b wrote no worker of the run
    for rank in ("rank-0", "rank-1"):
        assert list((tmp_path / "a" / "state" / "staging" / "ranks" / rank).glob("*tfevents*"))
        assert steps_from_bucket(seaweed, logdir_url, f"ranks/{rank}", tmp_path / f"read-{rank}") == (
            collections.Counter(range(100))
        )


def test_a_session_moves_to_another_daemon_on_the_bucket_when_its_daemon_dies(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    # Short run leases: the survivor takes the dead daemon's run over once its lease has expired.
    flags = ("--run-lease", "2", "--seal-secs", "0.2")
    daemons += [daemon_in(tmp_path / name, logdir_url, *flags) for name in ("a", "b")]
    a, b = daemons
    writer = SummaryWriter("moving", address=f"{a.address},{b.address}", backoff_secs=(0.05, 0.2))
    try:
        log_losses(writer, range(100))
        writer.flush(timeout=10)
        # What a acknowledged is uploaded before it dies (without a durable watermark, the client would not
        # send it again).
        wait_for(lambda: sum(steps_of(seaweed, logdir_url, tmp_path).values()) == 100, 60, "the first upload")
        a.proc.kill()
        a.proc.wait(30)
        log_losses(writer, range(100, 200))
    finally:
        writer.close(timeout=60)
    b.terminate()
    assert steps_from_bucket(seaweed, logdir_url, "moving", tmp_path / "read") == collections.Counter(range(200))
    assert list((tmp_path / "b" / "state" / "staging" / "moving").glob("*tfevents*"))


def test_status_shows_each_runs_lease_holder_staged_bytes_and_last_upload(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon], capsys: pytest.CaptureFixture[str]
) -> None:
    daemons.append(daemon_in(tmp_path, logdir_url, "--seal-secs", "3600", "--seal-bytes", "16384"))
    (daemon,) = daemons

    def status_of(run: str) -> dict[str, Any]:
        assert main(["status", "--address", daemon.address, "--json"]) == 0
        (found,) = [r for r in json.loads(capsys.readouterr().out)["runs"] if r["run_dir"] == run]
        return found

    with SummaryWriter("watched", address=daemon.address) as writer:
        writer.add_scalar("loss", 0.0, 0)
        writer.flush(timeout=10)
        before = status_of("watched")
        assert before["lease_holder"] == daemon.address
        assert before["staged_bytes"] >= before["bytes_written"] > 0 and before["last_upload_unix"] == 0
        log_losses(writer, range(1, 1000), flush_every=100)  # past --seal-bytes: uploads while the run is open
        writer.flush(timeout=10)
        wait_for(lambda: status_of("watched")["last_upload_unix"] > 0, 60, "a first upload")
        after = status_of("watched")
        assert 0 <= after["staged_bytes"] < after["bytes_written"]
        assert abs(time.time() - after["last_upload_age_seconds"] - after["last_upload_unix"]) < 60
        assert main(["status", "--address", daemon.address]) == 0
        table = capsys.readouterr().out
        assert "LEASE HOLDER" in table and daemon.address in table.split("OPEN RUN (BUCKET)")[1]


def test_status_names_the_bucket_logdir_not_its_staging_directory(
    tmp_path: Path, logdir_url: str, daemons: list[Daemon], capsys: pytest.CaptureFixture[str]
) -> None:
    daemons.append(daemon_in(tmp_path, logdir_url))
    (daemon,) = daemons
    assert main(["status", "--address", daemon.address, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["logdir"] == logdir_url
    assert main(["status", "--address", daemon.address]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(f"logdir {logdir_url}  (summaryd ")


def test_a_daemon_whose_lease_was_taken_over_releases_the_runs_sessions_and_redirects(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    daemons.append(daemon_in(tmp_path, logdir_url, "--run-lease", "1.5"))
    (daemon,) = daemons
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb_grpc.SummariesStub(channel)
        session = str(uuid.uuid4())
        stub.OpenSession(pb.OpenSessionRequest(session_id=session, run="stolen", next_sequence=1), timeout=30)
        write = pb.WriteRequest(session_id=session, first_sequence=1)
        assert len(list(stub.Write(iter([write]), timeout=10))) == 1  # live: a heartbeat is answered
        # Another daemon judges this one gone (its clock an hour ahead) and takes the run over.
        thief = RunLeases(Bucket(logdir_url), "thief", "10.255.0.3:6065", 30.0, clock=lambda: time.time() + 3600)
        asyncio.run(thief.acquire("stolen"))
        # At its next renewal the daemon learns it and releases the session: a heartbeat on it is turned away.

        def released() -> bool:
            try:
                list(stub.Write(iter([write]), timeout=10))
            except grpc.RpcError as exc:
                # Released having written nothing, it is not remembered: NOT_FOUND (else UNAVAILABLE, released).
                return exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND)
            return False

        wait_for(released, 30, "the session to be released")
    code, _, trailing = refusal(daemon.address, "stolen")  # resuming (or a new session) goes to the thief
    assert (code, trailing[OWNER_ADDRESS_KEY]) == (grpc.StatusCode.FAILED_PRECONDITION, "10.255.0.3:6065")
    assert "lease was taken over" in daemon.log_path.read_text()


def test_close_and_a_durable_flush_return_once_the_events_are_uploaded(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    # Sealing by age is off in effect, and another worker keeps the run's file open: only the calls upload.
    daemons.append(daemon_in(tmp_path, logdir_url, "--seal-secs", "3600"))
    (daemon,) = daemons
    keeper = SummaryWriter("durable", address=daemon.address)
    try:
        keeper.add_scalar("other", 0.0, 0)
        keeper.flush(timeout=10)
        assert segments(seaweed, logdir_url, "durable") == []
        with SummaryWriter("durable", address=daemon.address) as writer:
            log_losses(writer, range(50))
            writer.flush(durable=True)
            assert sorted(steps_from_bucket(seaweed, logdir_url, "durable", tmp_path / "flushed").elements()) == [
                0,
                *range(50),
            ]
            log_losses(writer, range(50, 100))
        # Closed: uploaded before close() returned, while the run's file stays open for the keeper.
        steps = steps_from_bucket(seaweed, logdir_url, "durable", tmp_path / "closed")
        assert steps == collections.Counter([0, *range(100)])
    finally:
        keeper.close()

    # The run's last session gone and its last bytes uploaded, the lease is given up (the daemon still runs).
    def released() -> bool:
        lease = lease_of(logdir_url, "durable")
        return lease is not None and lease.expires < time.time()

    wait_for(released, 30, "the lease to be released")
