"""A daemon that lost its run's lease writes nothing more to the bucket: paused past it, or restarted after
another daemon took the run over.

Against a real SeaweedFS (the fixtures of `test_objstore`) and real daemon processes, paused with SIGSTOP and
killed with SIGKILL; every run is read back from the bucket with TensorBoard's loader.
"""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from _bucket import batch, daemon_in, lease_of, segments, state_of, steps_from_bucket, stub_of, write
from _seaweed import SeaweedServer
from _support import Daemon, log_losses, wait_for
from summaryd.client import SummaryWriter
from summaryd.server.storage.bucket import segments as shipping
from summaryd.server.storage.bucket.segments import SealPolicy, SegmentShipper
from summaryd.server.storage.bucket.store import Bucket
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

pytestmark = pytest.mark.objstore


def pair(tmp_path: Path, url: str, lease: str, seal_a: str, daemons: list[Daemon]) -> tuple[Daemon, Daemon]:
    """Daemons a (sealing after `seal_a` seconds) and b (at once) on `url`, with run leases of `lease` s."""
    daemons += [
        daemon_in(tmp_path / "a", url, "--run-lease", lease, "--seal-secs", seal_a),
        daemon_in(tmp_path / "b", url, "--run-lease", lease, "--seal-secs", "0.2"),
    ]
    return daemons[0], daemons[1]


def write_across(a: Daemon, b: Daemon, run: str, fault: Callable[[], object], steps: int) -> None:
    """A writer given both addresses logs the first 100 steps (acknowledged by a), then `fault()` befalls a,
    then the rest; every step is delivered, on b once a's lease has expired."""
    writer = SummaryWriter(run, address=f"{a.address},{b.address}", backoff_secs=(0.05, 0.5))
    try:
        log_losses(writer, range(100))
        writer.flush(timeout=30)
        fault()
        log_losses(writer, range(100, steps))
    finally:
        report = writer.close(timeout=120)
    assert report.delivered == steps and not report.dropped


def test_a_holder_paused_past_its_lease_uploads_nothing_when_it_wakes(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    # a seals by age (5 s) and is stopped with its first 100 steps acknowledged and staged, not uploaded. The
    # client sends them again to b, which takes the run over once a's 6 s lease has expired; a, woken, finds
    # them due and must not upload them.
    a, b = pair(tmp_path, logdir_url, "6", "5", daemons)
    write_across(a, b, "paused", lambda: os.kill(a.pid, signal.SIGSTOP), 200)
    os.kill(a.pid, signal.SIGCONT)
    # a wakes with staged segments long due, notices the run is lost, and is drained at its shutdown.
    wait_for(lambda: "lease was taken over" in a.log(), 30, "a to notice it lost the run")
    assert a.terminate() == 0 and b.terminate() == 0
    assert steps_from_bucket(seaweed, logdir_url, "paused", tmp_path / "read") == collections.Counter(range(200))


def test_a_daemon_restarted_on_its_disk_after_a_takeover_does_not_upload_its_leftovers(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon]
) -> None:
    # a acknowledges 100 steps it only stages (sealing by age is off in effect) and is SIGKILLed with its
    # disk kept; b takes the run over and gets them again from the client. a, restarted on that disk, finds
    # them staged: they are b's to write now.
    a, b = pair(tmp_path, logdir_url, "2", "3600", daemons)
    write_across(a, b, "taken", lambda: (a.proc.kill(), a.proc.wait(30)), 150)
    lease = lease_of(logdir_url, "taken")
    assert lease is not None and lease.address == b.address
    restarted = daemon_in(tmp_path / "a", logdir_url, "--run-lease", "2", "--seal-secs", "0.2")
    daemons.append(restarted)
    assert restarted.terminate() == 0 and b.terminate() == 0
    assert steps_from_bucket(seaweed, logdir_url, "taken", tmp_path / "read") == collections.Counter(range(150))
    assert "discarded, not uploaded" in restarted.log()


