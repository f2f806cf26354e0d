"""The session lifecycle in this process, without gRPC: a real state directory, session store, run registry and
event files under a temporary logdir, read back with TensorBoard's reader.

Open, resume, write (duplicates, overlaps, gaps, refused events), flush, close, lease expiry, session and run
limits, the session store's writes and syncs, and restarts from the store (graceful and after a crash)."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from _support import assert_whole_records, event_files, read_events
from summaryd.server import errors
from summaryd.server.errors import (
    BatchRefusedError,
    LimitError,
    ResumeRefusedError,
    RunMismatchError,
    SequenceGapError,
    SessionClosedError,
    SessionReleasedError,
    SessionUnknownError,
)
from summaryd.server.io_threads import io_executor
from summaryd.server.security.limits import Limits
from summaryd.server.service import STATUS, status_of
from summaryd.server.sessions.lifecycle import SessionLifecycle
from summaryd.server.storage.local import LocalStorage
from summaryd.server.storage.runs import RunRegistry
from summaryd.server.storage.state import StateDir
from summaryd.v1 import summaryd_pb2 as pb

LEASE = 60.0


def scalar(step: int) -> bytes:
    summary = Summary(value=[Summary.Value(tag="loss", simple_value=float(step))])
    return Event(wall_time=1.0 + step, step=step, summary=summary).SerializeToString()


def events(first: int, last: int) -> list[bytes]:
    return [scalar(step) for step in range(first, last + 1)]


def opening(session_id: str, run: str = "run", *, next_sequence: int = 0, worker: str = "") -> pb.OpenSessionRequest:
    return pb.OpenSessionRequest(
        session_id=session_id,
        run=run,
        worker=worker,
        next_sequence=next_sequence,
        client=pb.ClientIdentity(host="test", pid=1),
    )


def parts(run: str = "run") -> list[str]:
    return run.split("/")


def steps(logdir: Path, run: str = "run") -> list[int]:
    """The steps of every scalar of the run, in file order, each file read whole by TensorBoard's reader."""
    found = []
    for path in event_files(logdir / run):
        assert_whole_records(path)
        found += [e.step for e in read_events(path) if e.HasField("summary")]
    return found


@dataclass
class Daemon:
    """The parts of a daemon behind its servicer, on one logdir and state directory."""

    logdir: Path
    state: StateDir
    registry: RunRegistry
    lifecycle: SessionLifecycle

    @property
    def journals(self) -> list[str]:
        return os.listdir(self.state.journal_dir_fd)


class Daemons:
    """Starts the parts of a daemon on one logdir, again after a stop or a crash; stops what is left."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.executor = io_executor(2)
        self._running: list[Daemon] = []

    def start(self, *, lease: float = LEASE, limits: Limits | None = None) -> Daemon:
        state = StateDir(str(self.logdir / ".summaryd"), retention_secs=86400)
        registry = RunRegistry(str(self.logdir), self.executor, state.journal_dir_fd)
        state.recover(registry.logdir_fd)
        lifecycle = SessionLifecycle(LocalStorage(registry), state.store, lease, limits or Limits())
        daemon = Daemon(self.logdir, state, registry, lifecycle)
        self._running.append(daemon)
        return daemon

    async def stop(self, daemon: Daemon) -> None:
        """The graceful shutdown: every session released, every file closed."""
        await daemon.lifecycle.close_all()
        self._close(daemon)

    def crash(self, daemon: Daemon) -> None:
        """What a SIGKILL leaves: files and their journals as they are, the lock released."""
        self._close(daemon)

    def _close(self, daemon: Daemon) -> None:
        self._running.remove(daemon)
        daemon.registry.close()
        daemon.state.close()

    async def stop_all(self) -> None:
        for daemon in list(self._running):
            await self.stop(daemon)
        self.executor.shutdown(wait=True)


@pytest.fixture
async def daemons(tmp_path: Path) -> AsyncIterator[Daemons]:
    started = Daemons(tmp_path / "runs")
    try:
        yield started
    finally:
        await started.stop_all()


@pytest.fixture
def store_syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the state files fsynced while the test runs (the real fsync still runs)."""
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        real_fsync(fd)
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))

    monkeypatch.setattr(os, "fsync", recording_fsync)
    yield synced


