"""The durable watermark and session state in the bucket: a daemon lost with its disk loses nothing.

Against a real SeaweedFS and real daemons (the fixtures of `test_objstore`); the session state is read back
from the bucket as the daemons wrote it, the run's segments with TensorBoard's loader.
"""

from __future__ import annotations

import collections
import shutil
import uuid
from pathlib import Path

import grpc
import pytest

from _bucket import batch, daemon_in, state_of, steps_from_bucket, stub_of, write
from _seaweed import SeaweedServer
from _support import Daemon, log_losses, wait_for
from summaryd.client import SummaryWriter
from summaryd.server.storage.bucket.sessions import BucketSessions, DurableSession
from summaryd.server.storage.bucket.store import Bucket
from summaryd.v1 import summaryd_pb2 as pb

pytestmark = pytest.mark.objstore


async def test_session_state_never_moves_back_and_merges_closed(logdir_url: str) -> None:
    sessions = BucketSessions(Bucket(logdir_url))
    assert await sessions.get("s") is None
    await sessions.put(DurableSession("s", "run", 10, False))
    await sessions.put(DurableSession("s", "run", 7, True))  # a late, lower watermark does not win
    assert await sessions.get("s") == DurableSession("s", "run", 10, True)


def test_a_lost_daemons_session_resumes_on_another_at_its_durable_sequence(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon], channels: list[grpc.Channel]
) -> None:
    # Sealing by age is off in effect: only the durable flush uploads. Short run leases: b takes the run over.
    flags = ("--run-lease", "2", "--seal-secs", "3600")
    daemons += [daemon_in(tmp_path / name, logdir_url, *flags) for name in ("a", "b")]
    a, b = daemons
    session = str(uuid.uuid4())
    to_a = stub_of(a.address, channels)
    opened = to_a.OpenSession(pb.OpenSessionRequest(session_id=session, run="lost", next_sequence=1), timeout=30)
    assert opened.durable_acks and opened.durable_sequence == 0
    ack = write(to_a, batch(session, 1, 50))
    assert (ack.acked_sequence, ack.durable_sequence) == (50, 0)  # staged, not uploaded
    to_a.Flush(pb.FlushRequest(session_id=session, durable=True), timeout=30)

    def durable_on_a() -> int:
        return int(write(to_a, pb.WriteRequest(session_id=session)).durable_sequence)  # a heartbeat's ack

    wait_for(lambda: durable_on_a() == 50, 30, "the durable watermark to reach 50")
    assert state_of(logdir_url, session) == DurableSession(session, "lost", 50, False)
    ack = write(to_a, batch(session, 51, 80))
    assert (ack.acked_sequence, ack.durable_sequence) == (80, 50)  # 51..80 staged on a only

    # a is lost with its disk: its staged 51..80 are gone.
    a.proc.kill()
    a.proc.wait(30)
    shutil.rmtree(tmp_path / "a" / "state")

    # b does not know the session; once a's lease on the run has expired it resumes it from the bucket.
    to_b = stub_of(b.address, channels)
    resumed: list[pb.OpenSessionResponse] = []

    def reopened() -> bool:
        request = pb.OpenSessionRequest(session_id=session, run="lost", next_sequence=51)
        try:
            resumed.append(to_b.OpenSession(request, timeout=30))
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc  # the lease of a, until it expires
            return False
        return True

    wait_for(reopened, 30, "b to take the run over")
    assert (resumed[0].last_sequence, resumed[0].durable_sequence) == (50, 50)
    # The client resends what was not durable; b drops what the bucket holds (41..50) and writes the rest once.
    ack = write(to_b, batch(session, 41, 80), batch(session, 81, 100))
    assert ack.acked_sequence == 100
    closed = to_b.CloseSession(pb.CloseSessionRequest(session_id=session), timeout=30)
    assert closed.acked_sequence == 100
    assert state_of(logdir_url, session) == DurableSession(session, "lost", 100, True)
    assert steps_from_bucket(seaweed, logdir_url, "lost", tmp_path / "read") == collections.Counter(range(100))


