"""A daemon killed with SIGKILL and restarted on the same logdir: nothing lost, nothing doubled, files whole.

The daemon journals every batch (`<logdir>/.summaryd/open/*.journal`) before acknowledging it; at start-up it
cuts each file it left open back to the last journaled end and restores the sessions' sequence numbers, so a
resuming client's resend is deduplicated exactly.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from _support import Daemon, assert_whole_records, event_files, log_losses, read_events, start_daemon
from summaryd.server.storage.journal import FileJournal, encode
from summaryd.server.storage.runs import RunRegistry
from summaryd.server.storage.state import StateDir
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc
from summaryd.v1.wire import frame


def scalar(step: int, tag: str = "loss") -> bytes:
    summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(step))])
    return Event(wall_time=1.0 + step, step=step, summary=summary).SerializeToString()


def restart(daemon: Daemon, tmp_path: Path, *flags: str) -> Daemon:
    """SIGKILL the daemon and start a new one on the same port and logdir."""
    os.kill(daemon.proc.pid, signal.SIGKILL)
    daemon.proc.wait(30)
    return start_daemon(tmp_path, "--listen", f"127.0.0.1:{daemon.port}", *flags, logdir=daemon.logdir)


@pytest.fixture
def daemons(daemons: list[Daemon], tmp_path: Path) -> list[Daemon]:
    """The shared `daemons` list, with the first daemon of the test started."""
    daemons.append(start_daemon(tmp_path))
    return daemons


def stub_for(daemon: Daemon) -> tuple[grpc.Channel, pb_grpc.SummariesStub]:
    channel = grpc.insecure_channel(daemon.address)
    return channel, pb_grpc.SummariesStub(channel)


def open_session(stub: pb_grpc.SummariesStub, session_id: str, run: str, next_sequence: int = 1) -> int:
    request = pb.OpenSessionRequest(session_id=session_id, run=run, next_sequence=next_sequence)
    last: int = stub.OpenSession(request, timeout=10).last_sequence
    return last


def write(stub: pb_grpc.SummariesStub, session_id: str, first: int, steps: range) -> int:
    """Send `steps` as batches of 10 from sequence `first`; return the last ack."""
    events = [scalar(s) for s in steps]
    requests = [
        pb.WriteRequest(session_id=session_id, first_sequence=first + i, events=events[i : i + 10])
        for i in range(0, len(events), 10)
    ]
    return [a.acked_sequence for a in stub.Write(iter(requests), timeout=10)][-1]


def steps_in(run_dir: Path) -> collections.Counter[int]:
    """How often each step appears across the run's files, each file read whole to its end."""
    counts: collections.Counter[int] = collections.Counter()
    for path in event_files(run_dir):
        assert_whole_records(path)
        for event in read_events(path):
            if event.HasField("summary"):
                counts[event.step] += 1
    return counts


def test_torn_and_unacknowledged_batches_are_cut_and_resent_once(daemons: list[Daemon], tmp_path: Path) -> None:
    """What a SIGKILL mid-write leaves (whole records of an unjournaled batch, then a torn record) is cut at
    start-up; the resuming client learns the journaled sequence number and its resend lands exactly once."""
    session = str(uuid.uuid4())
    channel, stub = stub_for(daemons[0])
    with channel:
        open_session(stub, session, "torn")
        assert write(stub, session, 1, range(100)) == 100
    [path] = event_files(daemons[0].logdir / "torn")
    journaled_size = path.stat().st_size
    os.kill(daemons[0].proc.pid, signal.SIGKILL)
    daemons[0].proc.wait(30)
    # The daemon died after writing sequences 101..110 but before journaling them, and tore the next record.
    with open(path, "ab") as f:
        f.write(b"".join(frame(scalar(s)) for s in range(100, 110)))
        f.write(frame(scalar(110))[:17])
    assert path.stat().st_size > journaled_size

    daemons.append(start_daemon(tmp_path, "--listen", f"127.0.0.1:{daemons[0].port}", logdir=daemons[0].logdir))
    assert path.stat().st_size == journaled_size, "recovery did not cut the file back to its last journaled batch"
    assert "cut" in daemons[1].log() and "recovered 1 event files" in daemons[1].log()
    assert not os.listdir(daemons[0].logdir / ".summaryd" / "open")
    channel, stub = stub_for(daemons[1])
    with channel:
        # The client saw acks only up to 90; the daemon's journal says 100, and that wins.
        assert open_session(stub, session, "torn", next_sequence=91) == 100
        assert write(stub, session, 91, range(90, 130)) == 130
        stub.CloseSession(pb.CloseSessionRequest(session_id=session), timeout=10)
    counts = steps_in(daemons[0].logdir / "torn")
    assert sorted(counts) == list(range(130)) and set(counts.values()) == {1}
    files = event_files(daemons[0].logdir / "torn")
    assert len(files) == 2 and files[0] == path, "the resumed session must write a new file that sorts last"