# ---- opening, writing --------------------------------------------------------------------------------------


async def test_a_new_session_writes_its_batches_once_in_order(daemons: Daemons) -> None:
    """Duplicates are dropped, an overlapping batch is cut to its new part, a heartbeat changes nothing."""
    daemon = daemons.start()
    lifecycle = daemon.lifecycle
    session = await lifecycle.open(opening("a"), parts(), "peer")
    assert session.acked == 0
    assert await lifecycle.write(session, 1, events(1, 3)) == 3
    assert await lifecycle.write(session, 1, events(1, 3)) == 3  # sent again after a lost ack
    assert await lifecycle.write(session, 2, events(2, 5)) == 5  # overlaps: 2 and 3 are dropped
    assert await lifecycle.write(session, 6, []) == 5  # a heartbeat
    assert (session.events_written, session.duplicates_dropped) == (5, 5)
    assert steps(daemon.logdir) == [1, 2, 3, 4, 5]
    assert lifecycle.live("a") is session
    assert lifecycle.run_of("a") == "run"


async def test_a_gap_and_a_refused_event_write_nothing(daemons: Daemons) -> None:
    daemon = daemons.start()
    lifecycle = daemon.lifecycle
    session = await lifecycle.open(opening("a"), parts(), "peer")
    await lifecycle.write(session, 1, events(1, 2))
    with pytest.raises(SequenceGapError, match="resend from 3"):
        await lifecycle.write(session, 4, events(4, 4))
    with pytest.raises(BatchRefusedError) as refused:
        await lifecycle.write(session, 3, [scalar(3), b"not an event", scalar(5)])
    assert refused.value.trailing_metadata == ((errors.REFUSED_SEQUENCE_KEY, "4"),)
    assert session.acked == 2
    assert steps(daemon.logdir) == [1, 2]


async def test_an_open_of_a_live_session_returns_it_and_another_run_is_refused(daemons: Daemons) -> None:
    lifecycle = daemons.start().lifecycle
    session = await lifecycle.open(opening("a"), parts(), "peer")
    assert await lifecycle.open(opening("a"), parts(), "peer") is session
    with pytest.raises(RunMismatchError, match="writes to 'run', not 'other'"):
        await lifecycle.open(opening("a", "other"), parts("other"), "peer")


async def test_an_unknown_session_is_not_found(daemons: Daemons) -> None:
    lifecycle = daemons.start().lifecycle
    with pytest.raises(SessionUnknownError):
        lifecycle.live("nobody")
    with pytest.raises(SessionUnknownError):
        await lifecycle.close("nobody")
    assert lifecycle.run_of("nobody") is None


async def test_a_client_ahead_of_the_store_continues_its_own_numbering(daemons: Daemons) -> None:
    """A client that saw more acknowledged than the daemon remembers (its state directory was lost)."""
    lifecycle = daemons.start().lifecycle
    session = await lifecycle.open(opening("a", next_sequence=41), parts(), "peer")
    assert session.acked == 40
    assert await lifecycle.write(session, 41, events(41, 42)) == 42


# ---- closing -----------------------------------------------------------------------------------------------


async def test_a_closed_session_is_final_and_its_events_are_on_disk(daemons: Daemons) -> None:
    daemon = daemons.start()
    lifecycle = daemon.lifecycle
    session = await lifecycle.open(opening("a"), parts(), "peer")
    await lifecycle.write(session, 1, events(1, 3))
    assert await lifecycle.close("a") == (3, 3)
    assert await lifecycle.close("a") == (3, 0)  # closing again answers what the store holds
    record = daemon.state.store.get("a")
    assert record is not None and (record.last, record.closed) == (3, True)
    assert daemon.journals == []  # the file closed: its sequence numbers are in the store
    with pytest.raises(SessionClosedError):
        lifecycle.live("a")
    with pytest.raises(SessionClosedError):
        await lifecycle.open(opening("a", next_sequence=4), parts(), "peer")
    with pytest.raises(SessionClosedError):
        await lifecycle.write(session, 4, events(4, 4))  # a stream of the session still open
    assert steps(daemon.logdir) == [1, 2, 3]


