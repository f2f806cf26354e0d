"""Limits on everything a client controls: over one, a clear status naming the limit's flag, and what was
accepted before stays whole."""

from __future__ import annotations

import resource
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from _support import Daemon, assert_whole_records, event_files, read_events, replay, start_daemon, unused_port, wait_for
from summaryd.client import Sender, SummaryWriter
from summaryd.server.config import Config
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

Spawn = Callable[..., tuple[Daemon, pb_grpc.SummariesStub]]


def scalar(step: int, tag: str = "s", pad: int = 0) -> bytes:
    value = Summary.Value(tag=tag, simple_value=float(step))
    if pad:
        value.metadata.plugin_data.content = b"x" * pad
    return Event(wall_time=1.0 + step, step=step, summary=Summary(value=[value])).SerializeToString()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Start a daemon with the given flags and a stub on it; every daemon is stopped by pid at the end."""
    started: list[tuple[Daemon, grpc.Channel]] = []

    def start(*flags: str, address: str | None = None) -> tuple[Daemon, pb_grpc.SummariesStub]:
        daemon = start_daemon(tmp_path, *flags, logdir=tmp_path / f"runs-{len(started)}")
        channel = grpc.insecure_channel(address.format(port=daemon.port) if address else daemon.address)
        started.append((daemon, channel))
        return daemon, pb_grpc.SummariesStub(channel)

    yield start
    for daemon, channel in started:
        channel.close()
        daemon.terminate()


def open_session(stub: pb_grpc.SummariesStub, run: str = "lim") -> str:
    session_id = str(uuid.uuid4())
    stub.OpenSession(pb.OpenSessionRequest(session_id=session_id, run=run), timeout=10)
    return session_id


def write(stub: pb_grpc.SummariesStub, session_id: str, first: int, events: list[bytes]) -> int:
    [ack] = stub.Write(iter([pb.WriteRequest(session_id=session_id, first_sequence=first, events=events)]), timeout=10)
    return ack.acked_sequence


def refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def steps_in(daemon: Daemon, run: str) -> list[int]:
    [path] = event_files(daemon.logdir / run)
    assert_whole_records(path)
    return [e.step for e in read_events(path) if e.HasField("summary")]


def test_message_size(spawn: Spawn) -> None:
    daemon, stub = spawn("--max-message-bytes", "20000", "--max-event-bytes", "10000")
    session = open_session(stub)
    assert write(stub, session, 1, [scalar(0, pad=5000), scalar(1, pad=5000)]) == 2
    error = refused(lambda: write(stub, session, 3, [scalar(step, pad=5000) for step in range(2, 7)]))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-message-bytes" in (error.details() or "")
    assert steps_in(daemon, "lim") == [0, 1]


def test_events_per_batch(spawn: Spawn) -> None:
    daemon, stub = spawn("--max-batch-events", "3")
    session = open_session(stub)
    assert write(stub, session, 1, [scalar(0), scalar(1), scalar(2)]) == 3
    error = refused(lambda: write(stub, session, 4, [scalar(step) for step in range(3, 7)]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "4 events" in error.details() and "--max-batch-events" in error.details()
    assert steps_in(daemon, "lim") == [0, 1, 2]


def test_event_size(spawn: Spawn) -> None:
    daemon, stub = spawn("--max-event-bytes", "2000")
    session = open_session(stub)
    assert write(stub, session, 1, [scalar(0, pad=1900)]) == 1
    error = refused(lambda: write(stub, session, 2, [scalar(1), scalar(2, pad=2100)]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "event 1 of the batch" in error.details() and "--max-event-bytes" in error.details()
    assert steps_in(daemon, "lim") == [0]  # the whole batch is refused, its good event too


def test_tag_length(spawn: Spawn) -> None:
    daemon, stub = spawn("--max-tag-bytes", "8")
    session = open_session(stub)
    assert write(stub, session, 1, [scalar(0, tag="t" * 8), scalar(1, tag="é" * 4)]) == 2
    for tag in ("t" * 9, "é" * 5):  # 5 characters, 10 UTF-8 bytes
        error = refused(lambda tag=tag: write(stub, session, 3, [scalar(2, tag=tag)]))  # type: ignore[misc]
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "--max-tag-bytes" in error.details()
    assert steps_in(daemon, "lim") == [0, 1]


def test_an_event_over_a_limit_costs_only_itself(spawn: Spawn) -> None:
    """A tag over --max-tag-bytes amid good scalars of the same batch: the daemon names the event, the client
    drops it alone (counted, logged) and delivers the rest, in order."""
    daemon, _ = spawn("--max-tag-bytes", "64")
    # A long linger: all 21 events wait for one batch.
    writer = SummaryWriter("one-bad", address=daemon.address, worker="", linger_secs=2.0)
    for step in range(21):
        writer.add_scalar("x" * 100 if step in (7, 15) else "good", float(step), step)
    report = writer.close(timeout=10)
    assert (report.delivered, dict(report.dropped), report.synced) == (19, {"rejected": 2}, True)
    assert "--max-tag-bytes" in (report.error or "")
    assert steps_in(daemon, "one-bad") == [s for s in range(21) if s not in (7, 15)]


def test_batches_are_cut_to_the_limits_the_daemon_states(spawn: Spawn) -> None:
    """A daemon that takes smaller messages and batches than the client's defaults (1 MiB, 1,024 events): the
    client learns its limits when the session opens and cuts its batches to fit, so that none is refused (a batch
    over the message limit used to be refused whole and resent forever)."""
    daemon, stub = spawn("--max-message-bytes", "65536", "--max-batch-events", "300")
    answer = stub.OpenSession(pb.OpenSessionRequest(session_id=str(uuid.uuid4()), run="probe"), timeout=10)
    assert (answer.max_message_bytes, answer.max_batch_events) == (65536, 300)
    assert answer.max_event_bytes == Config().limits.max_event_bytes
    writer = SummaryWriter("cut", address=daemon.address, worker="", linger_secs=1.0)
    tag = "t" * 200  # events of about 230 bytes: 1,024 of them are 3.5 times the message limit
    for step in range(3000):
        writer.add_scalar(tag, float(step), step)
    report = writer.close(timeout=20)
    assert (report.delivered, dict(report.dropped), report.synced) == (3000, {}, True)
    assert steps_in(daemon, "cut") == list(range(3000))


def test_a_spool_made_for_a_larger_daemon_is_cut_to_the_one_that_returns(tmp_path: Path) -> None:
    """Batches numbered and spooled while no daemon was there are cut when they are sent to the daemon that
    comes up with smaller limits: all delivered, in order (not refused whole, or resent forever)."""
    port, spool_root = unused_port(), tmp_path / "spool"
    sender = Sender("later", address=f"127.0.0.1:{port}", worker="", spool_dir=spool_root, spool_after=0.3)
    for step in range(3000):
        sender.submit(scalar(step, tag="t" * 200), 240)
    wait_for(lambda: sender.report().spooled == 3000, 30, "the events to be spooled")
    daemon = start_daemon(tmp_path, "--listen", f"127.0.0.1:{port}", "--max-message-bytes", "65536")
    try:
        report = sender.close(timeout=60)
        assert (report.delivered, dict(report.dropped), report.synced) == (3000, {}, True)
        assert steps_in(daemon, "later") == list(range(3000))
    finally:
        daemon.terminate()


def test_replay_cuts_a_spool_to_the_daemons_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`summaryd replay` sends a spool in batches the daemon it meets takes."""
    spool_root = tmp_path / "spool"
    writer = SummaryWriter("replayed", address=f"127.0.0.1:{unused_port()}", worker="", spool_dir=spool_root)
    for step in range(3000):
        writer.add_scalar("t" * 200, float(step), step)
    assert writer.close(timeout=2).spooled == 3000
    daemon = start_daemon(tmp_path, "--max-message-bytes", "65536", "--max-batch-events", "100")
    try:
        [result] = replay(spool_root, daemon.address, capsys)
        assert (result["ok"], result["sent"]) == (True, 3000)
        assert steps_in(daemon, "replayed") == list(range(3000))
    finally:
        daemon.terminate()