class _AlwaysAdmits:
    """A holder that checked its lease and is paused before its PUT (no timing hits that instant for real):
    every check has passed already."""

    async def admit(self, run_dir: str, name: str) -> bool:
        return True

    def holds(self, run_dir: str) -> bool:
        return True

    def fenced(self, run_dir: str) -> None:
        self.lost = run_dir

    async def reclaim(self, run_dir: str) -> str | None:
        return run_dir

    async def unclaim(self, leased: str) -> None:
        pass


async def test_a_segment_put_after_a_takeover_fenced_the_file_does_not_land(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str
) -> None:
    bucket = Bucket(logdir_url)
    name = "events.out.tfevents.1700000000.host.1.1"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / name).write_bytes(b"x" * 300)
    with ThreadPoolExecutor(1) as executor:
        fence = _AlwaysAdmits()
        shipper = SegmentShipper(bucket, str(tmp_path), SealPolicy(), executor, fence=fence)
        shipper.appended("run", name, 100)
        await shipper.ship(force=True)  # one segment of the old holder, 0..100
        # The next holder takes the lease over and closes the file to it; then the paused PUT goes out.
        fenced_at = await shipping.fence_file(bucket, "run", name)
        shipper.appended("run", name, 300)
        await shipper.ship(force=True)
        with pytest.raises(OSError):
            await asyncio.wait_for(shipper.upload_through("run", name, 300), 10)
    assert fence.lost == "run"
    assert segments(seaweed, logdir_url, "run") == [(f"run/{name}.{0:016d}", 100), (fenced_at, 0)]
    assert fenced_at == f"run/{name}.{100:016d}"
    # A second takeover finds the file fenced already and leaves it so.
    assert await shipping.fence_file(bucket, "run", name) == fenced_at


async def test_a_takeover_closes_the_previous_holders_files_before_it_writes_the_run(
    seaweed: SeaweedServer, logdir_url: str
) -> None:
    from summaryd.server.storage.bucket.leases import RunLeases
    from summaryd.server.storage.bucket.run_ownership import RunOwnership

    bucket = Bucket(logdir_url)
    name = "events.out.tfevents.1700000000.host.1.1"
    a = RunOwnership(RunLeases(bucket, "a", "10.0.0.1:6065", 30.0))
    await a.take("run")
    assert await a.admit("run/w0", name)  # written into the lease before the file's first segment
    await bucket.create(f"run/w0/{name}.{0:016d}", b"x" * 100)
    # b judges a gone (its clock an hour ahead) and takes the run over.
    b = RunOwnership(RunLeases(bucket, "b", "10.0.0.2:6065", 30.0, clock=lambda: time.time() + 3600))
    await b.take("run")
    assert segments(seaweed, logdir_url, "run/w0") == [
        (f"run/w0/{name}.{0:016d}", 100),
        (f"run/w0/{name}.{100:016d}", 0),
    ]
    lease = await b.leases.read("run")
    assert lease is not None and (lease.holder, lease.files, lease.unfenced) == ("b", (), ())
    # a, unaware, can start no new file either: naming it in the lease fails by ETag, and the run is dropped.
    assert not await a.admit("run/w0", "events.out.tfevents.1700000001.host.1.2")
    assert not a.holds("run")