async def test_the_store_is_synced_once_when_the_last_session_of_a_run_closes(
    daemons: Daemons, store_syncs: list[str]
) -> None:
    """Closing a session syncs its run's event file and journal; the store is synced once, when the run's
    last session closes, for its record and the file's sequence numbers together."""
    daemon = daemons.start()
    lifecycle = daemon.lifecycle
    first = await lifecycle.open(opening("a", worker=""), parts(), "peer")
    second = await lifecycle.open(opening("b", worker=""), parts(), "peer")
    await lifecycle.write(first, 1, events(1, 2))
    await lifecycle.write(second, 1, events(1, 2))
    [journal] = daemon.journals
    [path] = event_files(daemon.logdir / "run")
    store_syncs.clear()

    await lifecycle.close("a")
    assert path.name in store_syncs and journal in store_syncs
    assert "sessions" not in store_syncs
    store_syncs.clear()

    await lifecycle.close("b")
    assert store_syncs.count("sessions") == 1
    records = [daemon.state.store.get(s) for s in ("a", "b")]
    assert [(r.last, r.closed) if r else None for r in records] == [(2, True), (2, True)]
    assert daemon.journals == []


async def test_a_released_session_closes_from_its_record(daemons: Daemons) -> None:
    daemon = daemons.start()
    lifecycle = daemon.lifecycle
    session = await lifecycle.open(opening("a"), parts(), "peer")
    await lifecycle.write(session, 1, events(1, 4))
    await daemons.stop(daemon)
    restarted = daemons.start()
    assert await restarted.lifecycle.close("a") == (4, 0)
    with pytest.raises(SessionClosedError):
        await restarted.lifecycle.open(opening("a"), parts(), "peer")


# ---- leases ------------------------------------------------------------------------------------------------


async def test_a_session_never_heard_from_is_released_at_half_its_lease(daemons: Daemons) -> None:
    lifecycle = daemons.start(lease=10.0).lifecycle
    quiet = await lifecycle.open(opening("quiet"), parts(), "peer")
    heard = await lifecycle.open(opening("heard"), parts(), "peer")
    await lifecycle.write(heard, 1, [])  # a heartbeat
    now = time.monotonic()
    assert quiet.expired(now + 6) and not heard.expired(now + 6)
    assert heard.expired(now + 11)


async def test_an_expired_session_is_released_and_resumes_where_it_stood(daemons: Daemons) -> None:
    daemon = daemons.start(lease=0.01)
    lifecycle = daemon.lifecycle
    session = await lifecycle.open(opening("a"), parts(), "peer")
    await lifecycle.write(session, 1, events(1, 3))
    while lifecycle.sessions.get("a") is not None:  # idle past its lease from the first check on
        await lifecycle.expire_idle()
    assert daemon.journals == []  # the run's only session let go: its file closed
    with pytest.raises(SessionReleasedError, match="call OpenSession again to resume it"):
        lifecycle.live("a")
    with pytest.raises(SessionReleasedError):
        await lifecycle.write(session, 4, events(4, 4))
    resumed = await lifecycle.open(opening("a", next_sequence=1), parts(), "peer")
    assert resumed.acked == 3
    assert await lifecycle.write(resumed, 1, events(1, 5)) == 5
    assert steps(daemon.logdir) == [1, 2, 3, 4, 5]


async def test_a_session_released_having_written_nothing_leaves_no_record(daemons: Daemons) -> None:
    daemon = daemons.start(lease=0.01)
    lifecycle = daemon.lifecycle
    await lifecycle.open(opening("a"), parts(), "peer")
    while lifecycle.sessions.get("a") is not None:
        await lifecycle.expire_idle()
    assert daemon.state.store.get("a") is None
    assert not (daemon.logdir / "run").exists()
    with pytest.raises(SessionUnknownError):
        lifecycle.live("a")


# ---- limits ------------------------------------------------------------------------------------------------