def test_an_event_no_message_can_carry_is_dropped_alone(spawn: Spawn, caplog: pytest.LogCaptureFixture) -> None:
    """An event larger than the daemon's --max-message-bytes, amid scalars: the client drops it before sending
    (counted as rejected, logged naming the flag) and delivers the rest in order; close() does not hang."""
    daemon, _ = spawn("--max-message-bytes", "65536")
    writer = SummaryWriter("huge", address=daemon.address, worker="", linger_secs=1.0)
    for step in range(20):
        if step == 10:
            writer.add_text("notes", "n" * 100_000, step)
        writer.add_scalar("loss", float(step), step)
    with caplog.at_level("ERROR", logger="summaryd"):
        report = writer.close(timeout=20)
    assert (report.delivered, dict(report.dropped), report.synced) == (20, {"rejected": 1}, True)
    assert steps_in(daemon, "huge") == list(range(20))
    assert any("--max-message-bytes" in record.getMessage() for record in caplog.records)


def test_run_path_length(spawn: Spawn) -> None:
    daemon, stub = spawn("--max-run-path-bytes", "10")
    session = open_session(stub, run="r" * 10)
    assert write(stub, session, 1, [scalar(0)]) == 1
    error = refused(lambda: open_session(stub, run="r" * 11))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "11 bytes" in error.details() and "--max-run-path-bytes" in error.details()
    assert not (daemon.logdir / ("r" * 11)).exists()
    assert steps_in(daemon, "r" * 10) == [0]