def test_a_client_fails_over_from_a_lost_daemon_and_nothing_is_lost_or_doubled(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    # Sealing by age is off in effect on a: what it acknowledged after the durable flush is only staged there.
    daemons += [
        daemon_in(tmp_path / "a", logdir_url, "--run-lease", "2", "--seal-secs", "3600"),
        daemon_in(tmp_path / "b", logdir_url, "--run-lease", "2", "--seal-secs", "0.2"),
    ]
    a, b = daemons
    writer = SummaryWriter("moving", address=f"{a.address},{b.address}", backoff_secs=(0.05, 0.2))
    try:
        log_losses(writer, range(50))
        writer.flush(durable=True)  # 0..49 in the bucket
        log_losses(writer, range(50, 100))
        writer.flush(timeout=10)  # 50..99 acknowledged: staged on a, not uploaded
        assert steps_from_bucket(seaweed, logdir_url, "moving", tmp_path / "before") == collections.Counter(range(50))
        # a is lost with its disk (staging and state): the client resends what was not durable to b.
        a.proc.kill()
        a.proc.wait(30)
        shutil.rmtree(tmp_path / "a" / "state")
        log_losses(writer, range(100, 150))
    finally:
        report = writer.close(timeout=60)
    assert report.delivered == 150 and not report.dropped
    assert b.terminate() == 0
    assert steps_from_bucket(seaweed, logdir_url, "moving", tmp_path / "read") == collections.Counter(range(150))


@pytest.mark.parametrize("uploads", [1, 2])
def test_a_daemon_lost_between_an_upload_and_the_state_write_doubles_nothing(
    tmp_path: Path,
    seaweed: SeaweedServer,
    logdir_url: str,
    daemons: list[Daemon],
    channels: list[grpc.Channel],
    monkeypatch: pytest.MonkeyPatch,
    uploads: int,
) -> None:
    # The instant between a segment's upload and the write of the session's state cannot be hit by timing: a
    # test-only switch, read once at the daemon's start, makes a exit right after its `uploads`-th segment
    # (its first: before the state ever held a watermark; its second: one watermark behind).
    flags = ("--run-lease", "2", "--seal-secs", "3600")
    monkeypatch.setenv("SUMMARYD_TEST_EXIT_AFTER_UPLOADS", str(uploads))
    daemons.append(daemon_in(tmp_path / "a", logdir_url, *flags))
    monkeypatch.delenv("SUMMARYD_TEST_EXIT_AFTER_UPLOADS")
    daemons.append(daemon_in(tmp_path / "b", logdir_url, *flags))
    a, b = daemons
    session = str(uuid.uuid4())
    to_a = stub_of(a.address, channels)
    to_a.OpenSession(pb.OpenSessionRequest(session_id=session, run="torn", next_sequence=1), timeout=30)
    durable = 50 * (uploads - 1)  # what the state counts: the segments before the last
    if durable:
        assert write(to_a, batch(session, 1, durable)).acked_sequence == durable
        to_a.Flush(pb.FlushRequest(session_id=session, durable=True), timeout=30)

        def published() -> bool:
            return bool(write(to_a, pb.WriteRequest(session_id=session)).durable_sequence == durable)

        wait_for(published, 30, "the durable watermark")
    assert write(to_a, batch(session, durable + 1, durable + 50)).acked_sequence == durable + 50
    with pytest.raises(grpc.RpcError):  # a uploads the segment and is gone before it writes the state
        to_a.Flush(pb.FlushRequest(session_id=session, durable=True), timeout=30)
    assert a.proc.wait(30) == 70
    shutil.rmtree(tmp_path / "a" / "state")
    uploaded = 50 * uploads
    state = state_of(logdir_url, session)
    assert state is not None and state.durable == durable < uploaded  # the state does not count the last segment

    # b resumes the session from the bucket; the client resends everything after the state's watermark.
    to_b = stub_of(b.address, channels)
    resumed: list[pb.OpenSessionResponse] = []

    def reopened() -> bool:
        request = pb.OpenSessionRequest(session_id=session, run="torn", next_sequence=durable + 1)
        try:
            resumed.append(to_b.OpenSession(request, timeout=30))
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc  # a's lease, until it expires
            return False
        return True

    wait_for(reopened, 30, "b to take the run over")
    assert (resumed[0].last_sequence, resumed[0].durable_sequence) == (uploaded, uploaded)
    assert write(to_b, batch(session, durable + 1, uploaded + 30)).acked_sequence == uploaded + 30
    to_b.CloseSession(pb.CloseSessionRequest(session_id=session), timeout=30)
    steps = steps_from_bucket(seaweed, logdir_url, "torn", tmp_path / "read")
    assert steps == collections.Counter(range(uploaded + 30))