async def test_session_limits_refuse_before_anything_is_made(daemons: Daemons) -> None:
    daemon = daemons.start(limits=Limits(max_sessions=3, max_sessions_per_peer=2, max_open_runs=2))
    lifecycle = daemon.lifecycle
    await lifecycle.open(opening("a", "one"), parts("one"), "peer-1")
    await lifecycle.open(opening("b", "two"), parts("two"), "peer-1")
    with pytest.raises(LimitError, match="--max-sessions-per-peer"):
        await lifecycle.open(opening("c", "one"), parts("one"), "peer-1")
    with pytest.raises(LimitError, match="--max-open-runs"):
        await lifecycle.open(opening("c", "three/x"), parts("three/x"), "peer-2")
    await lifecycle.open(opening("c", "one"), parts("one"), "peer-2")
    with pytest.raises(LimitError, match=r"\(--max-sessions\)"):
        await lifecycle.open(opening("d", "two"), parts("two"), "peer-3")
    assert [s.session_id for s in lifecycle.sessions] == ["a", "b", "c"]
    assert not (daemon.logdir / "three").exists()
    assert daemon.state.store.get("c") is None and daemon.state.store.get("d") is None


# ---- restarts ----------------------------------------------------------------------------------------------


async def test_a_restart_resumes_every_session_from_the_store(daemons: Daemons) -> None:
    daemon = daemons.start()
    for name in ("a", "b"):
        session = await daemon.lifecycle.open(opening(name, name), parts(name), "peer")
        await daemon.lifecycle.write(session, 1, events(1, 3))
    await daemons.stop(daemon)

    restarted = daemons.start().lifecycle
    for name in ("a", "b"):
        session = await restarted.open(opening(name, name, next_sequence=1), parts(name), "peer")
        assert session.acked == 3
        assert await restarted.write(session, 1, events(1, 4)) == 4  # the client resends all it holds
        assert steps(daemons.logdir, name) == [1, 2, 3, 4]


async def test_a_crash_resumes_every_session_from_its_files_journal(daemons: Daemons) -> None:
    daemon = daemons.start()
    session = await daemon.lifecycle.open(opening("a"), parts(), "peer")
    await daemon.lifecycle.write(session, 1, events(1, 3))
    assert daemon.state.store.get("a") is None  # while the file is open, only its journal has the numbers
    daemons.crash(daemon)

    restarted = daemons.start()
    record = restarted.state.store.get("a")
    assert record is not None and record.last == 3
    session = await restarted.lifecycle.open(opening("a", next_sequence=2), parts(), "peer")
    assert await restarted.lifecycle.write(session, 2, events(2, 4)) == 4
    assert steps(daemons.logdir) == [1, 2, 3, 4]


async def test_a_session_whose_record_may_be_lost_is_not_resumed(daemons: Daemons) -> None:
    """After damaged state, an unknown session that saw acknowledgements could write its events twice."""
    daemon = daemons.start()
    daemon.state.store.lost_before = time.time()  # what the state directory sets when it keeps damage aside
    with pytest.raises(ResumeRefusedError, match="cannot be resumed"):
        await daemon.lifecycle.open(opening("a", next_sequence=5), parts(), "peer")
    await daemon.lifecycle.open(opening("b", next_sequence=1), parts(), "peer")  # a new session opens


# ---- the status table --------------------------------------------------------------------------------------


def test_every_error_of_the_inner_layers_has_one_status() -> None:
    raised = [
        getattr(errors, name)
        for name in errors.__all__
        if isinstance(getattr(errors, name), type) and name != "EventError"  # the writer's; sessions wrap it
    ]
    assert sorted(e.__name__ for e in raised) == sorted(e.__name__ for e in STATUS)
    disk_full = errors.StorageError.of(OSError(28, "No space left on device"), "run", "the batch was not written")
    broken = errors.StorageError.of(OSError(5, "Input/output error"), "run", "the batch was not written")
    assert status_of(disk_full) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_of(broken) == grpc.StatusCode.UNAVAILABLE
    assert status_of(SessionReleasedError("a", LEASE)) == grpc.StatusCode.UNAVAILABLE
    assert status_of(SessionClosedError("a")) == grpc.StatusCode.FAILED_PRECONDITION