def test_run_path_depth(spawn: Spawn) -> None:
    daemon, stub = spawn("--max-run-depth", "2")
    session = open_session(stub, run="a/b")
    assert write(stub, session, 1, [scalar(0)]) == 1
    error = refused(lambda: open_session(stub, run="a/b/c"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--max-run-depth" in error.details()
    assert not (daemon.logdir / "a" / "b" / "c").exists()
    assert steps_in(daemon, "a/b") == [0]


def test_sessions_in_total(spawn: Spawn) -> None:
    daemon, stub = spawn("--max-sessions", "2")
    first, second = open_session(stub, "one"), open_session(stub, "two")
    assert write(stub, first, 1, [scalar(0)]) == 1
    error = refused(lambda: open_session(stub, "three"))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-sessions" in error.details() and "per-peer" not in error.details()
    assert not (daemon.logdir / "three").exists()
    # A live session reopening (a reconnect) is no new session; a closed one makes room.
    stub.OpenSession(pb.OpenSessionRequest(session_id=first, run="one"), timeout=10)
    stub.CloseSession(pb.CloseSessionRequest(session_id=second), timeout=10)
    third = open_session(stub, "three")
    assert write(stub, third, 1, [scalar(5)]) == 1
    assert write(stub, first, 2, [scalar(1)]) == 2
    assert steps_in(daemon, "one") == [0, 1]
    assert steps_in(daemon, "three") == [5]


def test_sessions_per_peer(spawn: Spawn) -> None:
    # Listening on localhost, the daemon sees 127.0.0.1 and ::1 as two client addresses.
    daemon, over_v4 = spawn("--listen", "localhost:0", "--max-sessions-per-peer", "2", "--max-sessions", "10")
    with grpc.insecure_channel(f"[::1]:{daemon.port}") as channel:
        over_v6 = pb_grpc.SummariesStub(channel)
        first = open_session(over_v4, "one")
        open_session(over_v4, "two")
        assert write(over_v4, first, 1, [scalar(0)]) == 1
        error = refused(lambda: open_session(over_v4, "three"))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "127.0.0.1" in error.details() and "--max-sessions-per-peer" in error.details()
        other = open_session(over_v6, "three")
        assert write(over_v6, other, 1, [scalar(7)]) == 1
        open_session(over_v6, "four")
        error = refused(lambda: open_session(over_v6, "five"))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "[::1]" in error.details() and "--max-sessions-per-peer" in error.details()
    assert steps_in(daemon, "one") == [0]
    assert steps_in(daemon, "three") == [7]


def test_open_runs(spawn: Spawn) -> None:
    daemon, stub = spawn("--max-open-runs", "2")
    a, b = open_session(stub, "a"), open_session(stub, "b")
    assert write(stub, a, 1, [scalar(0)]) == 1
    error = refused(lambda: open_session(stub, "c"))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-open-runs" in error.details()
    assert not (daemon.logdir / "c").exists()
    second_on_a = open_session(stub, "a")  # shares the open run
    assert write(stub, second_on_a, 1, [scalar(1)]) == 1
    stub.CloseSession(pb.CloseSessionRequest(session_id=b), timeout=10)
    c = open_session(stub, "c")
    assert write(stub, c, 1, [scalar(2)]) == 1
    assert steps_in(daemon, "a") == [0, 1]


def _open_files_limit(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as limits:
        line = next(line for line in limits if line.startswith("Max open files"))
    return int(line.split()[3])


def test_open_files_limit_is_raised_to_what_max_open_runs_needs(spawn: Spawn) -> None:
    """Many systems start processes with 1,024 open files; every open run holds three. A daemon started with
    a soft limit far below what --max-open-runs needs raises it (the hard limit allows) and serves them all."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    runs = 150
    assert hard == resource.RLIM_INFINITY or hard >= runs * 3 + 256, "this machine's hard limit is too low"
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))  # the daemon inherits it
    try:
        daemon, stub = spawn("--max-open-runs", str(runs))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert _open_files_limit(daemon.proc.pid) >= runs * 3 + 256
    sessions = [open_session(stub, f"many/run-{i}") for i in range(runs)]
    assert [write(stub, session, 1, [scalar(i)]) for i, session in enumerate(sessions)] == [1] * runs
    assert len(list((daemon.logdir / "many").iterdir())) == runs
    assert steps_in(daemon, f"many/run-{runs - 1}") == [runs - 1]


def test_stream_idle_time(spawn: Spawn) -> None:
    daemon, stub = spawn("--stream-idle-timeout", "1", "--session-lease", "2.9")
    session = open_session(stub)
    hang_up = threading.Event()

    def requests() -> Iterator[pb.WriteRequest]:
        yield pb.WriteRequest(session_id=session, first_sequence=1, events=[scalar(0), scalar(1)])
        hang_up.wait(30)  # then silence, the stream left open

    acks = []
    try:
        with pytest.raises(grpc.RpcError) as caught:
            for ack in stub.Write(requests(), timeout=20):
                acks.append(ack.acked_sequence)
    finally:
        hang_up.set()
    assert acks == [2]
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "--stream-idle-timeout" in caught.value.details()
    # The session itself lives on: the client reconnects and continues.
    assert write(stub, session, 3, [scalar(2)]) == 3
    assert steps_in(daemon, "lim") == [0, 1, 2]


def test_stream_idle_time_is_per_wait(spawn: Spawn) -> None:
    """The limit is on each wait for the next message, not on the stream: a stream whose messages come closer
    together than the limit lives on past it; then a silence as long as the limit ends it."""
    daemon, stub = spawn("--stream-idle-timeout", "1", "--session-lease", "2.9")
    session = open_session(stub)
    hang_up = threading.Event()

    def requests() -> Iterator[pb.WriteRequest]:
        for i in range(8):  # 8 messages 0.3 s apart: 2.4 s of stream, over twice the limit
            yield pb.WriteRequest(session_id=session, first_sequence=i + 1, events=[scalar(i)])
            time.sleep(0.3)
        hang_up.wait(30)

    acks = []
    try:
        with pytest.raises(grpc.RpcError) as caught:
            for ack in stub.Write(requests(), timeout=20):
                acks.append(ack.acked_sequence)
    finally:
        hang_up.set()
    assert acks == list(range(1, 9))
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert steps_in(daemon, "lim") == list(range(8))


def test_idle_time_must_outlast_heartbeats() -> None:
    with pytest.raises(ValueError, match="--stream-idle-timeout"):
        Config.from_options(session_lease=60, stream_idle_timeout=15)
    with pytest.raises(ValueError, match="--max-open-runs must be positive"):
        Config.from_options(max_open_runs=0)
    with pytest.raises(ValueError, match="--stream-window-bytes must be at least 65535"):
        Config(stream_window_bytes=1024)
    assert Config().limits.stream_idle_timeout > Config().session_lease / 3