def test_what_recovery_uploads_names_its_sessions_so_a_daemon_resuming_them_doubles_nothing(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str, daemons: list[Daemon], channels: list[grpc.Channel]
) -> None:
    # a stages 50 events it never uploads and is SIGKILLed; restarted on its disk, it uploads them before it
    # serves (the run is still its own), and is lost with its disk before the session comes back to write the
    # watermark. b resumes the session from the bucket: the recovered segment must count.
    a, b = pair(tmp_path, logdir_url, "2", "3600", daemons)
    session = str(uuid.uuid4())
    opening = pb.OpenSessionRequest(session_id=session, run="recovered", next_sequence=1)
    stub_of(a.address, channels).OpenSession(opening, timeout=30)
    assert write(stub_of(a.address, channels), batch(session, 1, 50)).acked_sequence == 50
    a.proc.kill()
    a.proc.wait(30)
    restarted = daemon_in(tmp_path / "a", logdir_url, "--run-lease", "2", "--seal-secs", "3600")
    daemons.append(restarted)
    assert [size for _, size in segments(seaweed, logdir_url, "recovered")] != []  # recovered before serving
    restarted.proc.kill()
    restarted.proc.wait(30)
    shutil.rmtree(tmp_path / "a" / "state")
    state = state_of(logdir_url, session)
    assert state is not None and state.durable == 0  # no watermark was ever written
    to_b = stub_of(b.address, channels)
    opened: list[pb.OpenSessionResponse] = []
    wait_for(lambda: opened.append(_open(to_b, opening)) or opened[-1] is not None, 30, "b to take the run")
    assert opened[-1] is not None and opened[-1].durable_sequence == 50
    assert write(to_b, batch(session, 1, 80)).acked_sequence == 80  # the client resends all it holds
    to_b.CloseSession(pb.CloseSessionRequest(session_id=session), timeout=30)
    assert steps_from_bucket(seaweed, logdir_url, "recovered", tmp_path / "read") == collections.Counter(range(80))


def _open(stub: pb_grpc.SummariesStub, request: pb.OpenSessionRequest) -> pb.OpenSessionResponse | None:
    """The session opened, or None while another daemon's lease holds its run."""
    try:
        answer: pb.OpenSessionResponse = stub.OpenSession(request, timeout=30)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc
        return None
    return answer


