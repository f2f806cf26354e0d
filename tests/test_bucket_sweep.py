"""What the bucket keeps: released leases and closed sessions' state are removed past their retention, by a
delete conditional on the version read, so that a daemon taking a lease while it is being removed keeps it.

Against a real SeaweedFS (the fixtures of `test_objstore`): its conditional DELETE (If-Match, sent signed) is
the store's own; the interleavings are made by holding the sweeper's delete until the acquirer has written.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from _bucket import BUCKET, batch, prefix_of, start_bucket_daemon
from _seaweed import SeaweedServer
from summaryd.server.storage.bucket.leases import LEASE_PREFIX, Lease, LeaseLostError, RunLeases
from summaryd.server.storage.bucket.segments import run_segments
from summaryd.server.storage.bucket.sessions import PROBE_PREFIX, SESSION_PREFIX, BucketSessions, DurableSession
from summaryd.server.storage.bucket.store import Bucket, PreconditionFailedError
from summaryd.v1 import summaryd_pb2 as pb
from summaryd.v1 import summaryd_pb2_grpc as pb_grpc

pytestmark = pytest.mark.objstore


FILE = "events.out.tfevents.1"


async def test_a_conditional_delete_removes_only_the_version_it_names(logdir_url: str) -> None:
    bucket = Bucket(logdir_url)
    first = await bucket.create("k", b"one")
    second = await bucket.replace("k", b"two", first)
    with pytest.raises(PreconditionFailedError):
        await bucket.delete_if("k", first)
    assert await bucket.get("k") == (b"two", second)
    await bucket.delete_if("k", second)
    assert await bucket.get("k") is None
    assert await bucket.honours_conditional_delete(PROBE_PREFIX + "t")
    assert await bucket.list(PROBE_PREFIX) == []  # the scratch object goes too


async def released(leases: RunLeases, run: str) -> None:
    """`run` leased by `leases`, its file named, then released (the tombstone a sweep removes)."""
    lease = await leases.acquire(run)
    await leases.release(await leases.renew(lease.naming(run, FILE)))


async def test_an_expired_lease_is_removed_past_the_retention_its_files_closed_and_a_live_one_never(
    logdir_url: str,
) -> None:
    bucket = Bucket(logdir_url)
    a, b = RunLeases(bucket, "a", "127.0.0.1:1", 30.0), RunLeases(bucket, "b", "127.0.0.1:2", 30.0)
    await released(a, "done")
    live = await b.acquire("live")
    assert await a.sweep(time.time() - 3600) == 0  # written within the retention: kept
    assert await a.sweep(time.time() + 3600) == 1  # past it: the released one goes, the live one stays
    assert await a.read("done") is None
    assert (await b.renew(live)).holder == "b"
    # The released lease named a file: it is closed to its holder (an empty object where its next segment
    # would go), so that leftovers staged for it are never uploaded without the lease that said who held it.
    assert await run_segments(bucket, "done") == [(FILE, 0, 0)]


class HeldDelete(Bucket):
    """The bucket, with the sweeper's conditional delete held until `go` is set (after `reached`)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.reached, self.go = asyncio.Event(), asyncio.Event()

    async def delete_if(self, key: str, etag: str) -> None:
        self.reached.set()
        await self.go.wait()
        await super().delete_if(key, etag)


async def test_a_lease_taken_while_the_sweep_removes_it_stays_with_its_taker(logdir_url: str) -> None:
    held = HeldDelete(logdir_url)
    sweeper = RunLeases(held, "sweeper", "127.0.0.1:3", 30.0)
    taker = RunLeases(Bucket(logdir_url), "taker", "127.0.0.1:4", 30.0)
    await released(RunLeases(Bucket(logdir_url), "old", "127.0.0.1:5", 30.0), "run")
    sweep = asyncio.ensure_future(sweeper.sweep(time.time() + 3600))
    await held.reached.wait()  # the sweeper read the released lease, closed its file, and is about to delete
    lease = await taker.acquire("run")  # the taker treats the released lease as free and replaces it by ETag
    held.go.set()
    assert await sweep == 0  # the delete named the version the sweeper read: refused
    assert (await taker.read("run")) == lease
    assert (await taker.renew(lease)).holder == "taker"