def test_a_file_whose_header_never_became_whole_is_deleted(daemons: list[Daemon], tmp_path: Path) -> None:
    """Killed while creating a file: the journal names it but records no whole record; recovery removes it."""
    daemon = daemons[0]
    os.kill(daemon.proc.pid, signal.SIGKILL)
    daemon.proc.wait(30)
    run_dir = daemon.logdir / "half"
    run_dir.mkdir()
    name = "events.out.tfevents.0000000001.host.1.1"
    (run_dir / name).write_bytes(frame(Event(file_version="brain.Event:2").SerializeToString())[:9])
    (daemon.logdir / ".summaryd" / "open" / "x.journal").write_bytes(encode({"run": "half", "file": name}))
    daemons.append(start_daemon(tmp_path, logdir=daemon.logdir))
    assert event_files(run_dir) == []
    assert "1 files deleted" in daemons[1].log()


def test_sequence_numbers_and_closed_sessions_survive_a_restart(daemons: list[Daemon], tmp_path: Path) -> None:
    """After a graceful restart too: a resumed session drops what the daemon holds, a closed one stays closed,
    and a session cannot move to another run."""
    open_id, closed_id = str(uuid.uuid4()), str(uuid.uuid4())
    channel, stub = stub_for(daemons[0])
    with channel:
        open_session(stub, open_id, "kept")
        write(stub, open_id, 1, range(50))
        open_session(stub, closed_id, "done")
        write(stub, closed_id, 1, range(5))
        stub.CloseSession(pb.CloseSessionRequest(session_id=closed_id), timeout=10)
    assert daemons[0].terminate() == 0
    daemons.append(start_daemon(tmp_path, logdir=daemons[0].logdir))
    channel, stub = stub_for(daemons[1])
    with channel:
        assert open_session(stub, open_id, "kept", next_sequence=1) == 50
        assert write(stub, open_id, 1, range(50)) == 50  # all duplicates
        with pytest.raises(grpc.RpcError) as closed:
            open_session(stub, closed_id, "done")
        assert closed.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "was closed" in closed.value.details()
        assert stub.CloseSession(pb.CloseSessionRequest(session_id=closed_id), timeout=10).acked_sequence == 5
        with pytest.raises(grpc.RpcError) as moved:
            open_session(stub, open_id, "elsewhere")
        assert moved.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    counts = steps_in(daemons[0].logdir / "kept")
    assert sorted(counts) == list(range(50)) and set(counts.values()) == {1}