class _WaitsAfterItsWrite(Bucket):
    """The real bucket, whose lease writes, once `hold` is set, wait after they have landed until `go` is set:
    the instant between a write and its bookkeeping, which no timing hits for real (the test's one fake)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.hold, self.landed, self.go = False, asyncio.Event(), asyncio.Event()

    async def replace(self, key: str, data: bytes, etag: str) -> str:
        written = await super().replace(key, data, etag)
        if self.hold:
            self.landed.set()
            await self.go.wait()
        return written


async def test_a_lease_write_cancelled_after_it_landed_is_still_recorded_and_released(
    seaweed: SeaweedServer, logdir_url: str
) -> None:
    from summaryd.server.storage.bucket.leases import RunLeases
    from summaryd.server.storage.bucket.run_ownership import RunOwnership

    bucket = _WaitsAfterItsWrite(logdir_url)
    ownership = RunOwnership(RunLeases(bucket, "a", "10.0.0.1:6065", 30.0))
    await ownership.take("run")
    bucket.hold = True
    # The shipper, stopped at shutdown while the lease is being written to name a new file.
    naming = asyncio.ensure_future(ownership.admit("run", "events.out.tfevents.1700000000.host.1.1"))
    await bucket.landed.wait()
    naming.cancel()
    bucket.go.set()
    await ownership.close()
    # Released by the version that write made, not refused as stale (which would leave it live for 30 s).
    lease = await RunLeases(Bucket(logdir_url), "reader", "", 30.0).read("run")
    assert lease is not None and lease.expires == 0.0


class _WaitsAfterItsCreate(Bucket):
    """The real bucket, whose creates, once `hold` is set, wait after they have landed until cancelled: an
    upload cut off by shutdown after its PUT went through (the instant no timing hits; the test's one fake)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.hold, self.landed = False, asyncio.Event()

    async def create(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> str:
        written = await super().create(key, data, metadata)
        if self.hold:
            self.landed.set()
            await asyncio.Event().wait()
        return written


async def test_an_upload_cut_off_after_its_put_landed_is_not_taken_for_another_daemons_fence(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str
) -> None:
    from summaryd.server.storage.bucket.leases import RunLeases
    from summaryd.server.storage.bucket.run_ownership import RunOwnership

    bucket = _WaitsAfterItsCreate(logdir_url)
    name = "events.out.tfevents.1700000000.host.1.1"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / name).write_bytes(b"x" * 300)
    ownership = RunOwnership(RunLeases(bucket, "a", "10.0.0.1:6065", 30.0))
    await ownership.take("run")
    with ThreadPoolExecutor(1) as executor:
        shipper = SegmentShipper(bucket, str(tmp_path), SealPolicy(), executor, fence=ownership)
        shipper.appended("run", name, 100, ("s", 1))
        shipper.start()
        bucket.hold = True
        waiting = asyncio.ensure_future(shipper.upload_through("run", name, 100))
        await asyncio.wait_for(bucket.landed.wait(), 30)
        bucket.hold = False
        # Shutdown: the run's file closes with more journaled meanwhile, then the drain cancels the upload whose
        # PUT of 0..100 landed unrecorded, and seals the rest. The object at 0 is this daemon's own.
        shipper.closed("run", name, 300)
        await asyncio.wait_for(shipper.drain(), 30)
        await asyncio.wait_for(waiting, 10)
    assert ownership.holds("run")
    assert segments(seaweed, logdir_url, "run") == [(f"run/{name}.{0:016d}", 100), (f"run/{name}.{100:016d}", 200)]
    await ownership.close()


async def test_metrics_show_the_held_leases_and_the_least_time_left_on_them(logdir_url: str) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from summaryd.server.storage.bucket.leases import RunLeases
    from summaryd.server.storage.bucket.run_ownership import LeaseCollector, RunOwnership

    ownership = RunOwnership(RunLeases(Bucket(logdir_url), "a", "10.0.0.1:6065", 30.0))
    registry = CollectorRegistry()
    registry.register(LeaseCollector(ownership))
    assert "summaryd_run_lease_margin_seconds" not in generate_latest(registry).decode()
    await asyncio.gather(ownership.take("one"), ownership.take("two"))
    text = generate_latest(registry).decode()
    assert "summaryd_run_leases 2.0" in text
    (left,) = [float(line.split()[1]) for line in text.splitlines() if line.startswith("summaryd_run_lease_margin")]
    assert 0 < left <= 25.0  # written just now: the 30 s lease less its 5 s margin, less the time since
    await ownership.close()


async def test_opening_a_session_waits_for_no_renewal_of_another_lease(logdir_url: str) -> None:
    from summaryd.server.storage.bucket.leases import RunLeases
    from summaryd.server.storage.bucket.run_ownership import RunOwnership

    bucket = _WaitsAfterItsWrite(logdir_url)
    ownership = RunOwnership(RunLeases(bucket, "a", "10.0.0.1:6065", 3.0))
    await ownership.take("held")
    bucket.hold = True
    ownership.start()  # renews every second; its renewal of `held` is stuck in the bucket from here
    await bucket.landed.wait()
    # A new run's lease (a create) and one more session on the held run both go through meanwhile (the hang
    # guard is generous: before, both waited for the whole renewal round).
    await asyncio.wait_for(asyncio.gather(ownership.take("new"), ownership.take("held")), 30)
    assert set(ownership.held()) == {"held", "new"}
    bucket.go.set()
    await ownership.close()


async def test_the_state_of_sessions_closed_past_the_retention_is_removed_and_no_other(logdir_url: str) -> None:
    from summaryd.server.storage.bucket.sessions import BucketSessions, DurableSession

    sessions = BucketSessions(Bucket(logdir_url))
    await sessions.put(DurableSession("closed", "run", 10, True))
    await sessions.put(DurableSession("open", "run", 10, False))
    assert await sessions.sweep(time.time() - 3600) == 0  # written within the retention: kept
    assert await sessions.sweep(time.time() + 3600) == 1  # past it: the closed one goes, the open one stays
    assert await sessions.get("closed") is None
    assert await sessions.get("open") == DurableSession("open", "run", 10, False)