async def test_racing_acquires_and_sweeps_never_take_a_lease_from_its_holder(logdir_url: str) -> None:
    """Sweeps and acquires of many released leases side by side, in whatever order the store answers: every
    lease an acquire returned is still its holder's afterwards (renewed by its ETag), whether the sweep removed
    the released version first (the acquire then created it anew) or the acquire replaced it first."""
    bucket = Bucket(logdir_url)
    old = RunLeases(bucket, "old", "127.0.0.1:5", 30.0)
    runs = [f"run-{n}" for n in range(30)]
    await asyncio.gather(*(released(old, run) for run in runs))
    takers = [RunLeases(Bucket(logdir_url), f"taker-{n}", f"127.0.0.1:{10 + n}", 30.0) for n in range(len(runs))]
    sweeper = RunLeases(Bucket(logdir_url), "sweeper", "127.0.0.1:3", 30.0)
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    delays = random.Random(seed).sample(range(len(runs)), len(runs))
    begun = time.monotonic()
    removed_in = await sweeper.sweep(time.time() + 3600)  # how long one sweep of them takes, to spread the race
    await asyncio.gather(*(released(old, run) for run in runs))
    spread = (time.monotonic() - begun) / 2 / len(runs)

    async def acquire(taker: RunLeases, run: str, delay: int) -> Lease:
        await asyncio.sleep(delay * spread)
        return await taker.acquire(run)

    results = await asyncio.gather(
        sweeper.sweep(time.time() + 3600),
        *(acquire(taker, run, delay) for taker, run, delay in zip(takers, runs, delays, strict=True)),
    )
    assert removed_in == len(runs)
    removed, leases = results[0], results[1:]
    for taker, lease in zip(takers, leases, strict=True):
        try:
            assert (await taker.renew(lease)).holder == taker.holder
        except LeaseLostError:
            pytest.fail(f"{lease.run_dir}: the sweep took the lease acquired by {taker.holder}")
    print(f"{removed} of {len(runs)} released leases removed before their taker wrote")


async def test_a_closed_sessions_state_written_while_the_sweep_removes_it_is_kept(logdir_url: str) -> None:
    held = HeldDelete(logdir_url)
    await BucketSessions(Bucket(logdir_url)).put(DurableSession("s", "run", 10, True))
    sweep = asyncio.ensure_future(BucketSessions(held).sweep(time.time() + 3600))
    await held.reached.wait()
    await BucketSessions(Bucket(logdir_url)).put(DurableSession("s", "run", 12, True, "later"))
    held.go.set()
    assert await sweep == 0
    assert await BucketSessions(Bucket(logdir_url)).get("s") == DurableSession("s", "run", 12, True)


RUNS = 1000


def open_write_close(address: str, run: str) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.SummariesStub(channel)
        session = str(uuid.uuid4())
        stub.OpenSession(pb.OpenSessionRequest(session_id=session, run=run, next_sequence=1), timeout=60)
        acks = list(stub.Write(iter([batch(session, 1, 3)]), timeout=60))
        assert acks and acks[-1].acked_sequence == 3
        stub.CloseSession(pb.CloseSessionRequest(session_id=session), timeout=120)


@pytest.mark.timeout(300)
def test_a_thousand_runs_opened_and_closed_leave_no_lease_or_session_state_past_the_retention(
    tmp_path: Path, seaweed: SeaweedServer, logdir_url: str
) -> None:
    """A daemon with a retention of about 9 s (it sweeps every half retention) serves 1,000 runs, each a
    session opened, written and closed; once the retention has passed, the bucket holds every run's events and
    no lease or session object (nor the scratch object of its conditional-delete check)."""
    import obstore

    daemon = start_bucket_daemon(tmp_path, logdir_url, "--session-retention-days", "0.0001", "--seal-secs", "0.2")
    try:
        runs = [f"r{n:04d}" for n in range(RUNS)]
        begun = time.monotonic()
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda run: open_write_close(daemon.address, run), runs))
        served = time.monotonic()
        store = seaweed.store(BUCKET, prefix_of(logdir_url))

        def keys(prefix: str) -> list[str]:
            return [meta["path"] for meta in obstore.list(store, prefix).collect()]

        deadline = time.monotonic() + 120
        while keys(LEASE_PREFIX) or keys(SESSION_PREFIX):
            assert time.monotonic() < deadline, f"left: {keys(LEASE_PREFIX)[:3]} {keys(SESSION_PREFIX)[:3]}"
            time.sleep(1)
        assert keys(PROBE_PREFIX) == []
        gone = time.monotonic() - served
        print(f"{RUNS} runs served in {served - begun:.1f} s; their leases and state gone {gone:.1f} s later")
        events = [key for key in keys("") if "tfevents" in key and not key.startswith(".summaryd/")]
        assert {key.split("/", 1)[0] for key in events} == set(runs)
    finally:
        daemon.stop()
