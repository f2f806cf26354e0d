"""The fencing rule of run leases, by the holder's own clock: no store needed (the bucket side is in
`test_fencing`)."""

from __future__ import annotations

import json

from summaryd.server.storage.bucket.leases import Lease, margin


def lease(renewed: float, files: tuple[tuple[str, str], ...] = ()) -> Lease:
    return Lease("run", "a", "127.0.0.1:1", 1e9, "etag", files, renewed=renewed)


def test_a_lease_is_written_under_only_until_its_write_began_plus_the_lease_less_the_margin() -> None:
    duration = 6.0
    assert margin(duration) == 1.0 and margin(30.0) == 5.0
    live = lease(renewed=100.0)
    assert live.live(100.0, duration) and live.live(104.99, duration)
    # Past that, another daemon may judge it expired: a holder woken from a pause writes nothing under it.
    assert not live.live(105.0, duration) and not live.live(150.0, duration)
    # A lease read from the bucket (not written by this daemon) is never written under.
    assert not lease(renewed=0.0).live(0.0, duration)


def test_a_lease_names_one_file_per_directory_and_its_document_keeps_the_names() -> None:
    named = lease(100.0).naming("run", "events.out.tfevents.1").naming("run/w0", "events.out.tfevents.2")
    renamed = named.naming("run", "events.out.tfevents.3")
    assert renamed.files == (("run", "events.out.tfevents.3"), ("run/w0", "events.out.tfevents.2"))
    doc = json.loads(renamed.document())
    assert doc["files"] == [["run", "events.out.tfevents.3"], ["run/w0", "events.out.tfevents.2"]]
    assert "unfenced" not in doc


def test_a_conditional_write_whose_retry_meets_the_write_itself_is_done_and_no_other_is() -> None:
    """A client retries a request whose answer was lost; when the first attempt had landed, the retry fails its
    own condition. The bucket takes that as done when what is stored is these very bytes, and as lost otherwise.
    The lost answer cannot be made on demand against a real store: obstore's in-memory store holds the object
    the first attempt left."""
    import asyncio

    import pytest
    from obstore.store import MemoryStore

    from summaryd.server.storage.bucket.store import Bucket, PreconditionFailedError

    async def check() -> None:
        bucket = Bucket("s3://b/p", MemoryStore())
        first = await bucket.create("segment", b"records")
        assert await bucket.create("segment", b"records") == first  # the retry of a create that landed
        with pytest.raises(PreconditionFailedError):
            await bucket.create("segment", b"")  # a fence meeting a segment: the key is taken
        second = await bucket.replace("lease", b"v2", await bucket.create("lease", b"v1"))
        assert await bucket.replace("lease", b"v2", "stale") == second  # the retry of a renewal that landed
        with pytest.raises(PreconditionFailedError):
            await bucket.replace("lease", b"v3", "stale")  # another holder's version

    asyncio.run(check())


def test_an_upload_cancelled_while_its_lease_names_the_file_leaves_the_next_one_the_version_written() -> None:
    """Shutdown cancels an upload while the lease write that names its file is under way: the write lands and is
    recorded, and the drain's upload of the same file, taking the run's lock meanwhile, waits for it rather than
    writing again by the ETag before it (which the store refuses: the run read as taken over, and its staged
    bytes were never uploaded). obstore's in-memory store stands in for the bucket; the pause is a slow write."""
    import asyncio

    from obstore.store import MemoryStore

    from summaryd.server.storage.bucket.leases import RunLeases
    from summaryd.server.storage.bucket.run_ownership import RunOwnership
    from summaryd.server.storage.bucket.store import Bucket

    class SlowReplace(Bucket):
        async def replace(self, key: str, data: bytes, etag: str) -> str:
            await asyncio.sleep(0.2)
            return await super().replace(key, data, etag)

    async def check() -> None:
        ownership = RunOwnership(RunLeases(SlowReplace("s3://b/p", MemoryStore()), "a", "127.0.0.1:1", 30.0))
        await ownership.take("run")
        first = asyncio.ensure_future(ownership.admit("run", "events.out.tfevents.1"))
        await asyncio.sleep(0.05)  # the lease write naming the file is under way
        first.cancel()
        assert await ownership.admit("run", "events.out.tfevents.1")
        assert ownership.holds("run") and ownership.valid("run")

    asyncio.run(check())


def test_leftovers_of_a_run_whose_lease_is_gone_are_not_reclaimed() -> None:
    """A daemon stages a run only under its lease; a lease that is gone was removed past the retention, and
    with it the record of who held the run since: recovery does not upload the run's leftovers blind.
    obstore's in-memory store stands in for the bucket."""
    import asyncio

    from obstore.store import MemoryStore

    from summaryd.server.storage.bucket.leases import RunLeases
    from summaryd.server.storage.bucket.run_ownership import RunOwnership
    from summaryd.server.storage.bucket.store import Bucket

    async def check() -> None:
        ownership = RunOwnership(RunLeases(Bucket("s3://b/p", MemoryStore()), "a", "127.0.0.1:1", 30.0))
        assert await ownership.reclaim("job/w0") is None
        assert not ownership.held()

    asyncio.run(check())
