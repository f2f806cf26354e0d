"""On a bucket logdir the board index follows the bucket: every run under the prefix, other daemons' too.

What this daemon writes enters the index after each batch is written, as on a local disk. Everything else in
the bucket — the runs of the other daemons of the prefix, and what was written before this daemon started —
is read from the segments (`storage.bucket.segments`) as they appear: every `interval` seconds the runs being
written (by their leases) are listed after their last key read, and each segment not read yet is fetched and
indexed, a run's segments in key order (their bytes'). A
segment of a file this process writes is skipped: its records are in the index already. So a TensorBoard
pointed at any one daemon of the prefix serves the whole bucket, with no bucket credentials of its own; a run
of another daemon shows its points a seal interval plus at most one `interval` after they were logged.

At the first listing every run found is held (`BoardIndex.hold`): a run this daemon writes to meanwhile keeps
its live batches until the bucket's older segments of it are read, so older points never come after newer ones.
"""

from __future__ import annotations

import asyncio
import logging
import time

from summaryd.server.board.index import BoardIndex
from summaryd.server.operations.logs import Throttle
from summaryd.server.storage.bucket.leases import LEASE_PREFIX, LEASE_SUFFIX
from summaryd.server.storage.bucket.segments import parse_segment
from summaryd.server.storage.bucket.store import Bucket, BucketError, ObjectInfo
from summaryd.v1.wire import whole_records

log = logging.getLogger(__name__)
_failures = Throttle(log)

FOLLOW_SECS = 2.0
"""How often the bucket is asked for new segments."""
FULL_LISTING_SECS = 300.0
"""How often the whole prefix is listed anyway (a safety net: between, only the runs whose leases move are)."""
_CHUNK = 2000  # records indexed per hold of the index's lock, so live batches never wait for a whole segment


class BucketFollower:
    """Follows `bucket` below `prefix` (the board's `--board-runs`, or all) and indexes the segments not read yet.

    What is listed: the whole prefix at the first poll and every `FULL_LISTING_SECS`; in between the leases
    (`.summaryd/leases/`, one small object a run) and, of each run whose lease was written within the last
    `run_lease` seconds (a run is written only under a lease renewed every third of it, and its holder uploads
    its last segment before it releases it, which writes the lease too), only the keys after the last one
    read of it (the store's start-after). A run nobody writes costs nothing beyond its lease's line."""

    def __init__(
        self,
        index: BoardIndex,
        bucket: Bucket,
        prefix: str = "",
        interval: float = FOLLOW_SECS,
        run_lease: float = 30.0,
    ) -> None:
        self._index = index
        self._bucket = bucket
        self._prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._interval = interval
        self._run_lease = run_lease
        self._read: set[str] = set()
        self._last_key: dict[str, str] = {}  # by run, the greatest segment key listed
        self._leases: dict[str, tuple[str, float]] = {}  # by run, its lease's ETag and when it was seen to change
        self._full_due = 0.0
        self.pending = 0
        """Segments listed and not read yet (`summaryd status`)."""
        self.listings = 0
        """Listing calls made (each one request per 1,000 keys answered)."""
        self.listed = 0
        """Keys the listings answered."""

    async def follow(self) -> None:
        """Poll until cancelled; a failing bucket is logged (throttled) and asked again at the next interval."""
        first = True
        while True:
            try:
                await self.poll(hold=first)
                first = False
            except BucketError as exc:
                _failures.warning("board-bucket", "board: reading the bucket's new segments failed: %s", exc)
            await asyncio.sleep(self._interval)

    async def _list(self, prefix: str, after: str = "") -> list[ObjectInfo]:
        found = await self._bucket.list(prefix, after)
        self.listings += 1
        self.listed += len(found)
        return found

    async def _moved_leases(self) -> list[str]:
        """The runs under the prefix whose leases were written within the last `run_lease` seconds."""
        now = time.monotonic()
        for info in await self._list(LEASE_PREFIX + self._prefix):
            run = info.key[len(LEASE_PREFIX) : -len(LEASE_SUFFIX)] if info.key.endswith(LEASE_SUFFIX) else ""
            if run and self._leases.get(run, ("", 0.0))[0] != info.etag:
                self._leases[run] = (info.etag, now)
        return [run for run, (_, changed) in self._leases.items() if now - changed <= self._run_lease]

    async def _new_keys(self, full: bool) -> list[ObjectInfo]:
        """The segment keys the store may have that were not listed yet."""
        if full:
            await self._moved_leases()  # what the leases look like now: a later change is a run written to
            return await self._list(self._prefix)
        found: list[ObjectInfo] = []
        for run in await self._moved_leases():
            found += await self._list(run + "/", self._last_key.get(run, ""))
        return found

    async def poll(self, hold: bool = False) -> int:
        """Read every segment not read yet, run after run; with `hold`, hold the runs found first (the first
        listing: what the bucket had before this daemon wrote anything). Returns the segments read."""
        started = time.monotonic()
        full = hold or started >= self._full_due
        if full:
            self._full_due = started + FULL_LISTING_SECS
        new: dict[str, list[str]] = {}
        for info in await self._new_keys(full):
            if info.key in self._read:
                continue
            found = parse_segment(info.key)
            if found is None or found[0].startswith(".summaryd"):
                self._read.add(info.key)
                continue
            run, file_name, _ = found
            self._last_key[run] = max(self._last_key.get(run, ""), info.key)
            if self._index.owns(run, file_name):
                self._read.add(info.key)
                continue
            new.setdefault(run, []).append(info.key)
        for keys in new.values():
            keys.sort()  # a run's own listing and a nested run's may interleave: in key order, its bytes' order
        self.pending = sum(len(keys) for keys in new.values())
        if hold:
            for run in new:
                self._index.hold(run)
        read = 0
        unread = list(new) if hold else []
        try:
            for run, keys in new.items():
                read += await self._read_run(run, keys)
                if hold:  # its live batches go in now, not after every other run's
                    self._index.release(run)
                    unread.remove(run)
        finally:
            for run in unread:  # reading failed: released with what was read, live batches must not wait
                self._index.release(run)
        if read:
            log.info(
                "board: read %d segments of %d runs in the bucket in %.1fs", read, len(new), time.monotonic() - started
            )
        return read

    async def _read_run(self, run: str, keys: list[str]) -> int:
        read = 0
        for key in keys:  # in key order: the order of the run's bytes
            got = await self._bucket.get(key)
            self._read.add(key)
            self.pending -= 1
            if got is None:
                continue
            records = list(whole_records(got[0]))
            for at in range(0, len(records), _CHUNK):
                await asyncio.to_thread(self._index.followed, run, records[at : at + _CHUNK])
            read += 1
        return read