def test_one_daemon_per_logdir_and_its_state_is_invisible_to_tensorboard(daemons: list[Daemon]) -> None:
    """A second daemon on the same logdir refuses to start; TensorBoard sees runs, not the state directory,
    and no client may name a run inside it."""
    daemon = daemons[0]
    second = subprocess.run(
        [sys.executable, "-m", "summaryd.server", "serve", "--logdir", str(daemon.logdir), "--listen", "127.0.0.1:0"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1
    assert f"another summaryd (pid {daemon.proc.pid}) serves this logdir" in second.stderr
    channel, stub = stub_for(daemon)
    with channel:
        session = str(uuid.uuid4())
        open_session(stub, session, "visible")
        write(stub, session, 1, range(3))
        with pytest.raises(grpc.RpcError) as reserved:
            open_session(stub, str(uuid.uuid4()), ".summaryd/open")
        assert reserved.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (daemon.logdir / ".summaryd" / "sessions").exists()
    multiplexer = EventMultiplexer().AddRunsFromDirectory(str(daemon.logdir))
    multiplexer.Reload()
    assert sorted(multiplexer.Runs()) == ["visible"]


# One training process of the chaos test: logs `steps` scalars at a steady pace, then closes (generously).
CHAOS_CLIENT = textwrap.dedent(
    """
    import json, sys, time
    from summaryd.client import SummaryWriter

    address, rank, steps, spool_after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    writer = SummaryWriter("chaos", address=address, worker=f"rank-{rank}", world_size=8,
                           spool_after=spool_after, rpc_timeout=5.0, close_timeout=180.0)
    for step in range(steps):
        writer.add_scalar("loss", step, step)
        if step % 50 == 49:
            time.sleep(0.01)
    report = writer.close()
    print(json.dumps({"delivered": report.delivered, "undelivered": report.undelivered,
                      "dropped": dict(report.dropped), "synced": report.synced}))
    """
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_chaos_three_sigkills_exactly_400000_events(daemons: list[Daemon], tmp_path: Path) -> None:
    """8 clients x 50,000 scalars; the daemon is SIGKILLed and restarted three times at random moments while
    they stream. Afterwards TensorBoard's reader finds each (worker, tag, step) exactly once, 400,000 in all,
    and every file parses to its end."""
    workers, steps = 8, 50_000
    seed = os.environ.get("SUMMARYD_CHAOS_SEED", str(time.time_ns()))
    print(f"chaos seed {seed} (set SUMMARYD_CHAOS_SEED to replay these kill moments)")
    rng = random.Random(seed)
    env = {**os.environ, "SUMMARYD_SPOOL_DIR": str(tmp_path / "spool")}
    clients = [
        subprocess.Popen(
            # Half the clients spool after 1s without an ack, so the spool's own redelivery is in the chaos too.
            [sys.executable, "-c", CHAOS_CLIENT, daemons[0].address, str(rank), str(steps), "1" if rank % 2 else "60"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(workers)
    ]
    run_dirs = [daemons[0].logdir / "chaos" / f"rank-{rank}" for rank in range(workers)]
    try:
        deadline = time.monotonic() + 120
        while not all(event_files(d) for d in run_dirs):  # every client is streaming
            assert time.monotonic() < deadline and all(c.poll() is None for c in clients), daemons[-1].log()
            time.sleep(0.05)
        for kill in range(3):
            time.sleep(rng.uniform(0.2, 3.0))
            assert any(c.poll() is None for c in clients), f"the clients finished before kill {kill + 1}"
            daemons.append(restart(daemons[-1], tmp_path))
        outputs = [c.communicate(timeout=300) for c in clients]
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
    for client, (out, err) in zip(clients, outputs, strict=True):
        assert client.returncode == 0, err
        report = json.loads(out.strip().splitlines()[-1])
        assert report == {"delivered": steps, "undelivered": 0, "dropped": {}, "synced": True}, err
    assert "recovered" in "".join(d.log() for d in daemons[1:])
    total = 0
    for run_dir in run_dirs:
        counts: collections.Counter[tuple[str, int]] = collections.Counter()
        for path in event_files(run_dir):
            assert_whole_records(path)
            for event in read_events(path):
                for value in event.summary.value:
                    counts[(value.tag, event.step)] += 1
        assert sorted(counts) == [("loss", s) for s in range(steps)], f"{run_dir}: missing events"
        assert set(counts.values()) == {1}, f"{run_dir}: events written twice"
        total += sum(counts.values())
    assert total == workers * steps == 400_000


async def test_a_long_lived_file_keeps_its_journal_small(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A journal past its size limit is rewritten as one line per session, and recovery from it is exact."""
    monkeypatch.setattr(FileJournal, "compact_above", 4096)
    logdir = tmp_path / "runs"
    executor = ThreadPoolExecutor(2)
    try:
        state = StateDir(str(logdir / ".summaryd"), retention_secs=86400)
        registry = RunRegistry(str(logdir), executor, state.journal_dir_fd)
        writer = await registry.acquire(["long"])
        for i in range(500):  # 500 journal lines of ~80 bytes, 40 KB without compaction
            await writer.write("even" if i % 2 == 0 else "odd", i // 2 + 1, [scalar(i)])
        [journal] = (logdir / ".summaryd" / "open").iterdir()
        assert journal.stat().st_size < 4096 + 512
        state.close()  # a crash now: the journal and the open file stay as they are

        recovered = StateDir(str(logdir / ".summaryd"), retention_secs=86400)
        report = recovered.recover(registry.logdir_fd)
        assert (report.files, report.cut_bytes, report.sessions) == (1, 0, 2)
        records = [recovered.store.get(session) for session in ("even", "odd")]
        assert [r.last if r else None for r in records] == [250, 250]
        [path] = event_files(logdir / "long")
        assert assert_whole_records(path) == 1 + 500
        recovered.close()
    finally:
        executor.shutdown(wait=True)


def test_a_daemon_that_lost_acknowledged_events_tells_the_writer_instead_of_skipping_them(
    daemons: list[Daemon], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon's disk comes back without events it had acknowledged (as after a power loss: here its logdir
    and state are restored from a copy taken earlier). The session resumes where the daemon's record stands,
    not at the writer's number: the writer, which no longer holds those events, says how many were lost and
    numbers the rest on from there, so the session goes on without a gap."""
    import shutil

    from summaryd.client import SummaryWriter

    logdir = daemons[0].logdir
    writer = SummaryWriter("behind", address=daemons[0].address, backoff_secs=(0.05, 0.2))
    try:
        log_losses(writer, range(20))
        writer.flush(timeout=30)
        shutil.copytree(logdir, tmp_path / "earlier")  # the daemon is idle: it holds events 1..20
        log_losses(writer, range(20, 50))
        writer.flush(timeout=30)
        daemons[0].proc.kill()
        daemons[0].proc.wait()
        shutil.rmtree(logdir)
        shutil.copytree(tmp_path / "earlier", logdir)
        daemons.append(start_daemon(tmp_path, "--listen", f"127.0.0.1:{daemons[0].port}", logdir=logdir))
        log_losses(writer, range(50, 60))
        writer.flush(timeout=30)  # sent from memory once the writer is back (closing first would spool them)
    finally:
        report = writer.close(timeout=60)
    assert not report.dropped and report.error is None, report
    lost = [r.getMessage() for r in caplog.records if "acknowledged are lost" in r.getMessage()]
    assert len(lost) == 1 and "only through sequence 20: 30 events" in lost[0], lost
    with grpc.insecure_channel(daemons[1].address) as channel:
        status = pb_grpc.SummariesStub(channel).GetStatus(pb.GetStatusRequest(), timeout=30)
    assert [s.acked_sequence for s in status.sessions] in ([], [40])
    assert steps_in(logdir / "behind") == collections.Counter([*range(20), *range(50, 60)])
